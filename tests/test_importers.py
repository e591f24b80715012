"""Importers: external JSONL rollouts and TRL log_completions parquet become readable campaigns."""
import json
import math
import os

import polars as pl
import pytest

from evotrainer import evidence, schema, status
from evotrainer.importers import ImportDataError, detect_and_import, import_jsonl, import_trl_completions
from evotrainer.store import Store
from evotrainer.testing import synthetic_rollouts

VERSIONS = ("v000", "v001")
TRAIN_STEPS = (1, 2, 3)
N_GROUPS, G = 3, 4


def _rows(campaign="ext"):
    rows = []
    for v in VERSIONS:
        for s in TRAIN_STEPS:
            rows += synthetic_rollouts(campaign, v, "train", s, N_GROUPS, G, seed=hash(v) % 100).to_dicts()
        rows += synthetic_rollouts(campaign, v, "val", 3, 4, 2).to_dicts()
    return rows


def _write_jsonl(path, rows):
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def _snapshot(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def test_jsonl_full_contract_round_trips(tmp_path):
    rows = _rows()
    src = _write_jsonl(tmp_path / "run.jsonl", rows)
    store = import_jsonl(src, tmp_path / "camp")
    assert store.campaign.name == "ext"  # the file's single campaign value
    assert store.campaign.policy == "external:run.jsonl" and store.campaign.preset == "import:jsonl"
    assert store.campaign.train.group_size == G and store.campaign.train.prompts_per_step == N_GROUPS
    assert store.campaign.train.max_steps == 3 and store.campaign.train.eval_k == 2
    assert store.versions() == list(VERSIONS)
    v1 = store.read_version("v001")
    assert v1.parent == "v000" and v1.note == "imported from run.jsonl" and store.read_version("v000").parent is None
    for v in VERSIONS:
        assert store.steps(v, "train") == list(TRAIN_STEPS)
        assert store.steps(v, "val") == [3]
    # the stored partition equals the source rows (same uids, groups, values)
    want = pl.DataFrame([r for r in rows if r["version"] == "v001" and r["split"] == "train" and r["step"] == 2])
    got = pl.read_parquet(store.version_dir("v001") / "rollouts" / "split=train" / "step=000002.parquet")
    assert got.columns[: len(evidence.ROLLOUT_COLUMNS)] == list(evidence.ROLLOUT_COLUMNS)
    assert got.select(want.columns).equals(want.cast(got.select(want.columns).schema))
    # ledger replay == tables, and status reads it as trained
    led, tab = status.from_ledger(store), status.from_tables(store)
    assert led.comparable() == tab.comparable()
    assert all(v.state is status.VersionState.TRAINED for v in led.versions.values())
    assert led.versions["v001"].parent == "v000"
    kinds = [e.kind for e in store.ledger.events()]
    assert kinds.count("step_completed") == 6 and kinds.count("eval_completed") == 2
    assert kinds.count("training_finished") == 2 and kinds[0] == "campaign_created"
    assert "v000" in status.format_status(led, store)


def test_jsonl_derives_optional_columns(tmp_path):
    rows = []
    for r in _rows():
        r = {k: v for k, v in r.items() if k not in ("rollout_uid", "campaign", "group_id", "sample_idx",
                                                     "verifier", "n_prompt_tokens", "truncated", "filtered",
                                                     "mean_logprob", "n_turns", "n_tool_calls")}
        r["source_run"] = "abc"  # an extra field is kept
        rows.append(r)
    src = _write_jsonl(tmp_path / "lean.jsonl", rows)
    store = import_jsonl(src, tmp_path / "camp", name="lean")
    df = store.rollouts("v000", "train", steps=(1, 1)).collect()
    assert df.height == N_GROUPS * G
    # groups from item_id (synthetic items are one per group), numbered by first appearance
    assert df["group_id"].unique().sort().to_list() == [evidence.group_id("v000", "train", 1, g) for g in range(N_GROUPS)]
    assert df.group_by("group_id").agg(pl.col("item_id").n_unique())["item_id"].max() == 1
    assert df["sample_idx"].to_list() == list(range(G)) * N_GROUPS
    assert df["rollout_uid"][0] == evidence.rollout_uid("lean", "v000", "train", 1, 0, 0)
    assert set(df["campaign"]) == {"lean"}
    assert json.loads(df["verifier"][0]) == {"correct": df["correct"][0]}
    assert df["filtered"].to_list() == [False] * df.height and set(df["n_turns"]) == {1}
    assert df["n_prompt_tokens"].null_count() == df.height and df["mean_logprob"].null_count() == df.height
    assert set(df["source_run"]) == {"abc"} and "r.correctness" in df.columns
    assert status.from_ledger(store).comparable() == status.from_tables(store).comparable()


def test_jsonl_group_labels_and_contract_ids(tmp_path):
    base = synthetic_rollouts("x", "v000", "train", 1, 2, 4).to_dicts()
    labelled = [{**{k: v for k, v in r.items() if k not in ("group_id", "rollout_uid")},
                 "group_id": "prompt-b" if r["group_id"].endswith("0000") else "prompt-a"}
                for r in base]
    store = import_jsonl(_write_jsonl(tmp_path / "l.jsonl", labelled), tmp_path / "c1")
    df = store.rollouts().collect()
    # labels are numbered by first appearance: "prompt-b" (the synthetic group 0) is group 0
    g0 = df.filter(pl.col("group_id") == "v000/train/000001/0000")
    assert g0["item_id"].to_list() == [r["item_id"] for r in base if r["group_id"].endswith("0000")]
    assert df["group_id"].n_unique() == 2
    # contract ids are kept as given; an explicit `group` column wins too
    with_group = [{**{k: v for k, v in r.items() if k not in ("group_id", "rollout_uid")},
                   "group": 7 + int(r["group_id"][-1])} for r in base]
    store2 = import_jsonl(_write_jsonl(tmp_path / "g.jsonl", with_group), tmp_path / "c2")
    assert set(store2.rollouts().collect()["group_id"]) == {"v000/train/000001/0007", "v000/train/000001/0008"}


def test_reimport_is_idempotent_and_conflicts_write_nothing(tmp_path):
    rows = _rows()
    src = _write_jsonl(tmp_path / "run.jsonl", rows)
    store = import_jsonl(src, tmp_path / "camp")
    before = _snapshot(store.root)
    again = import_jsonl(src, tmp_path / "camp")
    assert _snapshot(again.root) == before  # no new partition, no new event
    # same partition, different rows: clear error, nothing written
    changed = [dict(r) for r in rows]
    changed[0]["reward"] = 99.0
    src2 = _write_jsonl(tmp_path / "changed.jsonl", changed)
    with pytest.raises(ImportDataError, match=r"v000/train/step 1 is already stored with different rows"):
        import_jsonl(src2, tmp_path / "camp")
    assert _snapshot(store.root) == before
    # a new version from another file extends the campaign (parent = the previous version)
    extra = synthetic_rollouts("ext", "v002", "train", 1, 2, 4).to_dicts() + \
        synthetic_rollouts("ext", "v002", "val", 1, 2, 2).to_dicts()
    st = import_jsonl(_write_jsonl(tmp_path / "more.jsonl", extra), tmp_path / "camp")
    assert st.versions() == ["v000", "v001", "v002"] and st.read_version("v002").parent == "v001"
    assert status.from_ledger(st).comparable() == status.from_tables(st).comparable()
    with pytest.raises(ImportDataError, match="holds campaign 'ext', not 'other'"):
        import_jsonl(src, tmp_path / "camp", name="other")


def test_interrupted_import_completes_missing_events(tmp_path):
    src = _write_jsonl(tmp_path / "run.jsonl", _rows())
    store = import_jsonl(src, tmp_path / "camp")
    # simulate a crash after the partitions but before the last events: cut the ledger
    lines = store.ledger.path.read_text().splitlines(keepends=True)
    store.ledger.path.write_text("".join(lines[:-3]))
    store = import_jsonl(src, tmp_path / "camp")
    assert status.from_ledger(store).comparable() == status.from_tables(store).comparable()
    assert status.from_ledger(store).versions["v001"].state is status.VersionState.TRAINED


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("reward"), "run.jsonl:5: missing required field 'reward'"),
    (lambda r: r.update(step="three"), "run.jsonl:5: field 'step' must be an integer >= 0 (got 'three')"),
    (lambda r: r.update(split="test"), "run.jsonl:5: field 'split' must be one of ['train', 'val']"),
    (lambda r: r.update(version="version-1"), "run.jsonl:5: field 'version' must look like 'v000'"),
    (lambda r: r.update(correct="yes"), "run.jsonl:5: field 'correct' must be true/false"),
    (lambda r: r.update({"r.format": "high"}), "run.jsonl:5: field 'r.format' must be a number"),
    (lambda r: r.update(n_completion_tokens=-3), "run.jsonl:5: field 'n_completion_tokens' must be an integer >= 0"),
])
def test_bad_lines_name_file_line_and_field_and_store_nothing(tmp_path, mutate, message):
    rows = _rows()
    mutate(rows[4])
    src = _write_jsonl(tmp_path / "run.jsonl", rows)
    with pytest.raises(ImportDataError) as info:
        import_jsonl(src, tmp_path / "camp")
    msg = str(info.value)
    assert message in msg and "\n" not in msg and "nothing was imported" in msg
    assert not (tmp_path / "camp").exists()


def test_bad_json_and_duplicates_are_reported(tmp_path):
    rows = _rows()
    src = tmp_path / "run.jsonl"
    _write_jsonl(src, rows)
    text = src.read_text().splitlines()
    text[2] = text[2][:-5]  # torn JSON
    text[9] = json.dumps({**rows[9], "step": -1})
    src.write_text("\n".join(text) + "\n")
    with pytest.raises(ImportDataError) as info:
        import_jsonl(src, tmp_path / "camp")
    assert str(info.value).startswith("run.jsonl:3: not valid JSON")
    assert "(and 1 more problem(s))" in str(info.value)
    assert info.value.errors[1].startswith("run.jsonl:10: field 'step'")
    assert not (tmp_path / "camp").exists()
    dup = _rows()[:4]
    dup[3] = dict(dup[1])
    with pytest.raises(ImportDataError, match=r"dup.jsonl:4: repeats group 0 sample 1 of v000/train/step 1 \(first at line 2\)"):
        import_jsonl(_write_jsonl(tmp_path / "dup.jsonl", dup), tmp_path / "camp")
    partial = [{k: v for k, v in r.items() if not (i == 2 and k == "group_id")} for i, r in enumerate(_rows()[:4])]
    with pytest.raises(ImportDataError, match=r"partial.jsonl:3: missing field 'group_id'"):
        import_jsonl(_write_jsonl(tmp_path / "partial.jsonl", partial), tmp_path / "camp")
    assert not (tmp_path / "camp").exists()


def test_version_filter_and_existing_non_campaign_dir(tmp_path):
    src = _write_jsonl(tmp_path / "run.jsonl", _rows())
    store = import_jsonl(src, tmp_path / "camp", version="v001")
    assert store.versions() == ["v001"] and store.read_version("v001").parent is None
    with pytest.raises(ImportDataError, match="no rows of version v005"):
        import_jsonl(src, tmp_path / "camp2", version="v005")


# --------------------------------------------------------------------------- TRL


def _trl_table(step, n_prompts=2, g=3, conversational=True):
    """The exact table GRPOTrainer.log writes (TRL 1.16): step, prompt, completion, rewards..., extras..., advantage."""
    prompts, completions = [], []
    for p in range(n_prompts):
        for j in range(g):
            q = f"What is {p} + {step}?"
            a = f"<answer>{p + step if j == 0 else 0}</answer>"
            prompts.append([{"role": "user", "content": q}] if conversational else q)
            completions.append([{"role": "assistant", "content": a}] if conversational else a)
    n = n_prompts * g
    acc = [1.0 if j == 0 else 0.0 for _ in range(n_prompts) for j in range(g)]
    acc[-1] = math.nan  # a reward function that did not apply to this row
    return {
        "step": [step] * n,
        "prompt": prompts,
        "completion": completions,
        "accuracy_reward": acc,
        "format_reward": [0.5] * n,
        "difficulty": ["easy"] * n,  # a log_extra column
        "advantage": [0.8 if j == 0 else -0.4 for _ in range(n_prompts) for j in range(g)],
    }


def _write_trl(out_dir, steps, **kw):
    pd = pytest.importorskip("pandas")
    comp = out_dir / "completions"
    comp.mkdir(parents=True)
    for s in steps:
        # exactly as TRL: pd.DataFrame(table).to_parquet(output_dir/completions/completions_{step:05d}.parquet)
        pd.DataFrame(_trl_table(s, **kw)).to_parquet(comp / f"completions_{s:05d}.parquet")
    return out_dir


def test_trl_completions_import(tmp_path):
    run = _write_trl(tmp_path / "grpo-out", [1, 2, 3])
    store = import_trl_completions(run, tmp_path / "camp")
    assert store.campaign.name == "grpo-out" and store.campaign.preset == "import:trl"
    assert store.versions() == ["v000"] and store.steps("v000") == [1, 2, 3]
    df = store.rollouts("v000", "train", steps=(2, 2)).collect()
    assert df.height == 6
    assert df["group_id"].to_list() == [evidence.group_id("v000", "train", 2, g) for g in (0, 0, 0, 1, 1, 1)]
    assert df["sample_idx"].to_list() == [0, 1, 2, 0, 1, 2]
    assert df["item_id"][0].startswith("p-") and df["item_id"].n_unique() == 2
    assert json.loads(df["prompt"][0]) == [{"role": "user", "content": "What is 0 + 2?"}]
    assert df["completion"][0] == "<answer>2</answer>"
    assert df["r.accuracy_reward"].to_list()[:5] == [1.0, 0.0, 0.0, 1.0, 0.0] and df["r.accuracy_reward"][5] is None
    assert df["reward"].to_list() == [1.5, 0.5, 0.5, 1.5, 0.5, 0.5]  # nan counted as 0, weights 1
    assert df["correct"].to_list()[:5] == [True, False, False, True, False] and df["correct"][5] is None
    assert df["advantage"].to_list() == [0.8, -0.4, -0.4, 0.8, -0.4, -0.4]
    assert json.loads(df["verifier"][0]) == {"accuracy_reward": 1.0, "format_reward": 0.5, "correct": True}
    assert set(df["trl.difficulty"]) == {"easy"}
    assert df["n_completion_tokens"].null_count() == 6 and df["mean_logprob"].null_count() == 6
    assert status.from_ledger(store).comparable() == status.from_tables(store).comparable()
    assert store.campaign.train.group_size == 3 and store.campaign.train.prompts_per_step == 2
    # idempotent
    before = _snapshot(store.root)
    import_trl_completions(run, tmp_path / "camp")
    assert _snapshot(store.root) == before


def test_trl_plain_text_repeated_batches_and_options(tmp_path):
    pd = pytest.importorskip("pandas")
    run = _write_trl(tmp_path / "out", [1, 2], conversational=False)
    # TRL keeps its deques between logs: with logging_steps < steps_per_generation a file repeats the batch
    again = pd.DataFrame(_trl_table(2, conversational=False))
    again["step"] = 3
    again.to_parquet(run / "completions" / "completions_00003.parquet")
    store = import_trl_completions(run / "completions", tmp_path / "camp", version="v004", group_size=3,
                                   reward_weights={"format_reward": 0.0}, correct_column="format_reward")
    assert store.campaign.name == "out"  # the run directory, also when given its completions/ folder
    assert store.steps("v004") == [1, 2]  # step 3 repeated step 2's batch
    df = store.rollouts().collect()
    assert df["prompt"][0] == "What is 0 + 1?" and df["reward"].to_list()[:3] == [1.0, 0.0, 0.0]
    assert set(df["correct"].to_list()) == {False}  # format_reward 0.5 is not > 0.5
    with pytest.raises(ImportDataError, match="not a multiple of group_size 2"):
        import_trl_completions(run, tmp_path / "camp2", group_size=2)
    assert not (tmp_path / "camp2").exists()


def test_detect_and_import(tmp_path):
    src = _write_jsonl(tmp_path / "run.jsonl", _rows()[:8])
    assert detect_and_import(src, tmp_path / "a").campaign.preset == "import:jsonl"
    run = _write_trl(tmp_path / "trl", [1])
    assert detect_and_import(run, tmp_path / "b").campaign.preset == "import:trl"
    one = run / "completions" / "completions_00001.parquet"
    assert detect_and_import(one, tmp_path / "c").steps("v000") == [1]
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(ImportDataError, match="cannot tell the format of notes.txt; known formats"):
        detect_and_import(tmp_path / "notes.txt", tmp_path / "d")
    pl.DataFrame({"a": [1]}).write_parquet(tmp_path / "other.parquet")
    with pytest.raises(ImportDataError, match="parquet without TRL's step/prompt/completion columns"):
        detect_and_import(tmp_path / "other.parquet", tmp_path / "d")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImportDataError, match="directory without TRL completions files"):
        detect_and_import(tmp_path / "empty", tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_imported_events_are_valid_ledger_events(tmp_path):
    store = import_jsonl(_write_jsonl(tmp_path / "run.jsonl", _rows()), tmp_path / "camp")
    evs = Store.open(store.root).ledger.events()
    fin = [e for e in evs if isinstance(e, schema.TrainingFinished)]
    assert {e.version for e in fin} == set(VERSIONS) and all(e.steps == 3 and e.actor == "importer" for e in fin)
    ev = next(e for e in evs if isinstance(e, schema.EvalCompleted) and e.version == "v000")
    tab = evidence.avg_at_k(store.rollouts("v000", "val").collect())
    assert ev.avg_at_k == tab["avg_at_k"][0] and ev.k == 2 and ev.n_items == 4
