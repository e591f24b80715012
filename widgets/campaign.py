"""CampaignView: lineage of versions coloured by decision, best-so-far Avg@k with CI bars,
the version in flight, health alerts, and pause/resume/stop."""
# ruff: noqa: C408  (plotly layout keyword dicts read better as dict(...))
from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar

import traitlets as t

from evotrainer import interventions
from evotrainer.schema import is_probe, version_index

from ._base import EvoWidget, clean, esm, running_loop

OUTCOMES = ("promote", "reject", "inconclusive", "vetoed")


class CampaignView(EvoWidget):
    """Live campaign overview. Root element: `.evo-campaign-view`.

    Synced traits: `versions` (lineage rows), `curve` (best-so-far points), `curve_domain`,
    `live` (version in flight), `alerts`, `gate`, `running`, `paused`, `refresh_s`, `last_refresh`,
    `message`, `message_kind`. Buttons: data-action pause | resume | stop | refresh.
    """

    _esm = esm("campaign.js")
    _ACTIONS: ClassVar[dict[str, str]] = {"pause": "pause", "resume": "resume", "stop": "stop", "refresh": "refresh"}

    campaign = t.Unicode("").tag(sync=True)
    versions = t.List().tag(sync=True)
    curve = t.List().tag(sync=True)
    curve_domain = t.List([0.0, 1.0]).tag(sync=True)
    live = t.Dict().tag(sync=True)
    alerts = t.List().tag(sync=True)
    gate = t.Dict(allow_none=True, default_value=None).tag(sync=True)
    running = t.Bool(False).tag(sync=True)
    paused = t.Bool(False).tag(sync=True)
    aborted = t.Bool(False).tag(sync=True)
    refresh_s = t.Float(2.0).tag(sync=True)
    auto_refresh = t.Bool(False).tag(sync=True)
    last_refresh = t.Unicode("").tag(sync=True)

    def __init__(self, lab, refresh_s: float = 2.0, **kwargs):
        super().__init__(lab, refresh_s=refresh_s, **kwargs)
        self._health_cache: dict[str, tuple[float, object]] = {}
        self._task: asyncio.Task | None = None
        self.campaign = lab.store.campaign.name
        self.refresh()
        if refresh_s and refresh_s > 0:
            self.start_auto_refresh()

    # ---- refresh (all from the store)

    def _health(self, version: str):
        path = self.lab.store.version_dir(version) / "diagnostics" / "health.json"
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return None
        hit = self._health_cache.get(version)
        if hit and hit[0] == mtime:
            return hit[1]
        report = self.lab.store.read_health_report(version)
        self._health_cache[version] = (mtime, report)
        return report

    def refresh(self) -> None:
        """Re-read the ledger, documents and health reports and update every trait."""
        lab, store = self.lab, self.lab.store
        state = lab.loop_state()
        status = state.status
        decisions = {d.decision_id: d for d in store.decisions()}
        names = sorted(set(store.versions()) | set(status.versions), key=lambda v: (version_index(v), v))
        rows: dict[str, dict] = {}
        for v in names:
            vs = status.versions.get(v)
            try:
                spec = store.read_version(v)
            except Exception:  # noqa: BLE001 - a view must never take the kernel down
                spec = None
            lp = state.versions.get(v)
            base = v[:4]
            probe = is_probe(v)
            judged = lp.judged if lp else None
            decision = decisions.get(judged.decision_id) if judged else None
            outcome = lp.outcome if lp else None
            override = lp.gates_answered.get("completion") if lp else None
            decided_by = (override.actor if override is not None and override.answer == "revise" and override.outcome
                          else (decision.decided_by if decision else None))
            vstate = vs.state.value if vs else "created"
            if outcome in OUTCOMES:
                colour = outcome
            elif vstate == "failed":
                colour = "failed"
            elif probe:
                colour = "probe"
            else:
                colour = "pending"
            iv_id = spec.intervention if spec else None
            iv_text = None
            if iv_id:
                with contextlib.suppress(Exception):
                    iv_text = interventions.describe(store.read_intervention(iv_id))
            winner = None
            if probe and base in state.versions and state.versions[base].probes is not None:
                winner = state.versions[base].probes.winner == iv_id
            health = self._health(v)
            crit = [f for f in health.findings if f.severity == "critical"] if health else []
            warn = [f for f in health.findings if f.severity == "warning"] if health else []
            last_eval = max(vs.evals) if vs and vs.evals else None
            k, n_items, avg = vs.evals[last_eval] if last_eval is not None else (None, None, None)
            rows[v] = {
                "version": v, "parent": spec.parent if spec else (vs.parent if vs else None),
                "role": spec.role if spec else ("probe" if probe else "full"), "probe": probe,
                "probe_winner": winner, "state": vstate, "outcome": outcome, "colour": colour,
                "decided_by": decided_by, "decision_reason": decision.reason if decision else None,
                "steps": vs.last_step if vs else 0, "max_steps": spec.train.max_steps if spec else None,
                "avg_at_k": avg, "k": k, "n_items": n_items,
                "intervention_id": iv_id, "intervention": iv_text,
                "n_critical": len(crit), "n_warning": len(warn), "vetoes": list(decision.vetoes) if decision else [],
                "error": vs.error if vs else None, "best": False, "depth": 0,
            }
        best = state.best()
        if best in rows:
            rows[best]["best"] = True
        self.versions = clean(_tree_order(rows))
        self.curve, self.curve_domain = _curve(rows, state, decisions)
        self.alerts = clean([
            {"version": v, "severity": f.severity, "code": f.code, "message": f.message,
             "finding_id": f.finding_id, "veto": f.veto, "n_examples": len(f.rollout_uids)}
            for v in names if (h := self._health(v)) is not None
            for f in sorted(h.alerts, key=lambda f: (f.severity != "critical", f.code))
        ])
        live = lab.live()
        if live.get("version"):
            live["progress"] = (live["step"] / live["max_steps"]) if live.get("max_steps") else None
        self.live = clean(live)
        gate = lab.gate
        self.gate = None if gate is None else {"version": gate.version, "gate": gate.gate, "subject": list(gate.subject)}
        self.running = lab.running
        self.paused = store.pause_requested()
        self.aborted = state.aborted
        import datetime as _dt
        self.last_refresh = _dt.datetime.now().strftime("%H:%M:%S")

    # ---- buttons

    def pause(self) -> None:
        self.lab.pause()
        self._say("pause requested: the loop stops after the current phase", "ok")
        self.refresh()

    def resume(self) -> None:
        self.lab.resume()
        self._say("resumed", "ok")
        self.refresh()

    def stop(self, timeout: float = 10.0) -> None:
        self.lab.stop(timeout=timeout)
        self._say("stopped; resume continues from the last checkpoint", "ok")
        self.refresh()

    # ---- timer (an asyncio task on the kernel's loop; never a thread)

    def start_auto_refresh(self) -> bool:
        """Refresh every `refresh_s` seconds on the running asyncio loop; False where there is none."""
        loop = running_loop()
        if loop is None:
            self.auto_refresh = False
            return False
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._tick())
        self.auto_refresh = True
        return True

    def stop_auto_refresh(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.auto_refresh = False

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, float(self.refresh_s)))
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down  # keep ticking: a half-written store is read again next tick
                self._say(f"refresh failed: {exc}", "error")

    def close(self) -> None:
        self.stop_auto_refresh()
        super().close()

    # ---- a plotly view of the same numbers (for a cell)

    def figure(self):
        """The best-so-far curve as a plotly FigureWidget (same numbers as `curve`)."""
        import plotly.graph_objects as go

        pts = self.curve
        fig = go.FigureWidget()
        fig.add_scatter(x=[p["version"] for p in pts], y=[p["avg_at_k"] for p in pts], mode="markers",
                        name="Avg@k", error_y=dict(type="data", symmetric=False,
                                                   array=[p["err_plus"] for p in pts],
                                                   arrayminus=[p["err_minus"] for p in pts]),
                        marker=dict(color=[_COLOURS.get(p["colour"], "#888") for p in pts]))
        fig.add_scatter(x=[p["version"] for p in pts], y=[p["best_so_far"] for p in pts], mode="lines",
                        line_shape="hv", name="best so far")
        fig.update_layout(height=300, margin=dict(l=40, r=10, t=10, b=30), yaxis_title="Avg@k")
        return fig


_COLOURS = {"promote": "#2e7d32", "reject": "#c62828", "inconclusive": "#f9a825", "vetoed": "#6a1b9a",
            "pending": "#9e9e9e", "probe": "#1565c0", "failed": "#000000"}


def _tree_order(rows: dict[str, dict]) -> list[dict]:
    """Depth-first lineage order with each row's depth (children after their parent)."""
    children: dict[str | None, list[str]] = {}
    for v, r in rows.items():
        parent = r["parent"] if r["parent"] in rows else None
        children.setdefault(parent, []).append(v)
    out: list[dict] = []

    def walk(v: str, depth: int) -> None:
        rows[v]["depth"] = depth
        out.append(rows[v])
        for c in sorted(children.get(v, []), key=lambda n: (version_index(n), n)):
            walk(c, depth + 1)

    for root in sorted(children.get(None, []), key=lambda n: (version_index(n), n)):
        walk(root, 0)
    return out


def _curve(rows: dict[str, dict], state, decisions) -> tuple[list, list]:
    """Per full version with an Avg@k: its value, CI bar (baseline mean + the paired CI of the
    delta, where a decision has stats), and the best-so-far value (the latest promoted version's)."""
    pts = []
    best_val = None
    for v in sorted(rows, key=lambda n: (version_index(n), n)):
        r = rows[v]
        if r["probe"] or r["avg_at_k"] is None:
            continue
        lp = state.versions.get(v)
        dec = decisions.get(lp.judged.decision_id) if lp and lp.judged else None
        lo = hi = None
        if dec is not None and dec.stats is not None:
            lo = dec.stats.mean_baseline + dec.stats.ci_low
            hi = dec.stats.mean_baseline + dec.stats.ci_high
        if r["outcome"] == "promote":
            best_val = r["avg_at_k"]
        avg = r["avg_at_k"]
        pts.append({"version": v, "avg_at_k": avg, "ci_low": lo, "ci_high": hi,
                    "err_minus": (avg - lo) if lo is not None else 0.0, "err_plus": (hi - avg) if hi is not None else 0.0,
                    "best_so_far": best_val, "colour": r["colour"], "outcome": r["outcome"]})
    ys = [y for p in pts for y in (p["avg_at_k"], p["ci_low"], p["ci_high"], p["best_so_far"]) if y is not None]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    lo, hi = min(lo, 0.0), max(hi, lo + 0.05)
    pad = (hi - lo) * 0.05
    return clean(pts), clean([lo - (pad if lo < 0 else 0.0), hi + pad])
