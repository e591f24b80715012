"""The notebook widgets over a real smoke campaign: each view's synced state holds the store's data,
filters and paging match direct polars queries, and gate answers write the right ledger events.
No browser: intents are sent the way the JavaScript sends them (`handle_intent`)."""
import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("anywidget")

import widgets
from evotrainer.lab import Lab
from evotrainer.store import Store
from widgets import (
    BacktestCompare,
    CampaignView,
    DiagnosticEditor,
    GateReview,
    ProposalQueue,
    RolloutBrowser,
    workbench,
)

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, data_dir):
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory, data_dir):
    """A 2-version smoke campaign with backtest and completion gates; snapshots at each gate."""
    base = tmp_path_factory.mktemp("widgets")
    camp = base / "camp"
    run = ("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "2")
    cli(*run, "--gates", "backtest,completion", data_dir=data_dir)
    shutil.copytree(camp, base / "at_v000_completion")
    cli("gate", str(camp), "approve", "--who", "setup", "--reason", "baseline ok", data_dir=data_dir)
    cli(*run, "--resume", data_dir=data_dir)
    shutil.copytree(camp, base / "at_v001_backtest")  # proposals + backtests, gate open
    cli("gate", str(camp), "approve", "--who", "setup", "--reason", "agent's pick", data_dir=data_dir)
    cli(*run, "--resume", data_dir=data_dir)  # v001 trained, waiting at its completion gate
    return {"final": camp, "backtest_gate": base / "at_v001_backtest", "v000_completion": base / "at_v000_completion"}


@pytest.fixture
def final_lab(campaigns):
    return Lab.attach(campaigns["final"])


def copy_lab(campaigns, which, tmp_path) -> Lab:
    dest = tmp_path / "camp"
    shutil.copytree(campaigns[which], dest)
    return Lab.attach(dest)


def answers(lab):
    return [e for e in lab.store.ledger.events() if e.kind == "gate_answered"]


# --------------------------------------------------------------------------- CampaignView


def test_campaign_view_shows_each_versions_decision_curve_alerts_and_gate(final_lab):
    view = CampaignView(final_lab, refresh_s=2.0)
    assert view.auto_refresh is False  # no running asyncio loop here: refresh() only
    store = final_lab.store
    outcomes = {d.candidate: d.outcome for d in store.decisions()}
    assert outcomes == {"v000": "promote", "v001": "inconclusive"}
    rows = {r["version"]: r for r in view.versions}
    assert list(rows) == ["v000", "v001"]
    for v, out in outcomes.items():
        assert rows[v]["outcome"] == out and rows[v]["colour"] == out and rows[v]["state"] == "trained"
        hr = store.read_health_report(v)
        assert rows[v]["n_critical"] == sum(f.severity == "critical" for f in hr.findings)
        assert rows[v]["n_warning"] == sum(f.severity == "warning" for f in hr.findings)
    assert rows["v001"]["parent"] == "v000" and rows["v001"]["depth"] == 1 and rows["v000"]["best"]
    assert rows["v001"]["intervention_id"] == store.read_version("v001").intervention
    st = final_lab.status()
    assert rows["v000"]["avg_at_k"] == pytest.approx(st.versions["v000"].final_avg_at_k)
    # best-so-far stays at the promoted v000; v001's CI bar is the baseline mean + the paired CI of the delta
    curve = {p["version"]: p for p in view.curve}
    dec = next(d for d in store.decisions() if d.candidate == "v001")
    assert curve["v001"]["best_so_far"] == pytest.approx(rows["v000"]["avg_at_k"])
    assert curve["v001"]["ci_low"] == pytest.approx(dec.stats.mean_baseline + dec.stats.ci_low)
    assert curve["v001"]["ci_high"] == pytest.approx(dec.stats.mean_baseline + dec.stats.ci_high)
    assert curve["v000"]["ci_low"] is None
    lo, hi = view.curve_domain
    assert lo <= min(p["ci_low"] or p["avg_at_k"] for p in view.curve) and hi >= max(p["avg_at_k"] for p in view.curve)
    n_alerts = sum(len(store.read_health_report(v).alerts) for v in ("v000", "v001"))
    assert len(view.alerts) == n_alerts and {a["severity"] for a in view.alerts} <= {"critical", "warning"}
    assert view.gate == {"version": "v001", "gate": "completion", "subject": [dec.decision_id]}
    assert view.live == {"version": None} and view.running is False
    json.dumps(view.get_state())  # everything synced is plain JSON


def test_campaign_view_buttons_and_auto_refresh_on_the_event_loop(campaigns, tmp_path):
    lab = copy_lab(campaigns, "final", tmp_path)
    view = CampaignView(lab, refresh_s=0)
    view.handle_intent("pause")
    assert lab.store.pause_requested() and view.paused and view.message_kind == "ok"
    view.handle_intent("no_such_button")
    assert view.message_kind == "error"

    async def main():
        v = CampaignView(lab, refresh_s=0.1)
        assert v.auto_refresh and v._task is not None
        calls = []
        orig = v.refresh
        v.refresh = lambda: (calls.append(1), orig())
        await asyncio.sleep(0.45)  # the kernel stays free: this coroutine runs while the timer ticks
        v.close()
        assert v._task is None and not v.auto_refresh
        return len(calls)

    assert asyncio.run(main()) >= 2


# --------------------------------------------------------------------------- RolloutBrowser


def uids(df):
    return df["rollout_uid"].to_list()


def test_browser_pages_over_the_store_with_correct_totals(final_lab):
    b = RolloutBrowser(final_lab, page_size=7)
    everything = final_lab.store.rollouts().collect()
    assert b.total == everything.height and b.n_pages == -(-everything.height // 7)
    seen = []
    for _ in range(b.n_pages):
        seen += [r["rollout_uid"] for r in b.rows]
        b.handle_intent("next_page")
    assert seen == uids(everything)  # paging visits every row once, in store order
    assert b.page == b.n_pages - 1
    b.prev_page()
    assert b.page == b.n_pages - 2
    row = b.rows[0]
    stored = everything.filter(pl.col("rollout_uid") == row["rollout_uid"]).row(0, named=True)
    for col in ("reward", "advantage", "correct", "filtered", "step", "group_id"):
        assert row[col] == stored[col]
    assert stored["completion"].startswith(row["completion_head"])


@pytest.mark.parametrize("filters, expr", [
    ({"version": "v001"}, pl.col("version") == "v001"),
    ({"split": "val"}, pl.col("split") == "val"),
    ({"versions": ["v000"], "split": "train", "step_min": 2, "step_max": 3},
     (pl.col("version") == "v000") & (pl.col("split") == "train") & pl.col("step").is_between(2, 3)),
    ({"reward_min": 0.5}, pl.col("reward") >= 0.5),
    ({"reward_max": 0.0, "correct": "no"}, (pl.col("reward") <= 0.0) & (pl.col("correct") == False)),
    ({"correct": "yes"}, pl.col("correct") == True),
    ({"text": "the"}, pl.col("prompt").str.contains("the", literal=True)
     | pl.col("completion").str.contains("the", literal=True)),
])
def test_browser_filters_match_direct_polars_queries(final_lab, filters, expr):
    b = RolloutBrowser(final_lab, page_size=1000)
    b.set_filters(**filters)
    want = final_lab.store.rollouts().filter(expr).collect()
    assert b.total == want.height and [r["rollout_uid"] for r in b.rows] == uids(want)
    b.clear_filters()
    assert b.total == final_lab.store.rollouts().collect().height


def test_browser_finding_filter_and_bad_filters(final_lab):
    b = RolloutBrowser(final_lab, page_size=100)
    hr = final_lab.store.read_health_report("v000")
    finding = next(f for f in hr.findings if f.rollout_uids)
    assert finding.finding_id in {f["finding_id"] for f in b.options["findings"]}
    b.handle_intent("set_filters", {"finding_id": finding.finding_id})
    assert b.total == len(finding.rollout_uids) and {r["rollout_uid"] for r in b.rows} == set(finding.rollout_uids)
    before = b.total
    b.handle_intent("set_filters", {"version": "v999"})  # refused with a message; the previous view stays
    assert b.message_kind == "error" and "v999" in b.message and b.total == before
    b.handle_intent("set_filters", {"colour": "red"})
    assert b.message_kind == "error" and "unknown filter" in b.message


def test_group_view_shows_every_sample_as_stored(final_lab):
    b = RolloutBrowser(final_lab)
    gid = b.rows[0]["group_id"]
    b.handle_intent("open_selected")  # Enter on the first row
    assert b.view == "group" and b.group["group_id"] == gid
    stored = final_lab.store.rollouts().filter(pl.col("group_id") == gid).sort("sample_idx").collect()
    assert b.group["n"] == stored.height == len(b.group_rows) == 4
    assert [s["advantage"] for s in b.group_rows] == stored["advantage"].to_list()
    assert [s["advantage_text"] for s in b.group_rows] == [f"{a:+.3f}" for a in stored["advantage"].to_list()]
    assert [s["reward"] for s in b.group_rows] == stored["reward"].to_list()
    assert [s["filtered"] for s in b.group_rows] == stored["filtered"].to_list()
    assert [s["completion"] for s in b.group_rows] == stored["completion"].to_list()
    assert set(b.group["components"]) == {"r.correctness", "r.format"}
    for s, comp in zip(b.group_rows, stored["r.correctness"].to_list()):
        assert s["r.correctness"] == comp and {"mean_logprob", "truncated", "filter_reason"} <= set(s)
    assert b.group["reward_std"] == pytest.approx(float(stored["reward"].std(ddof=0)))
    # j: next group (of the page's order); k: back; Esc: table
    next_gid = next(r["group_id"] for r in b.rows if r["group_id"] != gid)
    b.handle_intent("move", {"delta": 1})
    assert b.group["group_id"] == next_gid
    b.handle_intent("move", {"delta": -1})
    assert b.group["group_id"] == gid
    b.handle_intent("back")
    assert b.view == "table"
    b.handle_intent("move", {"delta": 1})
    assert b.cursor == 1


def test_keyboard_moves_across_pages(final_lab):
    b = RolloutBrowser(final_lab, page_size=3)
    for _ in range(3):
        b.handle_intent("move", {"delta": 1})
    assert b.page == 1 and b.cursor == 0
    b.handle_intent("move", {"delta": -1})
    assert b.page == 0 and b.cursor == 2


def test_single_turn_rollouts_step_through_as_prompt_and_completion(final_lab):
    b = RolloutBrowser(final_lab)
    uid = b.rows[2]["rollout_uid"]
    turns = b.select_rollout(uid)
    stored = final_lab.store.rollouts().filter(pl.col("rollout_uid") == uid).collect().row(0, named=True)
    assert b.view == "turns" and [t["role"] for t in turns] == ["prompt", "completion"]
    assert turns[0]["text"] == stored["prompt"] and turns[1]["text"] == stored["completion"]
    b.handle_intent("turn", {"delta": 1})
    assert b.turn_index == 1
    b.handle_intent("turn", {"delta": 5})
    assert b.turn_index == 1


def test_multi_turn_rollouts_show_their_stored_turns(campaigns, tmp_path):
    lab = copy_lab(campaigns, "final", tmp_path)
    row = lab.store.rollouts("v000", "train", (1, 1)).collect().row(0, named=True)
    turns = pl.DataFrame({
        "rollout_uid": [row["rollout_uid"]] * 3, "turn_idx": [0, 1, 2], "role": ["user", "assistant", "tool"],
        "text": ["q", "call calc", "4"], "tool_name": [None, "calc", None], "tool_args": [None, "2+2", None],
        "tool_output": [None, "4", None], "tool_ok": [None, True, None], "n_tokens": [3, 4, 1],
        "mean_logprob": [None, -0.5, None]})
    lab.store.append_turns("v000", "train", 1, turns)
    b = RolloutBrowser(lab)
    shown = b.select_rollout(row["rollout_uid"])
    assert [t["role"] for t in shown] == ["user", "assistant", "tool"] and shown[1]["tool_name"] == "calc"
    assert b.rollout["rollout_uid"] == row["rollout_uid"]


def test_follow_one_item_across_versions(final_lab):
    b = RolloutBrowser(final_lab)
    allrows = final_lab.store.rollouts().collect()
    item = allrows.filter(pl.col("split") == "val")["item_id"][0]  # val items are shared by every version
    hist = b.follow_item(item)
    want = allrows.filter(pl.col("item_id") == item)
    assert b.view == "item" and hist["n"] == want.height
    got = {v["version"]: v for v in hist["versions"]}
    assert set(got) == set(want["version"].unique())
    for v, part in want.group_by("version"):
        assert got[v[0]]["n"] == part.height
        assert got[v[0]]["share_correct"] == pytest.approx(part["correct"].cast(pl.Float64).mean())


# --------------------------------------------------------------------------- BacktestCompare


def test_backtest_compare_shows_candidates_and_consistent_distributions(final_lab):
    bc = BacktestCompare(final_lab)
    props = final_lab.proposals
    assert [c["backtest_id"] for c in bc.candidates] == [p.backtest_id for p in props]
    reports = {b.backtest_id: b for b in final_lab.store.backtests()}
    for c, p in zip(bc.candidates, props):
        bt = reports[c["backtest_id"]]
        assert c["intervention_id"] == p.intervention.intervention_id and c["verdict"] == bt.verdict
        assert c["hypothesis"] == p.intervention.hypothesis.text() and c["change"] == p.description
        assert c["dgr_before"] == pytest.approx(bt.before["dgr"]) and c["dgr_after"] == pytest.approx(bt.after["dgr"])
        assert (c["groups_rescued"], c["order_violations"]) == (bt.groups_rescued, bt.order_violations)
        assert c["effective_data_after"] == pytest.approx(bt.effective_data_after)
        assert c["reasons"] == list(bt.reasons) and "Counterfactual" in c["counterfactual_note"]
        h = bc.histograms[c["backtest_id"]]
        # the re-scored distributions reproduce the stored backtest's summaries
        assert h["n_before"] == bt.n_rollouts and sum(h["before"]) == h["n_before"] and sum(h["after"]) == h["n_after"]
        assert h["mean_before"] == pytest.approx(bt.before["reward_mean"])
        assert h["mean_after"] == pytest.approx(bt.after["reward_mean"])
    assert sum(c["selected"] for c in bc.candidates) == 1
    assert set(bc.figures) == set(bc.histograms) and len(bc.plots.children) == len(bc.figures)
    one = BacktestCompare(final_lab, backtest_ids=[props[1].backtest_id], distributions=False)
    assert [c["backtest_id"] for c in one.candidates] == [props[1].backtest_id] and one.histograms == {}
    with pytest.raises(ValueError, match="no backtest"):
        BacktestCompare(final_lab, backtest_ids=["bt-nope"])


# --------------------------------------------------------------------------- ProposalQueue / GateReview


def test_gate_review_lists_proposals_with_evidence(campaigns, tmp_path):
    lab = copy_lab(campaigns, "backtest_gate", tmp_path)
    q = GateReview(lab, who="alice")
    assert GateReview is ProposalQueue
    assert q.gate["gate"] == "backtest" and q.gate["version"] == "v001"
    props = lab.proposals
    assert [p["intervention_id"] for p in q.proposals] == [p.intervention.intervention_id for p in props]
    assert all(p["actionable"] and p["verdict"] in ("supports", "contradicts", "inconclusive") for p in q.proposals)
    cited = {fid for p in props for fid in p.intervention.evidence}
    hr = lab.store.read_health_report("v000")
    assert {f["finding_id"] for f in q.findings} == cited & {f.finding_id for f in hr.findings}
    assert json.loads(q.proposals[0]["json"])["parent"] == "v000"


def test_gate_review_refuses_bad_input_and_stores_nothing(campaigns, tmp_path):
    lab = copy_lab(campaigns, "backtest_gate", tmp_path)
    q = ProposalQueue(lab, who="alice")
    ledger_before = lab.store.ledger.path.read_bytes()
    ivs_before = sorted(p.name for p in (lab.store.root / "interventions").iterdir())
    assert q.approve(0, reason="  ") is False and "reason" in q.message and q.message_kind == "error"
    assert q.approve(0, reason="ok", who="") is False and "who" in q.message
    assert q.revise(0, "{not json", reason="typo") is False and "JSON" in q.message
    bad = json.loads(q.proposals[0]["json"])
    bad["change"] = {"factor": "hparam", "name": "temperature", "value": 9.0}
    assert q.revise(0, json.dumps(bad), reason="too hot") is False and "out of range" in q.message
    bad["change"] = {"factor": "reward", "op": "add", "component": {"name": "no_such_reward"}}
    assert q.revise(None, bad, reason="unknown") is False and "unknown reward component" in q.message
    assert q.answer_completion("promote", reason="wrong gate") is False
    q.handle_intent("revise", {"index": 0, "intervention_json": "[1, 2]", "reason": "x"})
    assert q.message_kind == "error"
    assert q.reject(2, reason="not convinced") and q.rejected == [2]
    assert lab.store.ledger.path.read_bytes() == ledger_before
    assert sorted(p.name for p in (lab.store.root / "interventions").iterdir()) == ivs_before


def test_approve_a_proposal_records_who_and_why(campaigns, tmp_path):
    lab = copy_lab(campaigns, "backtest_gate", tmp_path)
    q = ProposalQueue(lab, who="nobody")
    chosen = lab.proposals[2].intervention.intervention_id
    q.handle_intent("approve", {"index": 2, "reason": "tiers give partial credit", "who": "alice"})
    assert q.message_kind == "ok", q.message
    (ev,) = answers(lab)[-1:]
    assert (ev.version, ev.gate, ev.actor, ev.reason) == ("v001", "backtest", "alice", "tiers give partial credit")
    assert ev.answer == "revise" and ev.intervention_id == chosen  # the chosen proposal replaces the others
    assert q.gate is None and q.history[-1]["actor"] == "alice"


def test_revise_with_edited_json_stores_the_persons_intervention(campaigns, tmp_path):
    lab = copy_lab(campaigns, "backtest_gate", tmp_path)
    q = ProposalQueue(lab, who="bob")
    edited = json.loads(q.proposals[0]["json"])
    edited["change"] = {"factor": "hparam", "name": "temperature", "value": 0.7}
    edited["hypothesis"]["if"] = "we sample colder"
    assert q.revise(0, json.dumps(edited), reason="try colder sampling first"), q.message
    ev = answers(lab)[-1]
    assert (ev.answer, ev.actor, ev.reason) == ("revise", "bob", "try colder sampling first")
    iv = lab.store.read_intervention(ev.intervention_id)
    assert iv.change.name == "temperature" and iv.change.value == 0.7 and iv.author == edited["author"]
    assert ev.intervention_id not in {p.intervention.intervention_id for p in lab.proposals[:3]}


def test_write_your_own_intervention_from_the_draft(campaigns, tmp_path):
    lab = copy_lab(campaigns, "backtest_gate", tmp_path)
    q = ProposalQueue(lab, who="dana")
    assert json.loads(q.draft)["parent"] == "v000"
    q.handle_intent("write", {"intervention_json": q.draft, "reason": "my own idea", "who": "dana"})
    assert q.message_kind == "ok", q.message
    ev = answers(lab)[-1]
    assert ev.answer == "revise" and ev.actor == "dana" and lab.store.read_intervention(ev.intervention_id).author == "dana"


def test_abort_ends_the_campaign_with_who_and_why(campaigns, tmp_path):
    lab = copy_lab(campaigns, "backtest_gate", tmp_path)
    q = ProposalQueue(lab, who="carol")
    assert q.abort(reason="budget spent")
    ev = answers(lab)[-1]
    assert (ev.answer, ev.actor, ev.reason) == ("abort", "carol", "budget spent")
    aborted = [e for e in lab.store.ledger.events() if e.kind == "campaign_aborted"]
    assert aborted and aborted[0].actor == "carol" and q.gate is None


def test_completion_gate_answers(campaigns, tmp_path):
    lab = copy_lab(campaigns, "final", tmp_path)
    q = ProposalQueue(lab, who="dan")
    assert q.gate["gate"] == "completion" and q.decision["outcome"] == "inconclusive"
    assert not any(p["actionable"] for p in q.proposals)
    assert q.approve(0, reason="carry it") is False and "completion gate" in q.message
    assert q.answer_completion("maybe", reason="x") is False
    q.handle_intent("answer_completion", {"outcome": "reject", "reason": "eval too small", "who": "dan"})
    ev = answers(lab)[-1]
    assert (ev.gate, ev.answer, ev.outcome, ev.actor, ev.reason) == ("completion", "revise", "reject", "dan",
                                                                     "eval too small")
    assert lab.loop_state().loop("v001").outcome == "reject"
    view = CampaignView(lab, refresh_s=0)
    row = next(r for r in view.versions if r["version"] == "v001")
    assert row["outcome"] == "reject" and row["decided_by"] == "dan"


def test_completion_gate_approve_without_index(campaigns, tmp_path):
    lab = copy_lab(campaigns, "v000_completion", tmp_path)
    q = ProposalQueue(lab, who="erin")
    assert q.proposals == [] and q.approve(None, reason="baseline ok")
    ev = answers(lab)[-1]
    assert (ev.version, ev.gate, ev.answer, ev.actor) == ("v000", "completion", "approve", "erin")


# --------------------------------------------------------------------------- DiagnosticEditor


def test_diagnostic_editor_runs_shows_findings_links_and_saves(final_lab, campaigns, tmp_path):
    lab = copy_lab(campaigns, "final", tmp_path)
    browser = RolloutBrowser(lab)
    ed = DiagnosticEditor(lab).link(browser)
    assert ed.linked and ed.selected_versions == ["v001"]
    res = ed.run(versions=["v000"], wait=True)
    assert res["ok"], res
    metrics = {m["name"]: m["value"] for m in res["metrics"]}
    train = lab.store.rollouts("v000").collect()
    assert metrics["n_rollouts"] == train.height
    assert ed.result == res and res["findings"]
    f = res["findings"][0]
    ed.handle_intent("open_finding", {"index": 0})
    assert ed.message_kind == "ok" and browser.total == len(f["rollout_uids"])
    assert {r["rollout_uid"] for r in browser.rows} == set(f["rollout_uids"])
    # save: required fields, then a revision, then a child revision
    assert ed.save("dead_share", "alice", "") is None and ed.message_kind == "error"
    meta = ed.save("dead_share", "alice", "first version")
    assert meta is not None and [r["sha256"] for r in ed.revisions] == [meta.sha256]
    ed.set_source(ed.source + "\n# tweak\n")
    child = ed.save("dead_share", "bob", "a tweak")
    assert child.parent_sha256 == meta.sha256 and len(lab.store.user_diagnostics("dead_share")) == 2


@pytest.mark.parametrize("source, expect, ok", [
    ("def diagnose(r, m:\n", "syntax", False),
    ("def diagnose(r, m):\n    return 1 / 0\n", "ZeroDivisionError", False),
    ("def diagnose(r, m):\n    while True:\n        pass\n", "did not finish", False),
    ("def diagnose(r, m):\n    print('x' * 5_000_000)\n    return {'metrics': {}, 'findings': []}\n",
     "output was cut", True),
    ("def diagnose(r, m):\n    return {'metrics': {f'm{i}': 1.0 for i in range(200_000)}, 'findings': []}\n",
     "KB", False),
])
def test_diagnostic_editor_shows_bad_code_as_a_message(final_lab, source, expect, ok):
    import hashlib

    def digest():
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(final_lab.store.root.rglob("*")) if p.is_file()}

    before = digest()
    ed = DiagnosticEditor(final_lab, timeout_s=1.5)
    res = ed.run(wait=True, source=source)
    assert res["ok"] is ok and expect in ed.message and not ed.running
    assert ed.message_kind == ("ok" if ok else "error")
    assert digest() == before  # running a diagnostic stores nothing


def test_diagnostic_editor_runs_off_the_kernel_loop(final_lab):
    ed = DiagnosticEditor(final_lab)

    async def main():
        task = ed.run()  # returns at once; the subprocess runs in a worker
        assert ed.running and isinstance(task, asyncio.Task)
        ticks = 0
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.01)
        return await task, ticks

    res, ticks = asyncio.run(main())
    assert res["ok"] and not ed.running and ticks > 1  # the loop kept turning while it ran


CONSTANT_DIAGNOSTIC = "def diagnose(rollouts, metrics):\n    return {'metrics': {'score': 1.0}, 'findings': []}\n"
# separates by construction (it names the version the person rejected): enough to exercise acceptance
NAMES_V001 = "def diagnose(rollouts, metrics, ctx):\n    return {'metrics': {'is_v001': float(ctx['version'] == 'v001')}}\n"


@pytest.fixture
def judged_lab(campaigns, tmp_path):
    """The final campaign with both sides: v000 promoted by the gate, v001 rejected by a person at its
    completion gate (the gate said inconclusive)."""
    lab = copy_lab(campaigns, "final", tmp_path)
    lab.gate.revise(outcome="reject", reason="the held-out answers got worse", who="dan")
    assert {v: lab.loop_state().loop(v).outcome for v in ("v000", "v001")} == {"v000": "promote", "v001": "reject"}
    return lab


def test_diagnostic_editor_validation_rejects_a_constant_diagnostic_with_the_reason(judged_lab):
    lab = judged_lab
    ed = DiagnosticEditor(lab, source=CONSTANT_DIAGNOSTIC)
    assert ed.validate(who="alice", reason="does it separate?") is None and "save one first" in ed.message
    meta = ed.save("constant", "alice", "always one")
    assert ed.validate(who="", reason="x") is None and "who" in ed.message and ed.message_kind == "error"
    ledger_before = len(lab.store.ledger.events())
    v = ed.validate(who="alice", reason="does it separate kept from bad?", wait=True)
    assert v == ed.validation and v["ok"] and v["accepted"] is False and not ed.validating
    assert (v["name"], v["sha256"], v["author"]) == ("constant", meta.sha256, "alice")
    # the reason, shown in the state and the message line
    assert "constant output" in v["why"] and "effect 0" in v["why"]
    assert "REJECTED" in ed.message and "constant output" in ed.message
    assert any(r.startswith("score: constant output") for r in v["reasons"])
    # the effect sizes of the deciding signal and per signal
    assert v["signal"] == "score" and (v["cliffs_delta"], v["auc"], v["cohens_d"]) == (0.0, 0.5, 0.0)
    [eff] = v["effects"]
    assert eff["signal"] == "score" and eff["deciding"] and not eff["passed"] and (eff["n_kept"], eff["n_bad"]) == (1, 1)
    # the per-version table: v000 kept, v001 bad (the person's override wins), the constant value on both
    assert v["columns"] == ["score"] and (v["n_kept"], v["n_bad"], v["n_unused"]) == (1, 1, 0)
    assert [(r["version"], r["label"], r["outcome"], r["values"]) for r in v["rows"]] == [
        ("v000", "kept", "promote", [1.0]), ("v001", "bad", "reject", [1.0])]
    # the stored report and its ledger event say the same; the revision is not validated
    [rep] = lab.store.validations("constant")
    assert rep.validation_id == v["validation_id"] and not rep.accepted and rep.why == v["why"]
    events = lab.store.ledger.events()
    assert len(events) == ledger_before + 1 and events[-1].kind == "diagnostic_validated" and events[-1].actor == "alice"
    assert [r["validated"] for r in ed.revisions] == [False]
    json.dumps(ed.get_state())


def test_diagnostic_editor_validation_accepts_and_refreshes_the_revisions(judged_lab):
    lab = judged_lab
    ed = DiagnosticEditor(lab, source=NAMES_V001)
    ed.save("names_v001", "bob", "a rule that knows the answer")
    ed.set_source(CONSTANT_DIAGNOSTIC)
    ed.save("constant", "bob", "always one")  # the newest revision, but not the one validated below
    assert lab.store.user_diagnostics("constant")[0][0].parent_sha256 is None  # a new name: a new lineage
    ed.load_revision(lab.store.user_diagnostics("names_v001")[0][0].sha256)
    ed.set_source(ed.source + "# an unsaved edit\n")
    # from the button: the loaded revision is validated, the editor's author and reason fields come along
    fut = ed.handle_intent("validate", {"name": "", "who": "bob", "reason": "separates v001?", "metric": ""})
    v = fut.result(timeout=300)  # no event loop here: a Future of the worker pool
    assert v == ed.validation and not ed.validating
    assert v["ok"] and v["accepted"] and v["name"] == "names_v001" and v["signal"] == "is_v001", v
    assert v["cliffs_delta"] == 1.0 and v["auc"] == 1.0
    assert [(r["label"], r["values"]) for r in v["rows"]] == [("kept", [0.0]), ("bad", [1.0])]
    assert "ACCEPTED" in ed.message and ed.message_kind == "ok"
    assert {r["name"]: r["validated"] for r in ed.revisions} == {"names_v001": True, "constant": False}
    # a named metric that it never returns: rejected, with the reason
    v = ed.validate(name="names_v001", who="bob", reason="only this metric", metric="nope", wait=True)
    assert not v["accepted"] and "'nope' was never returned" in v["why"]
    assert {r["name"]: r["validated"] for r in ed.revisions} == {"names_v001": False, "constant": False}  # revoked


def test_diagnostic_editor_validates_off_the_kernel_loop(judged_lab):
    ed = DiagnosticEditor(judged_lab, source=CONSTANT_DIAGNOSTIC)
    ed.save("constant", "carol", "always one")

    async def main():
        task = ed.handle_intent("validate", {"who": "carol", "reason": "in the background", "metric": ""})
        assert ed.validating and isinstance(task, asyncio.Task)
        ticks = 0
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.01)
        return await task, ticks

    v, ticks = asyncio.run(main())
    assert v["ok"] and not v["accepted"] and not ed.validating and ticks > 1 and ed.validation == v


# --------------------------------------------------------------------------- the workbench


def test_workbench_has_all_five_views(final_lab):
    tab = workbench(final_lab, refresh_s=0)
    assert tab.titles == ("Campaign", "Rollouts", "Backtests", "Gate", "Diagnostics")
    kinds = [CampaignView, RolloutBrowser, BacktestCompare, ProposalQueue, DiagnosticEditor]
    assert all(isinstance(c, k) for c, k in zip(tab.children, kinds, strict=True))
    assert tab.children[4]._browser is tab.children[1]
    assert set(widgets.__all__) >= {"CampaignView", "RolloutBrowser", "BacktestCompare", "ProposalQueue",
                                    "GateReview", "DiagnosticEditor", "workbench"}


def test_widgets_are_not_imported_by_the_core():
    code = "import evotrainer, evotrainer.lab, sys; print(any(m == 'widgets' or m.startswith('widgets.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    assert out.stdout.strip() == "False", out.stderr


def test_store_fixture_sanity(campaigns):
    assert Store.open(campaigns["final"]).versions() == ["v000", "v001"]
