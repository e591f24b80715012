"""The health report: every registered diagnostic (built-ins, rules, any registered later) over one version.

    report = health_report_for(store, "v003")     # Evidence from the store: v003 + its ancestors
    print(format_health(report))                  # alerts first
    report.model_dump_json()                      # JSON (schema.HealthReport)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..schema import HealthReport
from ..store import Store
from . import registry
from .registry import Evidence

_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def health_report(ev: Evidence, version: str | None = None, *, names: Sequence[str] | None = None) -> HealthReport:
    """Run all registered diagnostics (or `names`) over `ev`, diagnosing `version` (default: ev.version).

    Metrics are flattened to "<diagnostic>/<metric>", per-step series likewise (steps as strings, as JSON
    keys). A diagnostic that raises becomes a `diagnostic_error` finding; the report is always produced.
    """
    ev.check_thresholds()
    if version is not None:
        ev = ev.upto(version)
    metrics: dict[str, float | None] = {}
    per_step: dict[str, dict[str, float | None]] = {}
    findings = []
    for name in (names if names is not None else registry.known()):
        res = registry.run(name, ev)
        for k, v in res.metrics.items():
            metrics[f"{name}/{k}"] = registry.fnum(v)
        for k, series in res.per_step.items():
            per_step[f"{name}/{k}"] = {str(s): registry.fnum(v) for s, v in sorted(series.items())}
        findings.extend(res.findings)
    findings.sort(key=lambda f: (_SEVERITY_ORDER[f.severity], f.diagnostic, f.code))
    return HealthReport(version=ev.version, metrics=metrics, per_step=per_step, findings=tuple(findings))


def lineage(store: Store, version: str, history: int) -> list[str]:
    """`version` and up to `history` ancestors (parent chain), oldest first.

    Trends follow the lineage, not the index order: a child branched from the best version is compared
    with what it was built on, not with a rejected sibling.
    """
    chain = [version]
    known = set(store.versions())
    while len(chain) <= history:
        parent = store.read_version(chain[-1]).parent
        if parent is None or parent not in known or parent in chain:
            break
        chain.append(parent)
    return chain[::-1]


def evidence_for(store: Store, version: str, *, history: int = 3,
                 thresholds: Mapping[str, float] | None = None) -> Evidence:
    versions = lineage(store, version, history)
    return Evidence(rollouts=store.rollouts(versions), metrics=store.metrics(versions), versions=tuple(versions),
                    thresholds=dict(thresholds or {}))


def health_report_for(store: Store, version: str, *, history: int = 3,
                      thresholds: Mapping[str, float] | None = None, write: bool = False,
                      user: bool = True) -> HealthReport:
    """Health report of `version` from the store, with up to `history` ancestors as trend evidence.

    With `user` (default), the campaign's VALIDATED user diagnostics (the latest validated revision of
    each name, diagnostics/validation.py) also run, each in the sandbox over the same evidence, and
    their metrics ("user:<name>/<metric>") and findings are merged: a user finding with veto=True then
    vetoes at the gate like a built-in one. A user diagnostic that fails (timeout, memory, exception,
    bad shape, a write the sandbox refused) becomes a `diagnostic_error` warning: never a veto, never a
    crash. Unvalidated revisions never run here."""
    report = health_report(evidence_for(store, version, history=history, thresholds=thresholds))
    if user:
        from .validation import run_validated

        metrics, findings = run_validated(store, version, history=history)
        if metrics or findings:
            merged = sorted([*report.findings, *findings],
                            key=lambda f: (_SEVERITY_ORDER[f.severity], f.diagnostic, f.code))
            report = report.model_copy(update={"metrics": {**report.metrics, **metrics},
                                               "findings": tuple(merged)})
    if write:
        store.write_health_report(report)
    return report


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}"


def format_health(report: HealthReport, *, max_metrics: int | None = None) -> str:
    """Plain text: a summary line, alerts (CRITICAL, then WARNING), info findings, then the metrics."""
    n = {s: sum(f.severity == s for f in report.findings) for s in ("critical", "warning", "info")}
    lines = [f"Health report {report.version}  ({n['critical']} critical, {n['warning']} warning, {n['info']} info)"]
    alerts = [f for f in report.findings if f.severity != "info"]
    infos = [f for f in report.findings if f.severity == "info"]
    for title, group in (("Alerts", alerts), ("Info", infos)):
        if not group:
            lines.append(f"{title}: none")
            continue
        lines.append(f"{title}:")
        for f in group:
            tag = f.severity.upper() + (" VETO" if f.veto else "")
            where = f"  [{', '.join(f.versions)}" + (f" steps {f.steps[0]}-{f.steps[1]}" if f.steps else "") + "]"
            lines.append(f"  {tag:<13} {f.diagnostic}: {f.message}{where}  ({f.finding_id})")
            if f.rollout_uids:
                more = len(f.rollout_uids) - 3
                lines.append(f"                e.g. {', '.join(f.rollout_uids[:3])}" + (f" (+{more} more)" if more > 0 else ""))
    lines.append("Metrics:")
    items = list(report.metrics.items())
    shown = items if max_metrics is None else items[:max_metrics]
    width = max((len(k) for k, _ in shown), default=0)
    for k, v in shown:
        lines.append(f"  {k:<{width}}  {_fmt(v)}")
    if len(shown) < len(items):
        lines.append(f"  ... {len(items) - len(shown)} more")
    return "\n".join(lines)
