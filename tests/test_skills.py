"""The skill library (issue 6, part 3) and procedure evolution (part 5).

The acceptance test runs two real campaigns that share one EVOTRAINER_DATA (so one skills dir):
an SWE campaign where a person's tuned StdGroupFilter is promoted (a completion-gate override,
recorded with who and why) and becomes a skill, then a math campaign where the same trigger
(dead groups) fires, the in-domain attempts fail three times in a row, and the SWE skill is
retrieved and trained as a transfer; the skill's record, the intervention's rationale, the search
trace and the Markdown show it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer import interventions, memory
from evotrainer.agent.base import AgentContext, HistoryEntry
from evotrainer.agent.playbook import PlaybookAgent
from evotrainer.controller import next_version_spec
from evotrainer.schema import Finding, HealthReport, VersionSpec
from evotrainer.skills import (
    TRANSFER_AFTER_FAILURES,
    FindingCondition,
    MetricCondition,
    SkillError,
    SkillLibrary,
    SkillUse,
    Trigger,
    normalise_change,
    skill_id_for,
)
from evotrainer.store import Store
from evotrainer.testing import swe_campaign_toml, temp_store

ROOT = Path(__file__).resolve().parent.parent

TUNED_FILTER = {"factor": "filter", "group_filter": {"kind": "std_ema", "keep_ratio": 0.8, "warmup_groups": 2}}



def cli(*args, data_dir, timeout=600):
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout, check=False)
    assert res.returncode == 0, (args, res.stdout[-3000:], res.stderr[-3000:])
    return res


def _events(store, kind):
    return [e for e in store.ledger.events() if e.kind == kind]


# --------------------------------------------------------------------------- acceptance: two campaigns


@pytest.fixture(scope="module")
def two_campaigns(tmp_path_factory):
    from evotrainer.envs.swe.toy import build_toy_instances

    data = tmp_path_factory.mktemp("shared-data")  # one EVOTRAINER_DATA, so one skills dir
    work = tmp_path_factory.mktemp("campaigns")
    swe = work / "swe"
    build_toy_instances(swe, n=5, seed=0)

    # Campaign A (swe): a person designs a tuned StdGroupFilter and promotes it at the completion gate.
    cfg = work / "a.toml"
    cfg.write_text(swe_campaign_toml(swe))
    a_dir = work / "swe-campaign"
    run_a = ("run", "--preset", "smoke", "--campaign", str(a_dir), "--versions", "3")
    cli("run", str(cfg), *run_a[1:], "--gates", "diagnosis,completion", data_dir=data)
    cli("gate", str(a_dir), "approve", "--who", "alice", "--reason", "v000 is the honest baseline", data_dir=data)
    out = cli(*run_a, "--resume", data_dir=data).stdout
    assert "waiting at the diagnosis gate" in out
    store_a = Store.open(a_dir)
    dead = next(f for f in store_a.read_health_report("v000").findings if f.code == "dead_groups")
    mine = work / "tuned.json"
    mine.write_text(json.dumps({
        "parent": "v000", "change": TUNED_FILTER, "evidence": [dead.finding_id], "author": "alice",
        "hypothesis": {"if": "we filter groups with a tighter StdGroupFilter (keep 0.8, short warm-up)",
                       "then": "dead groups stop diluting the update",
                       "because": "every group of the honest fixer has zero reward spread"},
        "target_metric": "effective_data", "success_criterion": {"metric": "effective_data", "op": ">=", "threshold": 0},
        "rollback_plan": "set the group filter back to none"}))
    cli("gate", str(a_dir), "revise", "--intervention", str(mine), "--who", "alice",
        "--reason", "a tighter filter than the playbook's default", data_dir=data)
    out = cli(*run_a, "--resume", data_dir=data).stdout
    assert "waiting at the completion gate" in out
    out_gate = cli("gate", str(a_dir), "revise", "--outcome", "promote", "--who", "alice",
                   "--reason", "keeps only groups with signal; a scripted policy cannot move Avg@k", data_dir=data).stdout
    out_a = cli(*run_a, "--resume", data_dir=data).stdout
    assert "waiting at the diagnosis gate" in out_a
    out_a = out_gate + out_a  # the person's verdict creates the skill at once

    # Campaign B (math, tiny policy): one candidate per version, so every in-domain idea is tried in turn.
    cfg_b = work / "b.toml"
    cfg_b.write_text("candidates_per_version = 1\n")
    b_dir = work / "math-campaign"
    out_b = cli("run", str(cfg_b), "--preset", "smoke", "--campaign", str(b_dir), "--versions", "5",
                data_dir=data).stdout
    return data, Store.open(a_dir), Store.open(b_dir), out_a, out_b


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_a_skill_learned_in_swe_is_transferred_to_math_after_in_domain_attempts_fail(two_campaigns):
    data, store_a, store_b, out_a, _ = two_campaigns
    lib = SkillLibrary.open(data / "skills")
    sid = skill_id_for(TUNED_FILTER)
    skill = lib.get(sid)
    assert skill is not None and f"new skill {sid}" in out_a
    # learned in swe from the person's promotion, triggered by the finding the intervention cited
    first = skill.uses[0]
    assert (first.domain, first.version, first.outcome, first.decided_by) == ("swe", "v001", "promote", "alice")
    assert first.campaign_dir == str(store_a.root.resolve()) and not first.transfer
    assert skill.trigger.any_finding == (FindingCondition(code="dead_groups", min_severity="warning"),)
    assert skill.template == normalise_change(TUNED_FILTER) and skill.template["group_filter"]["keep_ratio"] == 0.8

    # Campaign B: the in-domain attempts came first and failed, then the transfer was tried
    specs = {v: store_b.read_version(v) for v in store_b.versions()}
    ivs = {v: store_b.read_intervention(s.intervention) for v, s in specs.items() if s.intervention}
    used = [v for v, iv in ivs.items() if skill_id_for(iv.change) == sid]
    assert len(used) == 1, {v: interventions.describe(iv) for v, iv in ivs.items()}
    v = used[0]
    outcomes = {e.version: e.outcome for e in _events(store_b, "version_judged")}
    earlier = [u for u in sorted(outcomes) if u < v]
    since_promote = []
    for u in reversed(earlier):
        if outcomes[u] == "promote":
            break
        since_promote.append(u)
    assert len(since_promote) >= TRANSFER_AFTER_FAILURES, outcomes
    iv = ivs[v]
    assert iv.author == "playbook" and sid in iv.rationale
    assert "TRANSFER from domain swe to math" in iv.rationale
    dead_b = {f.finding_id for f in store_b.read_health_report(iv.parent).findings if f.code == "dead_groups"}
    assert set(iv.evidence) == dead_b  # the trigger matched the math parent's own dead-groups finding
    assert specs[v].harness.group_filter.keep_ratio == 0.8

    # the search trace: no transfer while in-domain attempts remained, then the swe skill as a transfer
    trace = [t for t in memory.search_trace(store_b) if t["tool"] == "skills.retrieve"]
    by_version = {t["query"]["version"]: t for t in trace}
    for u in earlier[1:]:
        assert not by_version[u]["query"]["transfer_allowed"] and by_version[u]["found"] == []
    hit = by_version[v]
    assert hit["query"]["transfer_allowed"] and Path(hit["where"]).resolve() == lib.root.resolve()
    assert [(f["skill_id"], f["transfer"], f["domains"]) for f in hit["found"]] == [(sid, True, ["swe"])]

    # the skill's record: the use in campaign B appended, as a retrieved transfer, with its outcome
    skill = lib.get(sid)
    last = skill.uses[-1]
    assert (last.campaign, last.domain, last.version) == (store_b.campaign.name, "math", v)
    assert last.transfer and last.retrieved and last.intervention_id == iv.intervention_id
    assert last.outcome == outcomes[v] and last.decision_id is not None
    assert last.campaign_dir == str(store_b.root.resolve())
    expected = ("swe",) + (("math",) if outcomes[v] == "promote" else ())
    assert skill.domains == expected
    # ... and the Markdown shows both campaigns and domains
    md = lib.markdown_path(sid).read_text()
    assert md == skill.markdown()
    assert "| swe | v001 |" in md and f"| math | {v} |" in md
    assert store_a.campaign.name in md and store_b.campaign.name in md and "alice" in md
    # campaign memory shows it too
    assert "TRANSFER from domain swe" in memory.compact(store_b, max_chars=20_000)


# --------------------------------------------------------------------------- library units


def _finding(code: str, severity: str = "critical", version: str = "v000", rule: str | None = None) -> Finding:
    return Finding(finding_id=f"f-{code}-{version}", diagnostic=code, code=code, severity=severity,
                   message=f"{code} seen", versions=(version,), rule=rule)


def _use(domain: str, version: str, outcome: str = "promote", campaign: str = "c", **kw) -> SkillUse:
    return SkillUse(campaign=campaign, campaign_dir=f"/campaigns/{campaign}", domain=domain, version=version,
                    intervention_id=f"iv-{version}", outcome=outcome, **kw)


HYP = {"if": "we apply the recipe", "then": "the signal improves", "because": "it worked before"}
CRIT = {"metric": "dgr", "op": "<", "threshold": 0.0}


def _learn(lib, change, code, use):
    return lib.learn(change, trigger=Trigger(any_finding=(FindingCondition(code=code),)), hypothesis=HYP,
                     target_metric="dgr", success_criterion=CRIT, rollback_plan="undo it", use=use)


def test_a_skill_becomes_cross_domain_after_working_in_two_domains(tmp_path):
    lib = SkillLibrary.open(tmp_path / "skills")
    s = _learn(lib, TUNED_FILTER, "dead_groups", _use("swe", "v001", campaign="a"))
    assert s.status == "in_domain" and s.domains == ("swe",) and s.is_transfer("math")
    s = lib.record_use(s.skill_id, _use("math", "v004", "inconclusive", campaign="b"))
    assert s.status == "in_domain" and s.domains == ("swe",) and s.uses[-1].transfer
    again = lib.record_use(s.skill_id, _use("math", "v004", "inconclusive", campaign="b"))
    assert len(again.uses) == 2  # a repeat of the same record is a no-op (the controller syncs idempotently)
    s = _learn(lib, TUNED_FILTER, "R1_insufficient_signal", _use("math", "v005", campaign="b"))
    assert s.status == "cross_domain" and s.domains == ("swe", "math") and s.uses[-1].transfer
    assert [c.code for c in s.trigger.any_finding] == ["dead_groups", "R1_insufficient_signal"]  # triggers grow
    assert len(s.uses) == 3 and (s.successes(), s.failures()) == (2, 1)
    md = lib.markdown_path(s.skill_id).read_text()
    assert "cross_domain" in md and "| swe | v001 |" in md and "| math | v005 |" in md and "| math | v004 |" in md
    assert json.loads((lib.root / f"{s.skill_id}.json").read_text())["schema_version"] == 1
    # a person's override supersedes a record; both stay in the file
    o = _learn(lib, {"factor": "hparam", "name": "temperature", "value": 1.2}, "exploration_collapse",
               _use("math", "v001", "promote", campaign="c"))
    o = lib.record_use(o.skill_id, _use("math", "v001", "reject", campaign="c", decided_by="bob", reason="eval noise"))
    assert len(o.uses) == 2 and o.domains == () and o.status == "in_domain"
    assert "~~promote~~" in o.markdown() and "bob: eval noise" in o.markdown()
    with pytest.raises(SkillError, match="promoted"):
        _learn(lib, TUNED_FILTER, "dead_groups", _use("code", "v002", "reject"))


def test_retrieval_puts_in_domain_first_and_other_domains_only_as_a_fallback(tmp_path):
    lib = SkillLibrary.open(tmp_path / "skills")
    math_skill = _learn(lib, {"factor": "reward", "op": "add", "component": {"name": "correctness_tiers", "weight": 0.2}},
                        "dead_groups", _use("math", "v001"))
    swe_skill = _learn(lib, TUNED_FILTER, "dead_groups", _use("swe", "v001"))
    _learn(lib, {"factor": "env", "name": "clear_git_log", "value": True}, "git_history_leak", _use("swe", "v002"))
    both = _learn(lib, {"factor": "hparam", "name": "temperature", "value": 1.2}, "dead_groups", _use("swe", "v003"))
    both = _learn(lib, both.template, "dead_groups", _use("code", "v001", campaign="x"))
    findings = [_finding("dead_groups"), _finding("truncation", "warning")]
    ids = lambda skills: [s.skill_id for s in skills]
    assert ids(lib.retrieve(findings, "math")) == [math_skill.skill_id]
    assert ids(lib.retrieve(findings, "math", failures=TRANSFER_AFTER_FAILURES - 1)) == [math_skill.skill_id]
    # after the in-domain attempts failed: other domains' skills follow, the one proven in more domains first
    fallback = lib.retrieve(findings, "math", failures=TRANSFER_AFTER_FAILURES)
    assert ids(fallback) == [math_skill.skill_id, both.skill_id, swe_skill.skill_id]
    assert [s.is_transfer("math") for s in fallback] == [False, True, True]
    assert ids(lib.retrieve(findings, "math", exhausted=True)) == ids(fallback)
    # what was tried on this parent is left out (ids, change dicts or Interventions)
    assert ids(lib.retrieve(findings, "math", tried=[math_skill.template, both.skill_id], exhausted=True)) == [
        swe_skill.skill_id]
    # in swe the swe skills are in-domain; a finding below the condition's severity does not trigger
    assert set(ids(lib.retrieve(findings, "swe"))) == {both.skill_id, swe_skill.skill_id}
    assert lib.retrieve([_finding("dead_groups", "info")], "swe") == []
    assert lib.retrieve(HealthReport(version="v000", metrics={}, findings=tuple(findings)), "math")[0] == math_skill
    # metric conditions: all must hold
    trig = Trigger(any_finding=(FindingCondition(rule="R1"),),
                   all_metrics=(MetricCondition(metric="dead_groups/dgr", op=">", value=0.3),))
    r1 = _finding("R1_insufficient_signal", rule="R1")
    assert trig.match([r1], {"dead_groups/dgr": 0.5}) == (r1.finding_id,)
    assert trig.match([r1], {"dead_groups/dgr": 0.2}) is None and trig.match([r1], {}) is None


def test_a_corrupt_skill_file_is_a_clear_error_and_loses_nothing(tmp_path):
    lib = SkillLibrary.open(tmp_path / "skills")
    good = _learn(lib, TUNED_FILTER, "dead_groups", _use("swe", "v001"))
    bad = _learn(lib, {"factor": "hparam", "name": "temperature", "value": 1.2}, "dead_groups", _use("swe", "v002"))
    bad_path = lib.path(bad.skill_id)
    torn = bad_path.read_bytes()[:57]
    bad_path.write_bytes(torn)  # a torn write (or a careless hand edit)
    before = {p.name: p.read_bytes() for p in lib.root.iterdir() if p.is_file()}
    for call in (lib.all, lambda: lib.retrieve([_finding("dead_groups")], "swe"),
                 lambda: lib.record_use(bad.skill_id, _use("math", "v003", "reject")),
                 lambda: _learn(lib, bad.template, "dead_groups", _use("math", "v004"))):
        with pytest.raises(SkillError) as err:
            call()
        msg = str(err.value)
        assert str(bad_path) in msg and "nothing was changed" in msg and "restore" in msg and ".corrupt" in msg
    after = {p.name: p.read_bytes() for p in lib.root.iterdir() if p.is_file()}
    assert after == before and after[bad_path.name] == torn
    # the other skill is intact and still usable
    assert lib.get(good.skill_id) == good
    lib.record_use(good.skill_id, _use("math", "v005", "inconclusive"))
    assert len(lib.get(good.skill_id).uses) == 2
    # a valid JSON document that is not a valid skill, and a hand-edited template, are refused the same way
    doc = json.loads(before[f"{good.skill_id}.json"])
    bad_path.write_text(json.dumps({**doc, "uses": "oops"}))
    with pytest.raises(SkillError, match="field 'uses'"):
        lib.get(bad.skill_id)
    edited = lib.path(good.skill_id)
    edited.write_text(json.dumps({**json.loads(edited.read_text()),
                                  "template": normalise_change({"factor": "filter", "group_filter": {"kind": "zero_std"}})}))
    with pytest.raises(SkillError, match="content id"):
        lib.get(good.skill_id)


def test_updates_only_append(tmp_path):
    lib = SkillLibrary.open(tmp_path / "skills")
    s = _learn(lib, TUNED_FILTER, "dead_groups", _use("swe", "v001"))
    s = lib.record_use(s.skill_id, _use("swe", "v002", "reject"))
    with pytest.raises(SkillError, match="append-only"):
        lib._write(s, s.model_copy(update={"uses": s.uses[:1]}))
    with pytest.raises(SkillError, match="only grow"):
        lib._write(s, s.model_copy(update={"trigger": Trigger(any_finding=(FindingCondition(code="other"),))}))
    assert lib.get(s.skill_id) == s


# --------------------------------------------------------------------------- the playbook with skills


def _ctx(tmp_path, *, failures=0, history=(), findings=None, domain="math", lib=None, order="score_first"):
    store = temp_store(tmp_path / "camp")
    base = next_version_spec(store, 0)
    spec = VersionSpec.model_validate({**base.model_dump(), "version": "v000",
                                       "data": {**base.data.model_dump(), "domain": domain},
                                       "harness": {**base.harness.model_dump(), "analysis_order": order}})
    store.write_version(spec)
    report = HealthReport(version="v000", metrics={}, findings=tuple(findings or [_finding("dead_groups")]))
    return AgentContext(store=store, version="v005", parent="v000", parent_spec=spec, health=report,
                        consecutive_failures=failures, history=list(history), n_candidates=3,
                        skills=lib or SkillLibrary.open(tmp_path / "skills"))


def test_playbook_offers_other_domains_skills_only_after_in_domain_attempts_fail(tmp_path):
    lib = SkillLibrary.open(tmp_path / "skills")
    swe = _learn(lib, TUNED_FILTER, "dead_groups", _use("swe", "v001"))
    agent = PlaybookAgent()
    early = agent.propose(_ctx(tmp_path / "a", failures=2, lib=lib))
    assert all(swe.skill_id not in iv.rationale for iv in early)
    late = agent.propose(_ctx(tmp_path / "b", failures=TRANSFER_AFTER_FAILURES, lib=lib))
    assert skill_id_for(late[0].change) == swe.skill_id
    assert "TRANSFER from domain swe to math" in late[0].rationale and late[0].evidence == ("f-dead_groups-v000",)
    ctx = _ctx(tmp_path / "c", failures=0, lib=lib, domain="swe")
    own = agent.propose(ctx)
    assert skill_id_for(own[0].change) == swe.skill_id and "in-domain" in own[0].rationale
    [trace] = memory.search_trace(ctx.store)
    assert trace["tool"] == "skills.retrieve" and trace["author"] == "playbook"
    assert trace["found"][0]["skill_id"] == swe.skill_id and trace["found"][0]["transfer"] is False


def test_playbook_keeps_validity_first_even_with_skills(tmp_path):
    lib = SkillLibrary.open(tmp_path / "skills")
    _learn(lib, TUNED_FILTER, "dead_groups", _use("swe", "v001"))
    ctx = _ctx(tmp_path, failures=3, lib=lib, domain="swe",
               findings=[_finding("git_history_leak"), _finding("dead_groups")])
    first = PlaybookAgent().propose(ctx)[0]
    assert first.change.factor == "env" and first.change.name == "clear_git_log"


# --------------------------------------------------------------------------- procedure evolution (saturation)


def _iv(change, parent):
    return interventions.new(parent=parent, change=change, hypothesis=HYP, target_metric="avg_at_k",
                             success_criterion={"metric": "avg_at_k", "op": ">", "threshold": 0},
                             rollback_plan="undo it", author="test")


def _history(gains, start=0.30, procedure_at=None):
    hist = [HistoryEntry("v000", None, None, "promote", start)]
    avg = start
    for i, g in enumerate(gains, 1):
        avg += g
        change = ({"factor": "procedure", "analysis_order": "behaviour_first"} if i == procedure_at else
                  {"factor": "hparam", "name": "learning_rate", "value": 1e-5 * (i + 1)})
        hist.append(HistoryEntry(f"v{i:03d}", f"v{i - 1:03d}", _iv(change, f"v{i - 1:03d}"), "promote", avg))
    return hist


def test_saturation_switches_the_analysis_order(tmp_path):
    agent = PlaybookAgent()
    # three promoted recipe changes in a row, each < 1pp of Avg@k: saturation, though nothing failed
    hist = _history([0.004, 0.009, 0.002])
    ctx = _ctx(tmp_path / "a", history=hist)
    ctx.parent = "v003"
    assert ctx.consecutive_failures == 0
    assert [v for v, _ in ctx.saturation()] == ["v001", "v002", "v003"]
    first = agent.propose(ctx)[0]
    assert first.change.factor == "procedure" and first.change.analysis_order == "behaviour_first"
    assert "saturation" in first.hypothesis.because and "+0.9pp" in first.hypothesis.because
    assert "saturation" in first.rationale
    # one step of >= 1pp in the window: no saturation, no procedure change
    ctx = _ctx(tmp_path / "b", history=_history([0.004, 0.02, 0.002]))
    assert ctx.saturation() is None
    assert all(iv.change.factor != "procedure" for iv in agent.propose(ctx))
    # fewer than three recipe changes: no verdict
    assert _ctx(tmp_path / "c", history=_history([0.001, 0.001])).saturation() is None
    # a procedure change restarts the count: two small steps since the switch are not saturation yet
    assert _ctx(tmp_path / "d", history=_history([0.001, 0.001, 0.0, 0.001, 0.002], procedure_at=3)).saturation() is None
    # the next order in the cycle: behaviour_first -> signal_first
    ctx = _ctx(tmp_path / "e", history=hist, order="behaviour_first")
    assert agent.propose(ctx)[0].change.analysis_order == "signal_first"


def test_the_analysis_order_orders_the_playbooks_rules(tmp_path):
    findings = [_finding("dead_groups"), _finding("truncation", "warning")]
    agent = PlaybookAgent()
    score = agent.propose(_ctx(tmp_path / "a", findings=findings, order="score_first"))
    behaviour = agent.propose(_ctx(tmp_path / "b", findings=findings, order="behaviour_first"))
    assert score[0].change.factor == "filter" and score[0].change.group_filter is not None  # signal layer first
    assert behaviour[0].change.factor == "reward" and behaviour[0].change.component.name == "overlong"
