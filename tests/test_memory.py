"""Campaign memory (issue 6, part 4): notes and the search trace (append-only JSON lines), the ledger
summary and case memory derived from a real campaign, and the compact text an agent reads."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from evotrainer import memory
from evotrainer.store import Store
from evotrainer.testing import swe_campaign_toml, temp_store

ROOT = Path(__file__).resolve().parent.parent



def test_notes_and_search_trace_are_append_only_timed_and_survive_a_torn_line(tmp_path):
    store = temp_store(tmp_path / "camp")
    assert memory.notes(store) == [] and memory.search_trace(store) == []
    memory.add_note(store, "dead groups everywhere; the filter alone will not help", author="alice")
    path = memory.memory_dir(store) / memory.NOTES
    with open(path, "ab") as fh:
        fh.write(b'{"author": "killed-mid-wri')  # a writer killed mid-line
    memory.add_note(store, "  try partial credit next  ", author="claude")
    notes = memory.notes(store)
    assert [(n["author"], n["text"]) for n in notes] == [
        ("alice", "dead groups everywhere; the filter alone will not help"), ("claude", "try partial credit next")]
    assert all(n["time"] for n in notes) and notes[0]["time"] <= notes[1]["time"]
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"author": "killed-mid-wri' and len([x for x in lines if x]) == 3  # nothing rewritten
    with pytest.raises(memory.MemoryRecordError, match="text"):
        memory.add_note(store, "   ", author="alice")
    with pytest.raises(memory.MemoryRecordError, match="author"):
        memory.add_note(store, "something", author="")
    memory.record_search(store, "read_rollouts", {"versions": ["v000"], "filter": "correct"}, "v000", "claude")
    memory.record_search(store, "skills.retrieve", {"domain": "math"}, "/data/skills", "playbook",
                         found=[{"skill_id": "sk-000000000000"}])
    trace = memory.search_trace(store)
    assert [(t["tool"], t["where"], t["author"]) for t in trace] == [
        ("read_rollouts", "v000", "claude"), ("skills.retrieve", "/data/skills", "playbook")]
    assert trace[0]["query"] == {"versions": ["v000"], "filter": "correct"} and trace[0]["found"] is None
    assert trace[1]["found"] == [{"skill_id": "sk-000000000000"}]
    text = memory.compact(store)
    assert "try partial credit next" in text and "read_rollouts" in text and "sk-000000000000" in text


@pytest.fixture(scope="module")
def leaker(tmp_path_factory):
    from evotrainer.envs.swe.toy import build_toy_instances

    work = tmp_path_factory.mktemp("mem")
    build_toy_instances(work / "swe", n=5, seed=0)
    cfg = work / "c.toml"
    cfg.write_text(swe_campaign_toml(work / "swe", "scripted:leaker", versions=2))
    env = dict(os.environ, EVOTRAINER_DATA=str(work / "data"), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", str(cfg), "--preset", "smoke", "--campaign",
                          str(work / "camp")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return Store.open(work / "camp")


def test_ledger_summary_and_cases_of_a_real_campaign(leaker):
    store = leaker
    summary = memory.ledger_summary(store)
    assert [(v["version"], v["parent"], v["outcome"]) for v in summary] == [("v000", None, "vetoed"),
                                                                           ("v001", "v000", "promote")]
    assert summary[0]["intervention_id"] is None and summary[1]["change"] == "env: clear_git_log = True"
    assert summary[0]["avg_at_k"] == 1.0 and summary[1]["avg_at_k"] == 0.0 and summary[1]["decided_by"] == "gate"
    [case] = memory.cases(store)
    assert case["version"] == "v001" and case["parent"] == "v000" and case["author"] == "playbook"
    leak = next(f for f in case["parent_findings"] if f["code"] == "git_history_leak")
    assert leak["severity"] == "critical" and leak["veto"] and leak["finding_id"] in case["evidence"]
    assert case["parent_findings"][0]["severity"] == "critical"  # critical findings first
    assert case["change"] == "env: clear_git_log = True" and case["hypothesis"].startswith("If ")
    assert case["backtest_verdict"] in ("supports", "inconclusive", "contradicts") and case["backtest_id"]
    assert case["outcome"] == "promote" and case["gate_outcome"] == "promote"
    assert (case["parent_avg_at_k"], case["avg_at_k"]) == (1.0, 0.0)
    assert len(case["alternatives"]) == 2 and all(a["backtest_verdict"] for a in case["alternatives"])
    # the playbook's skill look-up at v001 is in the search trace
    [look] = [t for t in memory.search_trace(store) if t["tool"] == "skills.retrieve"]
    assert look["query"]["version"] == "v001" and "git_history_leak" in look["query"]["findings"]
    frame = memory.memory_frame(store)
    assert isinstance(frame, pl.DataFrame) and frame.height == 1
    assert frame.row(0, named=True)["outcome"] == "promote" and "git_history_leak(c)" in frame["evidence_codes"][0]


def test_compact_fits_the_budget_and_keeps_the_newest(leaker, tmp_path):
    import shutil

    camp = tmp_path / "camp"
    shutil.copytree(leaker.root, camp)
    store = Store.open(camp)
    full = memory.compact(store)
    assert len(full) <= 6000
    for needle in ("campaign", "v000", "v001", "vetoed", "clear_git_log", "git_history_leak", "skills.retrieve"):
        assert needle in full, needle
    for i in range(200):
        memory.add_note(store, f"note number {i:03d}: " + "x" * 60, author="alice")
    text = memory.compact(store, max_chars=2000)
    assert len(text) <= 2000
    assert "note number 199" in text and "note number 000" not in text and "older left out" in text
    assert "v001" in text  # the lineage survives a flood of notes
    tiny = memory.compact(store, max_chars=200)
    assert len(tiny) <= 200
