"""Campaign report: lineage, alerts and the best-so-far curve, in Markdown and self-contained HTML."""
import json
import xml.etree.ElementTree as ET

import pytest

from evotrainer import evidence, interventions, report, schema
from evotrainer.controller import child_version_spec, next_version_spec
from evotrainer.importers import import_jsonl
from evotrainer.schema import (
    BacktestCompleted,
    BacktestReport,
    Decision,
    EvalCompleted,
    Finding,
    GateAnswered,
    GateOpened,
    GateStats,
    HealthReport,
    HealthReported,
    InterventionProposed,
    InterventionSelected,
    StepCompleted,
    TrainingFinished,
    VersionCreated,
    VersionJudged,
)
from evotrainer.testing import synthetic_rollouts


def _train(store, spec, p_correct):
    v = spec.version
    store.write_version(spec)
    store.ledger.append(VersionCreated(version=v, parent=spec.parent))
    for step in (1, 2):
        df = synthetic_rollouts(store.campaign.name, v, "train", step, 2, 4, p_correct=p_correct)
        store.append_rollouts(v, "train", step, df)
        s = evidence.step_summary(df).row(0, named=True)
        store.ledger.append(StepCompleted(version=v, step=step, n_rollouts=s["n_rollouts"], reward_mean=s["reward_mean"],
                                          correct_mean=s["correct_mean"], seconds=1.0))
    val = synthetic_rollouts(store.campaign.name, v, "val", 2, 6, 2, p_correct=p_correct)
    store.append_rollouts(v, "val", 2, val)
    a = evidence.avg_at_k(val).row(0, named=True)
    store.ledger.append(EvalCompleted(version=v, step=2, k=a["k"], n_items=a["n_items"], avg_at_k=a["avg_at_k"]))
    store.ledger.append(TrainingFinished(version=v, steps=2, seconds=3.0, checkpoint="final"))
    return a["avg_at_k"]


def _finding(code, severity, message, version, rule=None, veto=False):
    return Finding(finding_id=schema.finding_id("signal", code, (version,), (1, 2)), diagnostic="signal", code=code,
                   severity=severity, message=message, versions=(version,), steps=(1, 2), metric="signal/dead_frac",
                   value=0.62, threshold=0.5, rule=rule, veto=veto)


def _stats(cand, base):
    return GateStats(n_items=6, k_candidate=2, k_baseline=2, mean_candidate=cand, mean_baseline=base,
                     mean_delta=cand - base, ci_low=-0.21, ci_high=0.04, bootstrap_b=10000, bootstrap_seed=0,
                     p_wilcoxon=0.31)


@pytest.fixture
def loop_store(store):
    """A campaign as the controller leaves it: v000 promoted, v001 from an intervention, rejected by the gate
    and promoted by a person at the completion gate; health reports on both."""
    _train(store, next_version_spec(store, 0), 0.3)
    h0 = HealthReport(version="v000", metrics={"signal/dead_frac": 0.62}, findings=(
        _finding("dead_groups", "critical", "62% of groups have zero reward variance", "v000", rule="R1"),
        _finding("long_tail", "warning", "completions hit the length cap", "v000"),
        _finding("ok", "info", "informational only", "v000"),
    ))
    store.write_health_report(h0)
    store.ledger.append(HealthReported(version="v000", critical=(h0.findings[0].finding_id,),
                                       warning=(h0.findings[1].finding_id,)))
    d0 = Decision(decision_id="d-v000", candidate="v000", baseline=None, outcome="promote", stats=None,
                  rule="the first version is promoted")
    store.write_decision(d0)
    store.ledger.append(VersionJudged(version="v000", decision_id="d-v000", outcome="promote", baseline=None))

    iv = interventions.new(
        parent="v000", change={"factor": "hparam", "name": "learning_rate", "value": 5e-5},
        hypothesis={"if": "the learning rate is halved", "then": "Avg@k rises", "because": "updates overshoot"},
        target_metric="avg_at_k", success_criterion={"metric": "avg_at_k", "op": ">", "threshold": 0.0},
        rollback_plan="keep v000", evidence=(h0.findings[0].finding_id,), author="playbook",
    )
    other = interventions.new(
        parent="v000", change={"factor": "procedure", "analysis_order": "signal_first"},
        hypothesis={"if": "signal is read first", "then": "fewer dead groups", "because": "order matters"},
        target_metric="avg_at_k", success_criterion={"metric": "avg_at_k", "op": ">", "threshold": 0.0},
        rollback_plan="keep v000", author="playbook",
    )
    for rank, i in enumerate((iv, other)):
        store.write_intervention(i)
        store.ledger.append(InterventionProposed(version="v001", intervention_id=i.intervention_id, parent="v000",
                                                 rank=rank, actor="playbook"))
    bt = BacktestReport(backtest_id="bt-1", intervention_id=iv.intervention_id, versions=("v000",), steps=(1, 2),
                        n_rollouts=16, n_groups=4, before={"reward_mean": 0.3}, after={"reward_mean": 0.3},
                        verdict="supports", reasons=("reward order kept",))
    bt2 = BacktestReport(backtest_id="bt-2", intervention_id=other.intervention_id, versions=("v000",), steps=(1, 2),
                         n_rollouts=16, n_groups=4, before={}, after={}, verdict="inconclusive")
    for b in (bt, bt2):
        store.write_backtest(b)
        store.ledger.append(BacktestCompleted(version="v001", intervention_id=b.intervention_id,
                                              backtest_id=b.backtest_id, verdict=b.verdict))
    store.ledger.append(InterventionSelected(version="v001", intervention_id=iv.intervention_id, backtest_id="bt-1",
                                             actor="playbook"))
    _train(store, child_version_spec(store, 1, "v000", iv), 0.6)
    store.write_health_report(HealthReport(version="v001", metrics={}, findings=(
        _finding("clipped", "warning", "clip ratio | above 0.3", "v001", rule="R4"),)))
    d1 = Decision(decision_id="d-v001", candidate="v001", baseline="v000", outcome="reject",
                  stats=_stats(0.45, 0.53), rule="promote if CI low > 0; reject if CI high < 0")
    store.write_decision(d1)
    store.ledger.append(VersionJudged(version="v001", decision_id="d-v001", outcome="reject", baseline="v000"))
    store.ledger.append(GateOpened(version="v001", gate="completion", subject=("d-v001",)))
    store.ledger.append(GateAnswered(version="v001", gate="completion", answer="revise", outcome="promote",
                                     actor="alice", reason="the eval set is too small to reject"))
    return store, iv


def _table(md, heading):
    block = md.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in block.splitlines() if line.startswith("| ")]


def test_lineage_rows(loop_store):
    store, iv = loop_store
    data = report.gather(store)
    rows = report.lineage_rows(data)
    assert [r[0] for r in rows] == ["v000", "v001"]
    v0, v1 = rows
    assert v0[1] == "—" and v0[2] == "— (base)" and v0[4] == "—" and v0[7] == "promote"
    assert v1[1] == "v000"
    assert v1[2] == f"{iv.intervention_id}: {interventions.describe(iv)}" and "learning_rate" in v1[2]
    assert v1[3] == iv.hypothesis.text()
    assert v1[4] == "supports (bt-1)"  # the selected backtest, not the other candidate's
    assert v1[6].startswith("0.450 vs 0.530 (v000): Δ -0.080 [-0.210, +0.040] 95% CI, n=6")
    assert v1[7] == "promote (override by alice: the eval set is too small to reject; gate said reject)"
    # Avg@k with an item-bootstrap CI that brackets the value (and equals the ledger's Avg@k)
    r1 = data.rows[1]
    ledger_avg = data.state.status.versions["v001"].final_avg_at_k
    assert r1.avg == pytest.approx(ledger_avg) and r1.ci[0] <= r1.avg <= r1.ci[1] and r1.k == 2 and r1.n_items == 6
    # the override makes v001 the best so far
    assert [r.best_so_far for r in data.rows] == ["v000", "v001"]

    md = report.campaign_report(store)
    assert md.startswith(f"# Campaign {store.campaign.name}\n")
    assert f"- **policy**: {store.campaign.policy}" in md and "- **preset**: smoke" in md
    assert "- **domain**: math (tiers [0])" in md
    lines = _table(md, "Lineage")
    assert lines[0].startswith("| version | parent | intervention | hypothesis | backtest |")
    assert len(lines) == 3 and lines[2].startswith(f"| v001 | v000 | {iv.intervention_id}: ")
    assert "gate said reject" in lines[2]


def test_alert_lines(loop_store):
    store, _ = loop_store
    md = report.campaign_report(store)
    alerts = md.split("## Health alerts\n", 1)[1].split("\n## ", 1)[0]
    assert "- **v000**:" in alerts
    assert ("  - **CRITICAL** 62% of groups have zero reward variance (rule R1, dead_groups, signal; "
            "signal/dead_frac = 0.62 (threshold 0.5))") in alerts
    assert "  - **WARNING** completions hit the length cap (long_tail, signal;" in alerts
    assert alerts.index("CRITICAL") < alerts.index("WARNING")
    assert "informational only" not in alerts  # info findings are not alerts
    assert "  - **WARNING** clip ratio \\| above 0.3 (rule R4, clipped" in alerts  # pipes escaped


def test_html_is_self_contained_with_svg(loop_store, tmp_path):
    store, iv = loop_store
    md_path, html_path = report.write_report(store, tmp_path / "r" / "report.md", tmp_path / "r" / "report.html")
    assert md_path.read_text() == report.campaign_report(store)
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<svg" in page and "</svg>" in page and "<polyline" in page and 'class="errbar"' in page
    assert "<style>" in page and "<script" not in page and "http" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert iv.intervention_id in page and "gate said reject" in page
    assert '<span class="CRITICAL">CRITICAL</span>' in page
    assert "clip ratio | above 0.3" in page  # HTML needs no pipe escaping, only entity escaping
    svg = report.best_so_far_svg(report.gather(store))
    assert svg.count('class="errbar"') == 2  # one error bar per version
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert report.write_report(store, tmp_path / "only.md") == (tmp_path / "only.md", None)


def test_report_without_loop_documents(store, tmp_path):
    """A fixed chain (no decisions, backtests or health reports): sections say none yet."""
    a0 = _train(store, next_version_spec(store, 0), 0.2)
    a1 = _train(store, next_version_spec(store, 1), 0.7)
    md = report.campaign_report(store)
    assert "Health reports: none yet." in md
    lines = _table(md, "Lineage")
    assert lines[1].split(" | ")[-1] == "none yet |" and lines[2].split(" | ")[2] == "— (fixed harness)"
    assert "no gate decisions yet: best so far = the highest Avg@k so far" in md
    data = report.gather(store)
    best = "v001" if a1 > a0 else "v000"
    assert [r.best_so_far for r in data.rows] == ["v000", best]
    assert "<svg" in report._html(data)
    # an empty campaign still renders
    from evotrainer.testing import temp_store

    empty = temp_store(tmp_path / "empty", name="empty")
    md = report.campaign_report(empty)
    assert "Versions: none yet." in md and "Health reports: none yet." in md and "Evaluations: none yet." in md
    assert "no held-out evaluations yet" in report._html(report.gather(empty))


def test_report_on_imported_campaign(tmp_path):
    rows = []
    for v in ("v000", "v001"):
        rows += synthetic_rollouts("ext", v, "train", 1, 2, 4).to_dicts()
        rows += synthetic_rollouts("ext", v, "val", 1, 3, 2, p_correct=0.5).to_dicts()
    src = tmp_path / "run.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = import_jsonl(src, tmp_path / "camp")
    md, html = report.write_report(store, tmp_path / "r.md", tmp_path / "r.html")
    text = md.read_text()
    assert "- **policy**: external:run.jsonl" in text and "- **preset**: import:jsonl" in text
    assert len(_table(text, "Lineage")) == 3 and "Health reports: none yet." in text
    assert "<svg" in html.read_text()
