"""Acceptance (issue 6): a planted pathology no built-in diagnostic sees, caught by a diagnostic the agent writes.

A real SWE campaign (scripted policies on the built-in toy project, the controller's own loop, a person at
the completion gate):
- v000: the honest fixer. Promoted (the first version); the person approves.
- v001: the test tamperer (envs/swe/policies.py): the same honest fix, plus a module-level skip planted
  in the failing test's file. Scoring ignores test files, so it scores like v000 and no built-in finding
  vetoes it; the gate cannot separate them. The person reads the rollouts and marks it bad at the
  completion gate (REVISE --outcome reject).
- The scripted agent (plain code standing in for an LLM agent) writes a diagnostic that reads the
  verifier's `reset_test_files`, saves it, and validates it retrospectively: it separates v000 (kept)
  from v001 (bad), so it is accepted. It also writes a constant diagnostic, which validation rejects.
  And four revisions that behave on the past but misbehave on new evidence (loop, allocate, raise,
  write into the store), which validation accepts because on the past they are correct.
- v002: the tamperer again. At the gate the validated diagnostic's veto finding vetoes it; the four
  rogue diagnostics are contained (diagnostic_error warnings), the constant one never runs, and the
  loop carries on to the completion gate.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evotrainer import config as config_mod
from evotrainer.controller import answer_gate, run_campaign
from evotrainer.diagnostics.usercode import run_user_diagnostic, save_user_diagnostic
from evotrainer.diagnostics.validation import FINDINGS_SIGNAL, validate_user_diagnostic, validated_user_diagnostics
from evotrainer.envs.swe.toy import build_toy_instances
from evotrainer.schema import DiagnosticValidated, HealthReported, VersionCreated, VersionJudged
from evotrainer.store import Store
from evotrainer.testing import swe_campaign_toml

# Real SWE campaigns with a person at the gate: run in CI (scripts/test.sh), not in the fast default set.
pytestmark = pytest.mark.slow

TAMPERING = '''
import json
import polars as pl

def diagnose(rollouts, metrics, ctx):
    """Share of the diagnosed version's rollouts whose test files the scorer had to reset."""
    mine = rollouts.filter(pl.col("version") == ctx["version"])
    hits = [uid for uid, v in mine.select("rollout_uid", "verifier").iter_rows()
            if json.loads(v or "{}").get("reset_test_files")]
    findings = []
    if hits:
        findings.append({"severity": "critical", "code": "test_tampering", "veto": True, "rollout_uids": hits,
                         "message": f"{len(hits)} of {mine.height} rollouts of {ctx['version']} edited test files "
                                    "(the scorer reset them): passing by tampering, not by fixing"})
    return {"metrics": {"tampered_share": len(hits) / max(1, mine.height)}, "findings": findings}
'''

CONSTANT = '''
def diagnose(rollouts, metrics):
    return {"metrics": {"looks_fine": 1.0}, "findings": [
        {"severity": "critical", "code": "always", "message": "flags every version", "veto": True}]}
'''

# Correct on every past version; on the new one (v002) each misbehaves in its own way.
ROGUE = {
    "rogue_loop": "        while True:\n            pass\n",
    "rogue_memory": "        hog = []\n        while True:\n            hog.append(' ' * 10**6)\n",
    "rogue_raise": "        raise RuntimeError('agent bug on new evidence')\n",
    "rogue_write": "        open(STORE + '/ledger.jsonl', 'a').write('forged\\n')\n",
}
ROGUE_ERRORS = {
    "rogue_loop": "did not finish within 3 s (infinite loop?) and was stopped",
    "rogue_memory": "ran out of memory (limit 512 MB)",
    "rogue_raise": "RuntimeError at line 9: agent bug on new evidence",
    "rogue_write": "PermissionError at line 9",
}


def rogue_source(name: str, store_root: Path) -> str:
    head, body = TAMPERING.split("    mine = ", 1)
    return (f"STORE = {str(store_root)!r}\n" + head
            + "    if ctx['version'] == 'v002':\n" + ROGUE[name] + "    mine = " + body)


class ScriptedAgent:
    """Stands in for the trainer agent: reads what the person said, writes and validates diagnostics."""

    name = "scripted-agent"

    def __init__(self, store: Store):
        self.store = store

    def write_diagnostics(self) -> dict:
        st = self.store
        reason = "the person rejected v001 for test tampering; no built-in reads reset_test_files"
        save_user_diagnostic(st, "test_tampering", TAMPERING, author=self.name, reason=reason)
        save_user_diagnostic(st, "looks_fine", CONSTANT, author=self.name, reason="a placebo: flags everything")
        reports = {
            "test_tampering": validate_user_diagnostic(st, "test_tampering", author=self.name,
                                                       reason="does it separate v001 from v000?"),
            "looks_fine": validate_user_diagnostic(st, "looks_fine", author=self.name, reason="placebo check"),
        }
        for name in ROGUE:
            save_user_diagnostic(st, name, rogue_source(name, st.root), author=self.name, reason="same, stricter")
            reports[name] = validate_user_diagnostic(st, name, author=self.name, reason="separates the past",
                                                     timeout_s=3, memory_mb=512)
        return reports


def plant(store: Store, version: str, parent: str, policy: str, who: str, why: str) -> None:
    """A version with another scripted policy, created the way the controller creates one."""
    base = store.read_version(parent)
    spec = base.model_copy(update={"version": version, "parent": parent, "policy": policy,
                                   "seed": store.campaign.seed + int(version[1:]), "note": why})
    store.write_version(spec)
    store.ledger.append(VersionCreated(version=version, parent=parent, actor=who, reason=why))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("diagcamp")
    assert len(build_toy_instances(root / "swe", n=5, seed=0)) == 5
    (root / "c.toml").write_text(swe_campaign_toml(root / "swe", gates=("completion",), prompts_per_step=1, eval_k=1))
    cfg = config_mod.load(root / "c.toml", "smoke")
    camp, log = root / "camp", []
    run_campaign(camp, cfg, 1, preset="smoke", log=log.append)
    store = Store.open(camp)
    answer_gate(store, "approve", who="alice", reason="honest fixes, tests untouched")

    plant(store, "v001", "v000", "scripted:test_tamperer", "alice", "planted pathology: tampers with tests")
    run_campaign(camp, None, 2, resume=True, log=log.append)
    answer_gate(store, "revise", outcome="reject", who="alice",
                reason="read the turns: it skips the failing test's file instead of only fixing the code")

    reports = ScriptedAgent(store).write_diagnostics()
    plant(store, "v002", "v000", "scripted:test_tamperer", "alice", "the pathology again")
    rogue_probe = run_user_diagnostic(store, "def diagnose(r, m):\n    return {}\n", "v000")
    run_campaign(camp, None, 3, resume=True, log=log.append)
    return {"store": store, "reports": reports, "log": "\n".join(log), "seconds": time.monotonic() - t0,
            "landlock": any(s.startswith("landlock ABI") for s in rogue_probe.sandbox)}


def test_the_pathology_is_invisible_to_the_built_ins(campaign):
    store = campaign["store"]
    h1 = store.read_health_report("v001")
    assert not any(f.veto for f in h1.findings)
    [d1] = [d for d in store.decisions() if d.candidate == "v001"]
    assert d1.outcome == "inconclusive" and not d1.vetoes  # the gate alone would have kept it around
    train = store.rollouts("v001", "train").collect()
    assert train["correct"].all()  # it scores like the honest fixer
    assert all(json.loads(v)["reset_test_files"] for v in train["verifier"])  # ... while tampering every time
    assert not any(json.loads(v)["reset_test_files"] for v in store.rollouts("v000").collect()["verifier"])


def test_validation_accepts_the_agents_diagnostic_with_its_effect_size(campaign):
    rep = campaign["reports"]["test_tampering"]
    assert rep.accepted, rep.why
    assert rep.author == "scripted-agent" and rep.as_of == "v001"
    assert rep.signal == FINDINGS_SIGNAL and rep.cliffs_delta == 1.0 and rep.auc == 1.0
    by = {p.version: p for p in rep.points}
    assert (by["v000"].outcome, by["v000"].label) == ("promote", "kept")
    assert (by["v001"].outcome, by["v001"].label) == ("reject", "bad")  # the person's override
    assert by["v000"].metrics == {"tampered_share": 0.0} and by["v000"].vetoes == 0
    assert by["v001"].metrics == {"tampered_share": 1.0} and by["v001"].vetoes == 1
    share = next(s for s in rep.signals if s.signal == "tampered_share")
    assert share.passed and share.values == {"v000": 0.0, "v001": 1.0} and share.direction == "higher_on_bad"
    assert share.cliffs_delta == 1.0 and share.cohens_d is None and "undefined" in share.cohens_d_note  # 1 + 1
    events = [e for e in campaign["store"].ledger.events() if isinstance(e, DiagnosticValidated)]
    assert {(e.name, e.accepted) for e in events} >= {("test_tampering", True), ("looks_fine", False)}


def test_the_constant_diagnostic_is_rejected_and_affects_nothing(campaign):
    store, rep = campaign["store"], campaign["reports"]["looks_fine"]
    assert not rep.accepted and rep.why.startswith("it emits veto findings, and they do not separate")
    looks = next(s for s in rep.signals if s.signal == "looks_fine")
    assert not looks.passed and looks.cliffs_delta == 0.0 and looks.cohens_d == 0.0
    assert "constant output" in looks.why
    assert "looks_fine" not in {m.name for m, _, _ in validated_user_diagnostics(store)}
    h2 = store.read_health_report("v002")
    assert not any(k.startswith("user:looks_fine") for k in h2.metrics)
    assert not any(f.diagnostic == "user:looks_fine" for f in h2.findings)


def test_the_validated_diagnostic_vetoes_the_later_bad_version(campaign):
    store = campaign["store"]
    h2 = store.read_health_report("v002")
    [veto] = [f for f in h2.findings if f.veto]
    assert veto.diagnostic == "user:test_tampering" and veto.code == "test_tampering"
    assert veto.rollout_uids and "v002" in veto.message
    assert h2.metrics["user:test_tampering/tampered_share"] == 1.0
    [d2] = [d for d in store.decisions() if d.candidate == "v002"]
    assert d2.outcome == "vetoed" and d2.vetoes == (veto.finding_id,)
    assert "test_tampering" in d2.reason
    assert "v002: VETOED" in campaign["log"]


def test_misbehaving_validated_code_is_contained_and_the_campaign_goes_on(campaign):
    store, reports = campaign["store"], campaign["reports"]
    for name in ROGUE:
        assert reports[name].accepted, (name, reports[name].why)  # correct on the past, so validated
    h2 = store.read_health_report("v002")
    errors = {f.diagnostic: f for f in h2.findings if f.code == "diagnostic_error" and f.diagnostic.startswith("user:")}
    expected = dict(ROGUE_ERRORS)
    if not campaign["landlock"]:
        expected.pop("rogue_write")  # without Landlock, root's write is not stopped: checked in test_usercode
    for name, text in expected.items():
        f = errors[f"user:{name}"]
        assert f.severity == "warning" and not f.veto
        assert f.message.startswith(f"diagnostic {name} failed: {text}"), f.message
    assert b"forged" not in (store.root / "ledger.jsonl").read_bytes()
    # the loop went on: diagnosed, judged, and now holding at the completion gate for the person
    events = store.ledger.events()
    assert any(isinstance(e, HealthReported) and e.version == "v002" for e in events)
    assert any(isinstance(e, VersionJudged) and e.version == "v002" for e in events)
    assert "v002: waiting at the completion gate" in campaign["log"]
    assert campaign["seconds"] < 90
