"""Retrospective validation of user diagnostics: the rule's arithmetic, labels from the ledger, storage and
the ledger event, revocation, and what only a VALIDATED revision may do in the health report."""
from __future__ import annotations

import math

import pytest

from evotrainer import evidence
from evotrainer.controller import next_version_spec
from evotrainer.diagnostics.report import health_report_for
from evotrainer.diagnostics.usercode import check_source, run_user_diagnostic, save_user_diagnostic
from evotrainer.diagnostics.validation import (
    FINDINGS_SIGNAL,
    ValidationError,
    separation,
    validate_user_diagnostic,
    validated_user_diagnostics,
    version_labels,
)
from evotrainer.schema import (
    Decision,
    DiagnosticValidated,
    EvalCompleted,
    GateAnswered,
    GateOpened,
    TrainingFinished,
    ValidationReport,
    VersionCreated,
    VersionJudged,
)
from evotrainer.testing import synthetic_rollouts

# --------------------------------------------------------------------------- the rule's arithmetic


def test_one_kept_one_bad_separates_on_ranks_alone():
    s = separation("m", {"v0": 0.0, "v1": 1.0}, {"v0": "kept", "v1": "bad"})
    assert s.passed and not s.overlap and s.direction == "higher_on_bad"
    assert s.auc == 1.0 and s.cliffs_delta == 1.0
    assert s.cohens_d is None and "undefined" in s.cohens_d_note
    low = separation("m", {"v0": 5.0, "v1": 1.0}, {"v0": "kept", "v1": "bad"})
    assert low.passed and low.auc == 0.0 and low.cliffs_delta == -1.0 and low.direction == "lower_on_bad"


def test_cohens_d_pooled_sd_and_the_minimum_effect():
    labels = {"a": "kept", "b": "kept", "c": "bad", "d": "bad"}
    s = separation("m", {"a": 1.0, "b": 2.0, "c": 4.0, "d": 5.0}, labels)
    # pooled sd = sqrt((0.5 + 0.5) / 2) = 0.7071; d = (4.5 - 1.5) / 0.7071
    assert s.cohens_d == pytest.approx(3.0 / math.sqrt(0.5)) and s.passed
    constant_groups = separation("m", {"a": 0.0, "b": 0.0, "c": 1.0}, {"a": "kept", "b": "kept", "c": "bad"})
    assert constant_groups.passed and constant_groups.cohens_d is None
    assert constant_groups.cohens_d_note.startswith("infinite")
    # no overlap, but the effect is small against the kept versions' spread: d = (10.1 - 5) / 7.07 = 0.72
    small = separation("m", {"a": 0.0, "b": 10.0, "c": 10.1}, {"a": "kept", "b": "kept", "c": "bad"})
    assert not small.overlap and small.cohens_d == pytest.approx(5.1 / math.sqrt(50))
    assert not small.passed and "|Cohen's d| 0.72 < 0.8" in small.why
    assert separation("m", {"a": 0.0, "b": 10.0, "c": 10.1}, {"a": "kept", "b": "kept", "c": "bad"},
                      min_effect=0.5).passed


def test_overlap_constant_and_too_few_are_rejected_with_reasons():
    over = separation("m", {"a": 1.0, "b": 3.0, "c": 2.0}, {"a": "kept", "b": "kept", "c": "bad"})
    assert over.overlap and not over.passed and over.auc == 0.5 and "overlap" in over.why
    const = separation("m", {"a": 1.0, "b": 1.0, "c": 1.0, "u": 9.0}, {"a": "kept", "b": "bad", "c": "bad",
                                                                     "u": "unused"})
    assert not const.passed and const.cohens_d == 0.0 and const.cliffs_delta == 0.0 and const.auc == 0.5
    assert const.why.startswith("constant output (1 on every kept and bad version): effect 0")
    few = separation("m", {"a": 1.0, "b": None}, {"a": "kept", "b": "bad"})
    assert not few.passed and "has 1 kept, 0 bad" in few.why
    kept_only = separation(FINDINGS_SIGNAL, {"a": 1.0, "b": 0.0}, {"a": "kept", "b": "bad"})
    assert not kept_only.passed and "fire on kept versions" in kept_only.why


# --------------------------------------------------------------------------- a judged campaign (synthetic)

CHARS = '''
import polars as pl

def diagnose(rollouts, metrics, ctx):
    mine = rollouts.filter(pl.col("version") == ctx["version"])
    n = float(mine["completion"].str.len_chars().mean())
    findings = []
    if n > 300:
        findings.append({"severity": "critical", "code": "long_completions", "veto": True,
                         "message": f"{ctx['version']}: completions average {n:.0f} characters",
                         "rollout_uids": mine["rollout_uid"].to_list()})
    return {"metrics": {"mean_chars": n}, "findings": findings}
'''

CONSTANT = "def diagnose(rollouts, metrics):\n    return {'metrics': {'score': 1.0}}\n"
VETO_ALL = ("def diagnose(rollouts, metrics):\n    return {'findings': [{'severity': 'critical', 'code': 'always', "
            "'message': 'vetoes everything', 'veto': True}]}\n")


def _version(store, v, parent, outcome, text_len, *, override=None):
    spec = next_version_spec(store, int(v[1:]))
    spec = spec.model_copy(update={"parent": parent})
    store.write_version(spec)
    store.ledger.append(VersionCreated(version=v, parent=parent))
    for step in (1, 2):
        store.append_rollouts(v, "train", step, synthetic_rollouts(store.campaign.name, v, "train", step, 2, 4,
                                                                   text_len=text_len))
    val = synthetic_rollouts(store.campaign.name, v, "val", 2, 4, 2, text_len=text_len)
    store.append_rollouts(v, "val", 2, val)
    a = evidence.avg_at_k(val).row(0, named=True)
    store.ledger.append(EvalCompleted(version=v, step=2, k=a["k"], n_items=a["n_items"], avg_at_k=a["avg_at_k"]))
    store.ledger.append(TrainingFinished(version=v, steps=2, seconds=1.0, checkpoint="final"))
    if outcome is None:
        return
    store.write_health_report(health_report_for(store, v, user=False))
    d = Decision(decision_id=f"d-{v}", candidate=v, baseline=parent, outcome=outcome, stats=None, rule="test")
    store.write_decision(d)
    store.ledger.append(VersionJudged(version=v, decision_id=d.decision_id, outcome=outcome, baseline=parent))
    if override:
        store.ledger.append(GateOpened(version=v, gate="completion"))
        store.ledger.append(GateAnswered(version=v, gate="completion", answer="revise", outcome=override,
                                         actor="alice", reason="read the rollouts"))


@pytest.fixture
def judged(store):
    """v000 promoted (short completions), v001 rejected by a person (long: the planted pathology),
    v002 promoted (short), v003 inconclusive (long), v004 not judged yet."""
    _version(store, "v000", None, "promote", 200)
    _version(store, "v001", "v000", "inconclusive", 400, override="reject")
    _version(store, "v002", "v000", "promote", 200)
    _version(store, "v003", "v002", "inconclusive", 400)
    _version(store, "v004", "v002", None, 400)
    return store


def test_labels_follow_the_ledger_with_a_persons_override(judged):
    labels = {lab.version: (lab.outcome, lab.label) for lab in version_labels(judged)}
    assert labels == {"v000": ("promote", "kept"), "v001": ("reject", "bad"), "v002": ("promote", "kept"),
                      "v003": ("inconclusive", "unused")}  # v004 is not judged: not replayed


def test_a_separating_diagnostic_is_accepted_stored_and_recorded(judged):
    meta = save_user_diagnostic(judged, "long_completions", CHARS, author="scripted-agent", reason="long = bad?")
    assert not meta.validated
    rep = validate_user_diagnostic(judged, "long_completions", author="scripted-agent", reason="v001 was long")
    assert rep.accepted, rep.why
    assert rep.sha256 == meta.sha256 and rep.author == "scripted-agent" and rep.as_of == "v004"
    # a vetoing diagnostic is decided by its findings: vetoes on the bad version, none on kept ones
    assert rep.signal == FINDINGS_SIGNAL and rep.cliffs_delta == 1.0 and rep.auc == 1.0
    assert rep.cohens_d is None  # no spread within either group: infinite d
    by = {p.version: p for p in rep.points}
    assert [p.version for p in rep.points] == ["v000", "v001", "v002", "v003"]
    assert by["v001"].label == "bad" and by["v001"].vetoes == 1 and by["v001"].metrics["mean_chars"] > 300
    assert by["v000"].vetoes == 0 and by["v000"].metrics["mean_chars"] < 300
    assert by["v003"].label == "unused" and by["v003"].vetoes == 1  # replayed and reported, not used
    assert by["v003"].evidence == ("v000", "v002", "v003")  # the version plus its ancestors, as at the gate
    chars = next(s for s in rep.signals if s.signal == "mean_chars")
    assert chars.passed and chars.direction == "higher_on_bad" and chars.n_kept == 2 and chars.n_bad == 1
    assert set(chars.values) == {"v000", "v001", "v002", "v003"}
    # stored append-only, with a ledger event; the revision now counts
    assert judged.validations("long_completions") == [rep]
    [ev] = [e for e in judged.ledger.events() if isinstance(e, DiagnosticValidated)]
    assert ev.accepted and ev.validation_id == rep.validation_id and ev.actor == "scripted-agent"
    assert ev.version == "v004" and "ACCEPTED" in ev.reason
    [(m, _src)] = judged.user_diagnostics("long_completions")
    assert m.validated
    [(vm, _, vrep)] = validated_user_diagnostics(judged)
    assert vm.sha256 == meta.sha256 and vrep == rep
    path = judged.root / "validations" / f"long_completions-{meta.sha256[:12]}-{rep.validation_id}.json"
    assert ValidationReport.model_validate_json(path.read_text()) == rep


def test_a_constant_diagnostic_is_rejected_and_never_runs_at_the_gate(judged):
    save_user_diagnostic(judged, "constant", CONSTANT, author="scripted-agent", reason="always one")
    rep = validate_user_diagnostic(judged, "constant", author="scripted-agent", reason="try it")
    assert not rep.accepted and rep.signal == "score"
    assert rep.cliffs_delta == 0.0 and rep.cohens_d == 0.0 and rep.auc == 0.5
    assert "constant output" in rep.why and "effect 0" in rep.why
    assert [p.metrics["score"] for p in rep.points] == [1.0, 1.0, 1.0, 1.0]
    assert not judged.user_diagnostics("constant")[0][0].validated and validated_user_diagnostics(judged) == []
    report = health_report_for(judged, "v004")
    assert not any(k.startswith("user:") for k in report.metrics)
    assert not any(f.diagnostic.startswith("user:") for f in report.findings)


def test_vetoes_must_separate_even_when_a_metric_does(judged):
    src = VETO_ALL.replace("return {", "return {'metrics': {'n': float(rollouts['completion'].str.len_chars()"
                                      ".filter(rollouts['version'] == rollouts['version'].max()).mean())}, ")
    save_user_diagnostic(judged, "veto_all", src, author="a", reason="vetoes everything")
    rep = validate_user_diagnostic(judged, "veto_all", author="a", reason="check")
    assert next(s for s in rep.signals if s.signal == "n").passed  # the metric separates ...
    assert not rep.accepted and rep.signal == FINDINGS_SIGNAL  # ... but its vetoes fire on kept versions too
    assert rep.why.startswith("it emits veto findings, and they do not separate")
    report = health_report_for(judged, "v004")
    assert not any(f.veto for f in report.findings)  # unvalidated: no effect on any decision


def test_unvalidated_and_validated_revisions_at_the_gate(judged):
    save_user_diagnostic(judged, "long_completions", CHARS, author="agent", reason="first try")
    before = health_report_for(judged, "v004")
    assert "user:long_completions/mean_chars" not in before.metrics  # saved is not enough
    validate_user_diagnostic(judged, "long_completions", author="agent", reason="separates")
    after = health_report_for(judged, "v004")
    assert after.metrics["user:long_completions/mean_chars"] > 300
    [veto] = [f for f in after.findings if f.veto]
    assert veto.diagnostic == "user:long_completions" and veto.code == "long_completions"
    assert veto.versions == ("v000", "v002", "v004") and len(veto.rollout_uids) > 0
    assert not any(f.veto for f in health_report_for(judged, "v002").findings)  # a kept-like version: no veto


def test_revisions_need_their_own_validation_and_a_failed_revalidation_revokes(judged):
    a = save_user_diagnostic(judged, "long_completions", CHARS, author="agent", reason="first")
    validate_user_diagnostic(judged, "long_completions", author="agent", reason="it separates")
    b = save_user_diagnostic(judged, "long_completions", CHARS.replace("n > 300", "n > 100"), author="agent",
                             reason="lower threshold", parent_sha256=a.sha256)
    revs = {m.sha256: m for m, _ in judged.user_diagnostics("long_completions")}
    assert revs[a.sha256].validated and not revs[b.sha256].validated
    [(m, _, _)] = validated_user_diagnostics(judged)
    assert m.sha256 == a.sha256  # the newest VALIDATED revision runs, not the newest one
    rb = validate_user_diagnostic(judged, "long_completions", b.sha256, author="agent", reason="check b")
    assert not rb.accepted and "do not separate" in rb.why  # vetoes kept versions (every one has > 100 chars)
    assert validated_user_diagnostics(judged)[0][0].sha256 == a.sha256
    # a person now keeps the long v003: re-validating revision a on the new evidence revokes it
    judged.ledger.append(GateOpened(version="v003", gate="completion"))
    judged.ledger.append(GateAnswered(version="v003", gate="completion", answer="revise", outcome="promote",
                                      actor="bob", reason="long is fine here"))
    again = validate_user_diagnostic(judged, "long_completions", a.sha256, author="bob", reason="re-check")
    assert not again.accepted and len(judged.validations("long_completions", a.sha256)) == 2
    assert validated_user_diagnostics(judged) == []
    assert not any(k.startswith("user:") for k in health_report_for(judged, "v004").metrics)


def test_a_version_vetoed_only_by_the_diagnostic_itself_is_not_its_evidence(judged):
    save_user_diagnostic(judged, "long_completions", CHARS, author="agent", reason="first")
    validate_user_diagnostic(judged, "long_completions", author="agent", reason="it separates")
    report = health_report_for(judged, "v004")
    judged.write_health_report(report)
    vetoes = tuple(f.finding_id for f in report.findings if f.veto)
    d = Decision(decision_id="d-v004", candidate="v004", baseline="v002", outcome="vetoed", stats=None, rule="t",
                 vetoes=vetoes)
    judged.write_decision(d)
    judged.ledger.append(VersionJudged(version="v004", decision_id="d-v004", outcome="vetoed", baseline="v002"))
    labels = {lab.version: lab for lab in version_labels(judged, "long_completions")}
    assert labels["v004"].label == "unused" and "itself" in labels["v004"].note
    assert {lab.version: lab.label for lab in version_labels(judged, "another_one")}["v004"] == "bad"


def test_needs_a_kept_and_a_bad_version_and_a_known_metric(store):
    _version(store, "v000", None, "promote", 200)
    save_user_diagnostic(store, "long_completions", CHARS, author="agent", reason="first")
    rep = validate_user_diagnostic(store, "long_completions", author="agent", reason="too early")
    assert not rep.accepted and "has 1 kept and 0 bad" in rep.why
    _version(store, "v001", "v000", "reject", 400)
    named = validate_user_diagnostic(store, "long_completions", metric="nope", author="agent", reason="typo")
    assert not named.accepted and "metric 'nope' was never returned" in named.why
    ok = validate_user_diagnostic(store, "long_completions", metric="mean_chars", author="agent", reason="named")
    assert ok.accepted and ok.signal == FINDINGS_SIGNAL  # it vetoes: its findings must (and do) separate
    assert {s.signal for s in ok.signals} == {"mean_chars", FINDINGS_SIGNAL}
    with pytest.raises(ValidationError, match="no saved diagnostic 'missing'"):
        validate_user_diagnostic(store, "missing", author="a", reason="none")
    with pytest.raises(ValidationError, match="reason"):
        validate_user_diagnostic(store, "long_completions", author="a", reason="")


@pytest.mark.parametrize("body, expect", [
    ("    while True:\n        pass\n", "did not finish within 2 s"),
    ("    a = []\n    while True:\n        a.append(' ' * 10**6)\n", "ran out of memory (limit 256 MB)"),
    ("    raise RuntimeError('agent bug')\n", "RuntimeError at line 3: agent bug"),
    ("    open(STORE + '/ledger.jsonl', 'a').write('forged')\n", "PermissionError at line 3"),
])
def test_misbehaving_code_is_contained_in_validation(store, body, expect):
    _version(store, "v000", None, "promote", 200)
    _version(store, "v001", "v000", "reject", 400)
    src = f"STORE = {str(store.root)!r}\ndef diagnose(rollouts, metrics):\n" + body
    save_user_diagnostic(store, "rogue", src, author="agent", reason="misbehaves")
    ledger = (store.root / "ledger.jsonl").read_bytes()
    if "PermissionError" in expect:
        probe = run_user_diagnostic(store, "def diagnose(r, m):\n    return {}\n")
        if not any(s.startswith("landlock ABI") for s in probe.sandbox):
            pytest.skip("no Landlock on this kernel: file permissions do not stop root")
    rep = validate_user_diagnostic(store, "rogue", author="agent", reason="contained?", timeout_s=2, memory_mb=256)
    assert not rep.accepted and rep.why.startswith("the diagnostic failed on 2 of 2 kept/bad version(s)")
    assert all(expect in p.error for p in rep.points), [p.error for p in rep.points]
    assert b"forged" not in (store.root / "ledger.jsonl").read_bytes()
    assert (store.root / "ledger.jsonl").read_bytes().startswith(ledger)  # only the validation event was added


def test_ctx_is_optional_and_names_the_diagnosed_version(judged):
    assert check_source("def diagnose(r, m, ctx):\n    return {}\n") is None
    assert "requires more arguments" in check_source("def diagnose(r, m, ctx, extra):\n    return {}\n")
    src = ("def diagnose(r, m, ctx):\n    return {'metrics': {'n': float(len(ctx['versions']))}, 'findings': "
           "[{'severity': 'info', 'code': 'ctx', 'message': ctx['version'] + ' after ' + str(ctx['parent'])}]}\n")
    res = run_user_diagnostic(judged, src, ["v000", "v002", "v003"])
    assert res.ok and res.metrics == {"n": 3.0} and res.findings[0].message == "v003 after v002"
    assert any(s.startswith(("pid namespace", "no pid namespace")) for s in res.sandbox)


RULE = '''
import polars as pl

def diagnose(rollouts, metrics, ctx):
    """A rule: compares the diagnosed version with its parent (both are in the evidence)."""
    if ctx["parent"] is None:
        return {"metrics": {"chars_rise": None}}
    chars = {v: float(rollouts.filter(pl.col("version") == v)["completion"].str.len_chars().mean())
             for v in (ctx["parent"], ctx["version"])}
    rise = chars[ctx["version"]] - chars[ctx["parent"]]
    findings = []
    if rise > 100:
        findings.append({"severity": "critical", "code": "chars_jump", "veto": True,
                         "message": f"completions grew by {rise:.0f} characters over {ctx['parent']}"})
    return {"metrics": {"chars_rise": rise}, "findings": findings}
'''


def test_a_rule_across_versions_is_validated_the_same_way(judged):
    save_user_diagnostic(judged, "chars_jump", RULE, author="alice", reason="a jump over the parent is bad")
    rep = validate_user_diagnostic(judged, "chars_jump", author="alice", reason="rule check")
    assert rep.accepted, rep.why
    by = {p.version: p for p in rep.points}
    assert by["v000"].metrics == {"chars_rise": None}  # no parent: no value, not counted
    assert by["v001"].metrics["chars_rise"] == pytest.approx(200) and by["v002"].metrics["chars_rise"] == 0.0
    rise = next(s for s in rep.signals if s.signal == "chars_rise")
    assert rise.n_kept == 1 and rise.n_bad == 1 and rise.passed
    [veto] = [f for f in health_report_for(judged, "v004").findings if f.veto]  # v004 (400) over v002 (200)
    assert veto.code == "chars_jump" and "over v002" in veto.message
    assert not any(f.veto for f in health_report_for(judged, "v002").findings)  # v002 (200) over v000 (200)
