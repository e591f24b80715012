"""Campaign report: Markdown (and a self-contained HTML page) of a campaign's lineage and health.

Sections:
1. Header: the campaign's policy, domain, preset, seed, agent, gates, and its state (aborted or not).
2. Lineage: one row per version: parent, the intervention that created it (id and
   `interventions.describe`, or the change's JSON when that is unavailable), its hypothesis, the
   verdict of the selected backtest, Avg@k with a 95% item-bootstrap CI (from the stored val
   rollouts of the version's last evaluation), the gate's Δ vs its baseline with the CI of its
   GateStats, and the decision (the effective outcome from `loopstate`, so a person's
   completion-gate override shows, with who and why, next to what the gate said).
3. Health alerts per version from `store.read_health_report(version)` (CRITICAL, then WARNING),
   each with its rule, code and message.
4. Best so far: with gate decisions, the latest promoted version at each point of the chain (the
   rule `LoopState.best` applies); without any decision (fixed chains, imported campaigns), the
   highest Avg@k so far. HTML draws it as an inline SVG line with CI error bars (no plotting
   dependency); Markdown gives the same numbers as a table.
5. Agent usage: the trainer agent's API calls, input/output/cache tokens and cost per version and
   in total, summed from the ledger's `agent_usage` events, with each phase's outcome (answered,
   fallback to the playbook, stopped).

Every section works on a campaign with no decisions, backtests or health reports: it says "none yet".
Core only (polars, numpy via `stats`); reads the store, writes nothing into it.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from . import evidence, stats
from .loopstate import LoopState, derive
from .schema import AgentUsage, BacktestReport, Decision, HealthReport, Intervention, VersionSpec
from .store import Store

NONE_YET = "none yet"
CI_LEVEL = 0.95
BOOTSTRAP_B = 2000
BOOTSTRAP_SEED = 0


# --------------------------------------------------------------------------- gathered facts


@dataclass
class VersionRow:
    version: str
    parent: str | None
    created: bool = True
    intervention_id: str | None = None
    change: str = ""
    hypothesis: str = ""
    backtest_id: str | None = None
    backtest_verdict: str | None = None
    avg: float | None = None  # Avg@k of the last evaluation (from the tables)
    k: int | None = None
    n_items: int | None = None
    ci: tuple[float, float] | None = None  # item-bootstrap CI of avg
    decision: Decision | None = None
    gate_outcome: str | None = None
    outcome: str | None = None  # effective (a person's override wins)
    override: str = ""  # "by NAME: reason" when a person overrode the gate
    health: HealthReport | None = None
    best_so_far: str | None = None


@dataclass
class ReportData:
    store: Store
    state: LoopState
    rows: list[VersionRow] = field(default_factory=list)
    has_decisions: bool = False
    usage: list[AgentUsage] = field(default_factory=list)  # the ledger's agent_usage events, in order


def _describe(iv: Intervention) -> str:
    try:
        from . import interventions  # lazily: the report must work without the loop's modules

        return interventions.describe(iv)
    except Exception:  # noqa: BLE001 - any failure falls back to the raw change
        return json.dumps(iv.change.model_dump(mode="json"), sort_keys=True)


def _avg_with_ci(store: Store, version: str) -> tuple[float | None, int | None, int | None, tuple[float, float] | None]:
    val = store.rollouts(version, "val", columns=["version", "step", "item_id", "correct", "reward"])
    items = evidence.per_item_scores(val)
    if items.height == 0:
        return None, None, None, None
    last = items.filter(pl.col("step") == items["step"].max())
    scores = last["score"].drop_nulls().to_numpy()
    if scores.size == 0:
        return None, None, None, None
    avg = float(scores.mean())
    lo, hi = stats.paired_bootstrap_ci(scores, B=BOOTSTRAP_B, seed=BOOTSTRAP_SEED, level=CI_LEVEL)
    return avg, int(last["k"].min()), int(scores.size), (lo, hi)


def gather(store: Store) -> ReportData:
    events = store.ledger.events()
    state = derive(events, store.campaign.name)
    ivs = {iv.intervention_id: iv for iv in store.interventions()}
    bts: dict[str, BacktestReport] = {b.backtest_id: b for b in store.backtests()}
    decs = store.decisions()
    by_id = {d.decision_id: d for d in decs}
    data = ReportData(store=store, state=state, has_decisions=bool(decs) or any(
        lp.outcome is not None for lp in state.versions.values()),
        usage=[e for e in events if isinstance(e, AgentUsage)])
    specs: dict[str, VersionSpec] = {v: store.read_version(v) for v in store.versions()}
    names = sorted(set(specs) | {v for v, lp in state.versions.items() if lp.selected or lp.proposed}
                   | set(state.status.versions))
    for name in names:
        spec = specs.get(name)
        lp = state.versions.get(name)
        ledger_v = state.status.versions.get(name)
        row = VersionRow(version=name, parent=spec.parent if spec else (ledger_v.parent if ledger_v else None),
                         created=spec is not None)
        row.intervention_id = (spec.intervention if spec else None) or (lp.selected if lp else None)
        iv = ivs.get(row.intervention_id) if row.intervention_id else None
        if iv is not None:
            row.change = _describe(iv)
            row.hypothesis = iv.hypothesis.text()
            if row.parent is None:
                row.parent = iv.parent
        if row.intervention_id:
            bt_id = lp.selected_backtest if lp and lp.selected == row.intervention_id else None
            if bt_id is None and lp and row.intervention_id in lp.backtests:
                bt_id = lp.backtests[row.intervention_id][0]
            if bt_id is None:  # the loop's events may live under the child's name or be absent
                for lp2 in state.versions.values():
                    if row.intervention_id in lp2.backtests:
                        bt_id = lp2.backtests[row.intervention_id][0]
            if bt_id is None:
                cands = [b for b in bts.values() if b.intervention_id == row.intervention_id]
                bt_id = max(cands, key=lambda b: b.created_at).backtest_id if cands else None
            row.backtest_id = bt_id
            if bt_id in bts:
                row.backtest_verdict = bts[bt_id].verdict
            elif bt_id is not None:
                verdicts = [v for lp2 in state.versions.values() for (b, v) in lp2.backtests.values() if b == bt_id]
                row.backtest_verdict = verdicts[0] if verdicts else None
        if spec is not None:
            row.avg, row.k, row.n_items, row.ci = _avg_with_ci(store, name)
        if lp and lp.judged is not None:
            row.decision = by_id.get(lp.judged.decision_id)
            row.gate_outcome = lp.judged.outcome
        if row.decision is None:
            mine = [d for d in decs if d.candidate == name]
            row.decision = max(mine, key=lambda d: d.created_at) if mine else None
            if row.decision is not None and row.gate_outcome is None:
                row.gate_outcome = row.decision.outcome
        row.outcome = (lp.outcome if lp else None) or row.gate_outcome
        ans = lp.gates_answered.get("completion") if lp else None
        if ans is not None and ans.answer == "revise" and ans.outcome is not None:
            row.override = f"by {ans.actor}" + (f": {ans.reason}" if ans.reason else "")
        elif row.decision is not None and row.decision.decided_by != "gate":
            row.override = f"decided by {row.decision.decided_by}"
        if spec is not None:
            row.health = store.read_health_report(name)
        data.rows.append(row)
    _best_so_far(data)
    return data


def _best_so_far(data: ReportData) -> None:
    best: VersionRow | None = None
    for row in data.rows:
        if data.has_decisions:
            if row.outcome == "promote":
                best = row
        elif row.avg is not None and (best is None or row.avg > best.avg):  # type: ignore[operator]
            best = row
        row.best_so_far = best.version if best else None


# --------------------------------------------------------------------------- formatting helpers


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _avg_cell(row: VersionRow) -> str:
    if row.avg is None:
        return "—"
    ci = f" [{_f(row.ci[0])}, {_f(row.ci[1])}]" if row.ci else ""
    return f"{_f(row.avg)}{ci} (k={row.k}, n={row.n_items})"


def _delta_cell(row: VersionRow) -> str:
    d = row.decision
    if d is None or d.stats is None:
        return "—" if d is None or d.baseline is None else f"— (no paired stats vs {d.baseline})"
    s = d.stats
    p = f", p={s.p_wilcoxon:.3g}" if s.p_wilcoxon is not None else ""
    return (f"{s.mean_candidate:.3f} vs {s.mean_baseline:.3f} ({d.baseline or '-'}): Δ {s.mean_delta:+.3f} "
            f"[{s.ci_low:+.3f}, {s.ci_high:+.3f}] {s.ci_level:.0%} CI, n={s.n_items}{p}")


def _decision_cell(row: VersionRow) -> str:
    if row.outcome is None:
        return NONE_YET if row.created else "not created yet"
    text = row.outcome
    if row.override and row.gate_outcome and row.gate_outcome != row.outcome:
        text += f" (override {row.override}; gate said {row.gate_outcome})"
    elif row.override:
        text += f" ({row.override})"
    if row.decision is not None and row.decision.vetoes:
        text += f"; vetoes: {', '.join(row.decision.vetoes)}"
    return text


def _intervention_cell(row: VersionRow) -> str:
    if not row.intervention_id:
        return "— (base)" if row.parent is None else "— (fixed harness)"
    return f"{row.intervention_id}: {row.change}" if row.change else row.intervention_id


def _backtest_cell(row: VersionRow) -> str:
    if row.backtest_verdict:
        return f"{row.backtest_verdict} ({row.backtest_id})"
    return "—" if not row.intervention_id else NONE_YET


LINEAGE_HEADERS = ("version", "parent", "intervention", "hypothesis", "backtest",
                   f"Avg@k [{CI_LEVEL:.0%} CI]", "Δ vs baseline (gate)", "decision")


def lineage_rows(data: ReportData) -> list[tuple[str, ...]]:
    return [
        (r.version, r.parent or "—", _intervention_cell(r), r.hypothesis or "—", _backtest_cell(r), _avg_cell(r),
         _delta_cell(r), _decision_cell(r))
        for r in data.rows
    ]


def alert_lines(row: VersionRow) -> list[tuple[str, str]]:
    """(SEVERITY, text) per warning/critical finding, criticals first."""
    if row.health is None:
        return []
    order = {"critical": 0, "warning": 1}
    out = []
    for f in sorted(row.health.alerts, key=lambda f: order[f.severity]):
        bits = [f"rule {f.rule}" if f.rule else None, f.code, f.diagnostic]
        detail = ", ".join(b for b in bits if b)
        if f.metric is not None and f.value is not None:
            detail += f"; {f.metric} = {f.value:.3g}" + (f" (threshold {f.threshold:.3g})" if f.threshold is not None else "")
        if f.veto:
            detail += "; VETO"
        out.append((f.severity.upper(), f"{f.message} ({detail})"))
    return out


def curve_rows(data: ReportData) -> list[tuple[str, ...]]:
    by = {r.version: r for r in data.rows}
    out = []
    for r in data.rows:
        if not r.created:
            continue
        b = by.get(r.best_so_far) if r.best_so_far else None
        out.append((r.version, r.best_so_far or "—", _f(b.avg if b else None),
                    f"[{_f(b.ci[0])}, {_f(b.ci[1])}]" if b and b.ci else "—", _f(r.avg)))
    return out


USAGE_HEADERS = ("version", "model", "calls", "input tokens", "output tokens", "cache write tokens",
                 "cache read tokens", "cost (USD)", "phases")


def usage_rows(data: ReportData) -> list[tuple[str, ...]]:
    """One row per version with agent usage, then the campaign total (empty when there was none)."""
    by: dict[str, list[AgentUsage]] = {}
    for e in data.usage:
        by.setdefault(e.version, []).append(e)

    def row(label: str, evs: list[AgentUsage], phases: str) -> tuple[str, ...]:
        models = ", ".join(dict.fromkeys(e.model for e in evs))
        return (label, models, str(sum(e.calls for e in evs)), f"{sum(e.input_tokens for e in evs):,}",
                f"{sum(e.output_tokens for e in evs):,}", f"{sum(e.cache_creation_tokens for e in evs):,}",
                f"{sum(e.cache_read_tokens for e in evs):,}", f"{sum(e.cost_usd for e in evs):.4f}", phases)

    out = [row(v, evs, "; ".join(f"{e.phase} {e.outcome}" for e in evs)) for v, evs in sorted(by.items())]
    if out:
        n_fb = sum(e.outcome != "answered" for e in data.usage)
        out.append(row("total", data.usage, f"{len(data.usage)} phase(s), {n_fb} not answered by the model"))
    return out


def _usage_note(data: ReportData) -> str:
    c = data.store.campaign
    if c.agent != "claude":
        return f"Agent usage: {NONE_YET} (the {c.agent} agent makes no API calls)."
    p = c.claude.prices
    return (f"Budget ${c.claude.budget_usd:.2f} per campaign; prices per million tokens: input ${p.input_per_mtok:g}, "
            f"output ${p.output_per_mtok:g}, cache write ${p.cache_write_per_mtok:g}, cache read "
            f"${p.cache_read_per_mtok:g}.")


_CI_NOTE = (f"Avg@k CIs: item bootstrap (B={BOOTSTRAP_B}, seed {BOOTSTRAP_SEED}) over the last evaluation; "
            "Δ CIs: the promotion gate's GateStats.")
CURVE_HEADERS = ("after version", "best so far", "its Avg@k", f"{CI_LEVEL:.0%} CI", "this version's Avg@k")


# --------------------------------------------------------------------------- markdown


def _md_cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(headers, rows) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return out


def _header_pairs(data: ReportData) -> list[tuple[str, str]]:
    c = data.store.campaign
    return [
        ("policy", c.policy),
        ("domain", f"{c.data.domain} (tiers {list(c.data.tiers)})"),
        ("preset", c.preset or "—"),
        ("created", c.created_at),
        ("seed", str(c.seed)),
        ("agent", f"claude ({c.claude.model}, budget ${c.claude.budget_usd:.2f})" if c.agent == "claude" else c.agent),
        ("human gates", ", ".join(c.gates) or "none"),
        ("warm start", "yes (children confounded)" if c.warm_start else "no"),
        ("versions", str(sum(1 for r in data.rows if r.created))),
        ("state", "aborted at a gate" if data.state.aborted else "active"),
    ]


def _best_rule(data: ReportData) -> str:
    if data.has_decisions:
        return "best so far = the latest version the gate (or a person) promoted"
    return "no gate decisions yet: best so far = the highest Avg@k so far"


def campaign_report(store: Store) -> str:
    """The campaign report as Markdown."""
    return _markdown(gather(store))


def _markdown(data: ReportData) -> str:
    c = data.store.campaign
    lines = [f"# Campaign {c.name}", ""]
    lines += [f"- **{k}**: {v}" for k, v in _header_pairs(data)]
    lines += ["", "## Lineage", ""]
    if data.rows:
        lines += _md_table(LINEAGE_HEADERS, lineage_rows(data))
        lines += ["", _CI_NOTE]
    else:
        lines.append(f"Versions: {NONE_YET}.")
    lines += ["", "## Health alerts", ""]
    lines += _md_alerts(data)
    lines += ["", "## Best so far", "", _best_rule(data) + ".", ""]
    rows = curve_rows(data)
    lines += _md_table(CURVE_HEADERS, rows) if rows else [f"Evaluations: {NONE_YET}."]
    lines += ["", "## Agent usage", ""]
    usage = usage_rows(data)
    if usage:
        lines += _md_table(USAGE_HEADERS, usage)
        lines += ["", _usage_note(data)]
    else:
        lines.append(_usage_note(data) if c.agent != "claude" else f"Agent usage: {NONE_YET}.")
    return "\n".join(lines) + "\n"


def _md_alerts(data: ReportData) -> list[str]:
    created = [r for r in data.rows if r.created]
    if not any(r.health is not None for r in created):
        return [f"Health reports: {NONE_YET}."]
    out = []
    for r in created:
        if r.health is None:
            out.append(f"- **{r.version}**: health report {NONE_YET}")
            continue
        alerts = alert_lines(r)
        if not alerts:
            out.append(f"- **{r.version}**: no alerts ({len(r.health.findings)} finding(s), none warning or critical)")
            continue
        out.append(f"- **{r.version}**:")
        out += [f"  - **{sev}** {_md_cell(text)}" for sev, text in alerts]
    return out


# --------------------------------------------------------------------------- SVG + HTML


def best_so_far_svg(data: ReportData, width: int = 640, height: int = 300) -> str:
    """Inline SVG: best-so-far Avg@k per version (line, CI error bars); each version's own Avg@k in grey."""
    by = {r.version: r for r in data.rows}
    rows = [r for r in data.rows if r.created]
    ml, mr, mt, mb = 50, 20, 30, 40
    pw, ph = width - ml - mr, height - mt - mb
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" role="img" aria-label="best-so-far Avg@k per version" '
              'font-family="sans-serif" font-size="11">'),
             f'<text x="{ml}" y="18" font-size="13">Best-so-far Avg@k ({CI_LEVEL:.0%} CI)</text>']

    def y(v: float) -> float:
        return mt + ph * (1.0 - min(1.0, max(0.0, v)))

    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{ml - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:.2f}</text>')
    if not rows or all(r.avg is None for r in rows):
        parts.append(f'<text x="{ml + pw / 2}" y="{mt + ph / 2}" text-anchor="middle" fill="#888">'
                     f'no held-out evaluations yet</text></svg>')
        return "".join(parts)
    pad = 20  # keep the end markers off the axis
    step = (pw - 2 * pad) / (len(rows) - 1) if len(rows) > 1 else 0
    xs = {r.version: ml + (pad + i * step if len(rows) > 1 else pw / 2) for i, r in enumerate(rows)}
    grid, parts = parts, []
    pts = []
    for r in rows:
        x = xs[r.version]
        parts.append(f'<text x="{x:.1f}" y="{mt + ph + 16}" text-anchor="middle">{html.escape(r.version)}</text>')
        if r.avg is not None:
            parts.append(f'<circle cx="{x:.1f}" cy="{y(r.avg):.1f}" r="3" fill="#bbb">'
                         f'<title>{html.escape(r.version)}: Avg@k {r.avg:.3f}</title></circle>')
        b = by.get(r.best_so_far) if r.best_so_far else None
        if b is None or b.avg is None:
            continue
        pts.append((x, y(b.avg)))
        if b.ci:
            y0, y1 = y(b.ci[0]), y(b.ci[1])
            parts.append(f'<line class="errbar" x1="{x:.1f}" x2="{x:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" '
                         'stroke="#1f5fbf"/>')
            for yy in (y0, y1):
                parts.append(f'<line x1="{x - 4:.1f}" x2="{x + 4:.1f}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#1f5fbf"/>')
        ci = f" [{b.ci[0]:.3f}, {b.ci[1]:.3f}]" if b.ci else ""
        parts.append(f'<circle cx="{x:.1f}" cy="{y(b.avg):.1f}" r="4" fill="#1f5fbf">'
                     f'<title>after {html.escape(r.version)}: best {html.escape(b.version)} '
                     f'Avg@k {b.avg:.3f}{ci}</title></circle>')
    if len(pts) > 1:  # under the markers
        poly = " ".join(f"{x:.1f},{yy:.1f}" for x, yy in pts)
        grid.append(f'<polyline points="{poly}" fill="none" stroke="#1f5fbf" stroke-width="2"/>')
    parts = grid + parts
    parts.append(f'<text x="{ml + pw}" y="{height - 6}" text-anchor="end" fill="#666">blue: best so far; '
                 'grey: each version</text></svg>')
    return "".join(parts)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3} dt{font-weight:bold;float:left;clear:left;width:9em} dd{margin-left:10em}
.CRITICAL{color:#b00020;font-weight:bold} .WARNING{color:#a86400;font-weight:bold}
.note{color:#666;font-size:12px}
"""


def _html_table(headers, rows) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def campaign_report_html(store: Store) -> str:
    return _html(gather(store))


def _html(data: ReportData) -> str:
    c = data.store.campaign
    e = html.escape
    out = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
           f"<title>Campaign {e(c.name)}</title><style>{_CSS}</style></head><body>",
           f"<h1>Campaign {e(c.name)}</h1><dl>"]
    out += [f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in _header_pairs(data)]
    out.append("</dl><h2>Lineage</h2>")
    if data.rows:
        out.append(_html_table(LINEAGE_HEADERS, lineage_rows(data)))
        out.append(f'<p class="note">{html.escape(_CI_NOTE)}</p>')
    else:
        out.append(f"<p>Versions: {NONE_YET}.</p>")
    out.append("<h2>Health alerts</h2>")
    created = [r for r in data.rows if r.created]
    if not any(r.health is not None for r in created):
        out.append(f"<p>Health reports: {NONE_YET}.</p>")
    else:
        out.append("<ul>")
        for r in created:
            if r.health is None:
                out.append(f"<li><b>{e(r.version)}</b>: health report {NONE_YET}</li>")
                continue
            alerts = alert_lines(r)
            if not alerts:
                out.append(f"<li><b>{e(r.version)}</b>: no alerts</li>")
                continue
            items = "".join(f'<li><span class="{sev}">{sev}</span> {e(text)}</li>' for sev, text in alerts)
            out.append(f"<li><b>{e(r.version)}</b><ul>{items}</ul></li>")
        out.append("</ul>")
    out.append(f"<h2>Best so far</h2><p>{e(_best_rule(data))}.</p>")
    out.append(best_so_far_svg(data))
    rows = curve_rows(data)
    out.append(_html_table(CURVE_HEADERS, rows) if rows else f"<p>Evaluations: {NONE_YET}.</p>")
    out.append("<h2>Agent usage</h2>")
    usage = usage_rows(data)
    if usage:
        out.append(_html_table(USAGE_HEADERS, usage))
        out.append(f'<p class="note">{e(_usage_note(data))}</p>')
    else:
        out.append(f"<p>{e(_usage_note(data) if c.agent != 'claude' else f'Agent usage: {NONE_YET}.')}</p>")
    out.append("</body></html>\n")
    return "".join(out)


def write_report(store: Store, md_path: str | Path, html_path: str | Path | None = None) -> tuple[Path, Path | None]:
    """Write the Markdown report (and the HTML page when `html_path` is given). Returns the paths."""
    data = gather(store)
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(_markdown(data), encoding="utf-8")
    out_html = None
    if html_path is not None:
        out_html = Path(html_path)
        out_html.parent.mkdir(parents=True, exist_ok=True)
        out_html.write_text(_html(data), encoding="utf-8")
    return md_path, out_html
