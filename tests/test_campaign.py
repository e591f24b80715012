"""End to end: smoke campaigns through the real CLI, the real TRL trainer and a tiny real model."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from evotrainer import status as status_mod
from evotrainer.config import PRESETS
from evotrainer.harness.advantages import group_advantages
from evotrainer.store import Store

ROOT = Path(__file__).resolve().parent.parent
SMOKE = PRESETS["smoke"]
T = SMOKE.train
ROWS_PER_STEP = T.prompts_per_step * T.group_size


def cli(*args, data_dir, timeout=300, env_extra=None):
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_contract(store: Store, versions: list[str]):
    for v in versions:
        train = store.rollouts(v, "train").collect()
        assert train.height == T.max_steps * ROWS_PER_STEP
        per_step = train.group_by("step").len().sort("step")
        assert per_step["step"].to_list() == list(range(1, T.max_steps + 1))
        assert set(per_step["len"].to_list()) == {ROWS_PER_STEP}
        assert train["rollout_uid"].n_unique() == train.height
        # each group: one item, group_size samples 0..G-1
        groups = train.group_by("group_id").agg(pl.col("item_id").n_unique(), pl.col("sample_idx").sort())
        assert (groups["item_id"] == 1).all()
        assert all(s.to_list() == list(range(T.group_size)) for s in groups["sample_idx"])
        # the recorded advantages are what the harness computes from the recorded rewards
        expected = group_advantages(train["reward"].to_numpy(), train["group_id"].to_list(), "group")
        np.testing.assert_allclose(train["advantage"].to_numpy(), expected, atol=1e-4)
        # the weighted components add up to the reward
        weights = {c.name: c.weight for c in SMOKE.harness.rewards}
        total = sum(train[f"r.{n}"].fill_null(0) * w for n, w in weights.items())
        np.testing.assert_allclose(train["reward"].to_numpy(), total.to_numpy(), atol=1e-6)
        assert train["mean_logprob"].is_finite().all() and (train["mean_logprob"] < 0).all()
        assert ((train["n_completion_tokens"] > 0) & (train["n_completion_tokens"] <= T.max_completion_length)).all()
        assert (train["truncated"] == (train["stop_reason"] == "length")).all()
        for verdict, correct in zip(train["verifier"], train["correct"]):
            assert json.loads(verdict)["correct"] == correct
        val = store.rollouts(v, "val").collect()
        assert val.height == SMOKE.data.n_val * T.eval_k
        assert val["step"].unique().to_list() == [T.max_steps]
        metrics = store.metrics(v).collect()
        assert sorted(metrics["step"].unique().to_list()) == list(range(1, T.max_steps + 1))
        assert {"loss", "reward", "frac_reward_zero_std"} <= set(metrics["name"].to_list())


def test_smoke_campaign_fills_the_store_and_ledger_replay_matches_status(tmp_path, data_dir):
    camp = tmp_path / "camp"
    started = time.monotonic()
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", data_dir=data_dir)
    elapsed = time.monotonic() - started
    assert res.returncode == 0, res.stderr + res.stdout
    assert "v000 step 1/3" in res.stdout and "Avg@" in res.stdout and str(camp) in res.stdout
    store = Store.open(camp)
    assert store.versions() == ["v000", "v001"]
    assert_contract(store, ["v000", "v001"])
    replayed = status_mod.from_ledger(store)
    assert replayed.comparable() == status_mod.from_tables(store).comparable()
    assert all(v.state is status_mod.VersionState.TRAINED for v in replayed.versions.values())
    st = cli("status", str(camp), data_dir=data_dir)
    assert st.returncode == 0
    assert st.stdout.strip() == status_mod.format_status(replayed, store).strip()
    # versions are full runs of the base policy with their own seed (not warm-started)
    v1 = store.read_version("v001")
    assert v1.parent == "v000" and not v1.warm_start and not v1.confounded and v1.policy == "tiny"
    assert not store.checkpoints_dir("v000").exists()  # intermediate checkpoints dropped once final
    print(f"smoke campaign, 2 versions: {elapsed:.1f}s")
    # a second run on a finished campaign is a no-op report
    again = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", "--resume", data_dir=data_dir)
    assert again.returncode == 0 and "training" not in again.stdout.split("campaign")[0]
    assert store.rollouts().select(pl.len()).collect().item() == 2 * (T.max_steps * ROWS_PER_STEP + SMOKE.data.n_val * T.eval_k)


def _wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("target", ["controller", "trainer"])
def test_sigkill_mid_version_then_resume_has_exact_rows(tmp_path, data_dir, target):
    camp = tmp_path / "camp"
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT), EVOTRAINER_DEBUG_STEP_SLEEP="0.4")
    proc = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "run", "--preset", "smoke", "--campaign",
                             str(camp), "--versions", "2"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # kill while v001 is mid-version: its step 2 rows are on disk, step 3 not yet
    step2 = camp / "versions/v001/rollouts/split=train/step=000002.parquet"
    assert _wait_for(step2.exists, 120), proc.communicate()[0] if proc.poll() is not None else "timeout"
    ledger = (camp / "ledger.jsonl").read_text()
    trainer_pid = [json.loads(line)["pid"] for line in ledger.splitlines() if '"training_started"' in line][-1]
    os.kill(proc.pid if target == "controller" else trainer_pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # the trainer does not outlive its controller (PDEATHSIG), so nothing writes behind our back
    assert _wait_for(lambda: not Path(f"/proc/{trainer_pid}").exists()
                     or "zombie" in Path(f"/proc/{trainer_pid}/status").read_text(), 10)
    store = Store.open(camp)
    killed_at = status_mod.from_ledger(store).versions["v001"]
    assert killed_at.state is not status_mod.VersionState.TRAINED and 2 <= max(store.steps("v001")) <= T.max_steps
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", "--resume", data_dir=data_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_contract(store, ["v000", "v001"])
    replayed = status_mod.from_ledger(store)
    assert replayed.comparable() == status_mod.from_tables(store).comparable()
    v1 = replayed.versions["v001"]
    assert v1.state is status_mod.VersionState.TRAINED and v1.attempts == 2
    started = [json.loads(x) for x in (camp / "ledger.jsonl").read_text().splitlines() if '"training_started"' in x]
    assert started[-1]["resume_from_step"] >= 1  # resumed from a checkpoint, not from scratch


def test_resume_after_trainer_died_before_checkpoint_moves_steps_aside(tmp_path, data_dir):
    """A crash can leave a step's rows without its checkpoint; resume moves them aside, then redoes them."""
    camp = tmp_path / "camp"
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "1", data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    store = Store.open(camp)
    # Simulate the crash window: v001's step 1 rows written, then death before its checkpoint.
    from evotrainer.controller import next_version_spec
    from evotrainer.schema import VersionCreated
    from evotrainer.testing import synthetic_rollouts

    spec = next_version_spec(store, 1)
    store.write_version(spec)
    store.ledger.append(VersionCreated(version="v001", parent="v000"))
    store.append_rollouts("v001", "train", 1, synthetic_rollouts(store.campaign.name, "v001", "train", 1, 2, 4))
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", "--resume", data_dir=data_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_contract(store, ["v000", "v001"])
    moved = list((camp / "versions/v001/abandoned").rglob("*.parquet"))
    assert [p.name for p in moved] == ["step=000001.parquet"]
    assert "moved steps [1]" in res.stdout


# --------------------------------------------------------------------------- bad input


def test_bad_inputs_give_one_line_errors_and_change_nothing(tmp_path, data_dir):
    camp = tmp_path / "camp"
    assert cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "1", data_dir=data_dir).returncode == 0
    before = tree_digest(camp)

    def check(res, *needles):
        assert res.returncode == 2, res.stdout + res.stderr
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith("evotrainer: error:"), err
        for n in needles:
            assert n in err, err
        assert tree_digest(camp) == before

    bad_cfg = tmp_path / "bad.toml"
    bad_cfg.write_text("[train]\nmax_steps = 0\n")
    check(cli("run", str(bad_cfg), "--campaign", str(tmp_path / "new1"), data_dir=data_dir),
          "train.max_steps", "bad.toml")
    assert not (tmp_path / "new1").exists()
    typo = tmp_path / "typo.toml"
    typo.write_text("[train]\nmax_stepz = 3\n")
    check(cli("run", str(typo), "--campaign", str(tmp_path / "new2"), data_dir=data_dir), "max_stepz")
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\n")
    check(cli("run", str(broken), "--campaign", str(tmp_path / "new3"), data_dir=data_dir), "not valid TOML")
    too_many = tmp_path / "too_many.toml"
    too_many.write_text("policy = 'tiny'\n[data]\ntiers = [0]\nn_train = 16\nn_val = 500\n")
    check(cli("run", str(too_many), "--campaign", str(tmp_path / "new4"), data_dir=data_dir), "val items")
    assert not (tmp_path / "new4").exists()
    check(cli("run", "--preset", "huge", "--campaign", str(tmp_path / "new5"), data_dir=data_dir),
          "unknown preset 'huge'", "smoke")
    missing = tmp_path / "missing_model.toml"
    missing.write_text(f"policy = '{tmp_path / 'no-such-model'}'\n")
    check(cli("run", str(missing), "--campaign", str(tmp_path / "new6"), data_dir=data_dir), "no-such-model")
    assert not (tmp_path / "new6").exists()
    check(cli("run", "--preset", "smoke", "--campaign", str(camp), data_dir=data_dir), "--resume")
    check(cli("run", "--preset", "smoke", "--campaign", str(tmp_path / "nothing"), "--resume", data_dir=data_dir),
          "no campaign")

    # a corrupted table file: reading names it; the doctor can quarantine it
    victim = camp / "versions/v000/rollouts/split=train/step=000002.parquet"
    victim.write_bytes(victim.read_bytes()[:100])
    before = tree_digest(camp)
    check(cli("status", str(camp), data_dir=data_dir), "step=000002.parquet", "quarantine")
    check(cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", "--resume", data_dir=data_dir),
          "step=000002.parquet")

    # a campaign written under another schema version
    cj = camp / "campaign.json"
    raw = json.loads(cj.read_text())
    raw["schema_version"] = 7
    cj.write_text(json.dumps(raw))
    before = tree_digest(camp)
    check(cli("status", str(camp), data_dir=data_dir), "schema_version 7", "upgrade")
    check(cli("run", "--campaign", str(camp), "--resume", data_dir=data_dir), "schema_version 7")


def test_import_evotrainer_pulls_no_heavy_modules():
    code = (
        "import sys, evotrainer, evotrainer.cli, evotrainer.controller, evotrainer.status, evotrainer.envs.math, "
        "evotrainer.harness.rewards, evotrainer.harness.advantages, evotrainer.testing\n"
        "heavy = ['torch', 'transformers', 'trl', 'peft', 'anthropic', 'IPython', 'ipywidgets', 'vllm', 'datasets']\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ""


def test_lora_warm_start_and_periodic_eval(tmp_path, data_dir):
    cfg = tmp_path / "lora.toml"
    cfg.write_text("warm_start = true\n[train]\neval_every = 2\nlora = { r = 4, alpha = 8 }\n")
    camp = tmp_path / "camp"
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(camp), "--versions", "2", data_dir=data_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    store = Store.open(camp)
    v0, v1 = store.read_version("v000"), store.read_version("v001")
    assert v0.train.lora is not None and not v0.warm_start
    # the child continues from its parent's final (LoRA-merged) weights, and says it is confounded
    assert v1.warm_start and v1.confounded and v1.policy == str(store.final_dir("v000"))
    assert (store.final_dir("v000") / "model.safetensors").exists()
    for v in ("v000", "v001"):
        val = store.rollouts(v, "val").collect()
        assert sorted(val["step"].unique().to_list()) == [2, 3]  # every 2 steps, and at the end
    replayed = status_mod.from_ledger(store)
    assert replayed.comparable() == status_mod.from_tables(store).comparable()
    assert sorted(replayed.versions["v000"].evals) == [2, 3]
    assert_contract_train_only(store, ["v000", "v001"])


def assert_contract_train_only(store, versions):
    for v in versions:
        train = store.rollouts(v, "train").collect()
        assert train.height == T.max_steps * ROWS_PER_STEP and train["rollout_uid"].n_unique() == train.height
