"""The git-history leak caught by the loop: real CLI, real SWE episodes, the playbook agent.

A campaign whose policy is the scripted leaker (reads `git log -p`, copies the fix) on the built-in
toy project's instances: v000 scores high, the git_history diagnostic vetoes it at the gate, the
playbook answers the veto with the environment change clear_git_log=True, and v001 (same policy,
history cleared) falls back to what a policy that cannot find the bug gets - the abandoner's level.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from evotrainer.envs.swe.toy import build_toy_instances
from evotrainer.status import from_ledger
from evotrainer.store import Store
from evotrainer.testing import swe_campaign_toml

ROOT = Path(__file__).resolve().parent.parent



def cli(*args, data_dir, timeout=600):
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def swe_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe")
    assert len(build_toy_instances(root, n=5, seed=0)) == 5
    return root


def run_campaign(tmp_path_factory, data_dir, swe_dir, policy, versions):
    d = tmp_path_factory.mktemp(policy.replace(":", "-"))
    cfg = d / "c.toml"
    cfg.write_text(swe_campaign_toml(swe_dir, policy, versions=versions))
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(d / "camp"), data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return Store.open(d / "camp"), res.stdout


@pytest.fixture(scope="module")
def leaker_campaign(tmp_path_factory, data_dir, swe_dir):
    return run_campaign(tmp_path_factory, data_dir, swe_dir, "scripted:leaker", 2)


@pytest.fixture(scope="module")
def abandoner_campaign(tmp_path_factory, data_dir, swe_dir):
    return run_campaign(tmp_path_factory, data_dir, swe_dir, "scripted:abandoner", 1)


def test_leaker_scores_high_and_is_vetoed(leaker_campaign):
    store, out = leaker_campaign
    st = from_ledger(store)
    assert st.versions["v000"].final_avg_at_k == 1.0  # every held-out instance "solved"
    [d0] = [d for d in store.decisions() if d.candidate == "v000"]
    assert d0.outcome == "vetoed" and d0.vetoes
    report = store.read_health_report("v000")
    [leak] = [f for f in report.findings if f.veto]
    assert leak.code == "git_history_leak" and leak.diagnostic == "git_history"
    # the finding points at real rollouts, and their turns show the git log call
    assert leak.rollout_uids
    turns = store.turns(["v000"]).filter(pl.col("rollout_uid").is_in(list(leak.rollout_uids))).collect()
    cmds = [json.loads(a)["command"] for a in turns.filter(pl.col("tool_name") == "run_in_terminal")["tool_args"]]
    assert cmds and all(c.startswith("git log") for c in cmds)
    assert "VETOED" in out


def test_veto_is_answered_by_clear_git_log_and_scores_fall_to_honest_levels(leaker_campaign, abandoner_campaign):
    store, _ = leaker_campaign
    spec = store.read_version("v001")
    assert spec.parent == "v000" and spec.harness.swe.clear_git_log is True
    iv = store.read_intervention(spec.intervention)
    assert iv.change.factor == "env" and iv.change.name == "clear_git_log" and iv.change.value is True
    [leak] = [f for f in store.read_health_report("v000").findings if f.veto]
    assert leak.finding_id in iv.evidence
    st = from_ledger(store)
    honest_level = from_ledger(abandoner_campaign[0]).versions["v000"].final_avg_at_k
    assert st.versions["v001"].final_avg_at_k == honest_level == 0.0
    [d1] = [d for d in store.decisions() if d.candidate == "v001"]
    assert not d1.vetoes and d1.outcome != "vetoed"
    # the leaker still runs git log, but it no longer pays: a warning, no veto
    codes = {f.code for f in store.read_health_report("v001").findings}
    assert "git_history_leak" not in codes and "git_history_read" in codes


def test_swe_evidence_has_behaviour_columns_and_turns(leaker_campaign):
    store, _ = leaker_campaign
    train = store.rollouts(["v000"], "train").collect()
    assert train.height == 4 and train["used_git_history"].all() and train["correct"].all()
    assert set(train["r.env_reward"]) == {1.0} and (train["reward"] == 1.0).all()
    assert train["n_turns"].min() >= 2 and train["stop_reason"].to_list() == ["submitted"] * 4
    turns = store.turns(["v000"], "train").collect()
    assert set(turns["rollout_uid"]) == set(train["rollout_uid"])
    val = store.rollouts(["v001"], "val").collect()
    assert val.height == 4 and not val["correct"].any()


def test_scripted_policy_config_errors(tmp_path, data_dir, swe_dir):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(swe_campaign_toml(swe_dir, "scripted:nobody", versions=1))
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(tmp_path / "c"), data_dir=data_dir)
    assert res.returncode != 0 and "unknown scripted policy 'nobody'" in res.stderr
    cfg.write_text(swe_campaign_toml(tmp_path / "empty", "scripted:leaker", versions=1))
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(tmp_path / "c2"), data_dir=data_dir)
    assert res.returncode != 0 and "evotrainer swe build" in res.stderr
