"""BacktestCompare: candidate interventions side by side, with their counterfactual backtests and
reward distributions before/after (recomputed with the same harness code the backtest uses)."""
# ruff: noqa: C408  (plotly layout keyword dicts read better as dict(...))
from __future__ import annotations

import contextlib
from typing import ClassVar

import ipywidgets as ipw
import numpy as np
import traitlets as t

from evotrainer import interventions

from ._base import EvoWidget, clean, esm

N_BINS = 20


class BacktestCards(EvoWidget):
    """The side-by-side cards. Root element: `.evo-backtest-compare`; one `.evo-candidate` per backtest.

    Synced traits: `candidates` (one dict per backtest), `histograms` (bin edges and before/after
    counts per backtest id), `message`. Button: data-action="refresh"."""

    _esm = esm("backtests.js")
    _ACTIONS: ClassVar[dict[str, str]] = {"refresh": "refresh"}

    candidates = t.List().tag(sync=True)
    histograms = t.Dict().tag(sync=True)

    def __init__(self, owner, **kwargs):
        super().__init__(owner.lab, **kwargs)
        self._owner = owner

    def refresh(self) -> None:
        self._owner.refresh()


class BacktestCompare(ipw.VBox):
    """Cards (`.cards`, an anywidget) above one plotly FigureWidget per candidate (`.figures`).

    `backtest_ids=None`: the backtests of the newest version that has proposals (all stored ones when
    no proposal cites any). Properties `candidates` and `histograms` are the numbers shown."""

    def __init__(self, lab, backtest_ids=None, distributions: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.lab = lab
        self.backtest_ids = list(backtest_ids) if backtest_ids is not None else None
        self.distributions = distributions
        self._dist_cache: dict[str, dict] = {}
        self.cards = BacktestCards(self)
        self.plots = ipw.HBox(layout=ipw.Layout(flex_flow="row wrap"))
        self.plots.add_class("evo-backtest-plots")
        self.add_class("evo-backtest-compare-box")
        self.children = [self.cards, self.plots]
        self.figures: dict = {}
        self.refresh()

    @property
    def candidates(self) -> list[dict]:
        return self.cards.candidates

    @property
    def histograms(self) -> dict:
        return self.cards.histograms

    def _selected_reports(self):
        store = self.lab.store
        reports = {b.backtest_id: b for b in store.backtests()}
        meta: dict[str, dict] = {}
        state = self.lab.loop_state()
        for v, lp in sorted(state.versions.items()):
            for rank, iv_id in enumerate(lp.proposed):
                if iv_id in lp.backtests:
                    meta[lp.backtests[iv_id][0]] = {"version": v, "rank": rank, "selected": lp.selected == iv_id}
        if self.backtest_ids is not None:
            missing = [b for b in self.backtest_ids if b not in reports]
            if missing:
                raise ValueError(f"no backtest(s) {missing} in this campaign")
            ids = self.backtest_ids
        else:
            with_bt = [v for v, lp in sorted(state.versions.items()) if lp.backtests]
            if with_bt:
                lp = state.versions[with_bt[-1]]
                ids = [lp.backtests[i][0] for i in lp.proposed if i in lp.backtests]
            else:
                ids = sorted(reports)
        return [(reports[i], meta.get(i, {})) for i in ids]

    def refresh(self) -> None:
        store = self.lab.store
        cands, hists = [], {}
        for bt, meta in self._selected_reports():
            iv = None
            if bt.intervention_id:
                with contextlib.suppress(Exception):
                    iv = store.read_intervention(bt.intervention_id)
            cands.append({
                "backtest_id": bt.backtest_id, "intervention_id": bt.intervention_id,
                "version": meta.get("version"), "rank": meta.get("rank"), "selected": meta.get("selected", False),
                "parent": iv.parent if iv else (bt.versions[0] if bt.versions else None),
                "versions": list(bt.versions), "steps": list(bt.steps) if bt.steps else None,
                "factor": iv.change.factor if iv else None,
                "change": interventions.describe(iv) if iv else None,
                "hypothesis": iv.hypothesis.text() if iv else None,
                "target_metric": iv.target_metric if iv else None,
                "success_criterion": iv.success_criterion.text() if iv else None,
                "rollback_plan": iv.rollback_plan if iv else None,
                "evidence": list(iv.evidence) if iv else [],
                "dgr_before": bt.before.get("dgr"), "dgr_after": bt.after.get("dgr"),
                "reward_mean_before": bt.before.get("reward_mean"), "reward_mean_after": bt.after.get("reward_mean"),
                "reward_spread_before": bt.before.get("reward_spread"),
                "reward_spread_after": bt.after.get("reward_spread"),
                "groups_rescued": bt.groups_rescued, "groups_killed": bt.groups_killed,
                "advantage_sign_flips": bt.advantage_sign_flips, "order_violations": bt.order_violations,
                "correct_wrongly_filtered": bt.correct_wrongly_filtered,
                "effective_data_before": bt.effective_data_before, "effective_data_after": bt.effective_data_after,
                "n_rollouts": bt.n_rollouts, "n_groups": bt.n_groups,
                "verdict": bt.verdict, "reasons": list(bt.reasons), "counterfactual_note": bt.counterfactual_note,
                "before": dict(bt.before), "after": dict(bt.after),
            })
            if self.distributions and iv is not None:
                h = self._distribution(bt, iv)
                if h is not None:
                    hists[bt.backtest_id] = h
        self.cards.candidates = clean(cands)
        self.cards.histograms = clean(hists)
        self._build_figures()
        n = len(cands)
        self.cards._say(f"{n} candidate{'s' if n != 1 else ''}" if n else "no backtests yet", "info")

    def _distribution(self, bt, iv) -> dict | None:
        """Reward histograms of the parent's stored train rollouts under the parent's harness (before)
        and the candidate's (after), re-scored with the backtest's own code; cached per backtest."""
        if bt.backtest_id in self._dist_cache:
            return self._dist_cache[bt.backtest_id]
        try:
            from evotrainer import backtest as bt_mod  # uses its (private) re-scoring helpers; see report

            store = self.lab.store
            parent = store.read_version(iv.parent)
            cand, train = interventions.apply(iv, parent.harness, parent.train)
            befores, afters = [], []
            for v in bt.versions:
                res = bt_mod._rescore(store, v, cand, parent.harness, bt.steps, train.max_completion_length)
                if res is None:
                    continue
                b, a = res[0], res[1]
                dropped, _ = bt_mod._data_selection_drop(store, cand, parent.harness, list(bt.versions))
                if dropped:
                    import polars as pl

                    a = a.filter(~pl.col("item_id").is_in(sorted(dropped)))
                befores.append(b["reward"].cast(float).to_numpy())
                afters.append(a["reward"].cast(float).to_numpy())
            if not befores:
                return None
            before = np.concatenate(befores)
            after = np.concatenate(afters) if afters else np.array([])
        except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down
            self._dist_cache[bt.backtest_id] = {"error": str(exc)}
            return self._dist_cache[bt.backtest_id]
        out = histogram(before, after)
        self._dist_cache[bt.backtest_id] = out
        return out

    def _build_figures(self) -> None:
        try:
            import plotly.graph_objects as go
        except Exception:  # noqa: BLE001 - a view must never take the kernel down
            self.figures = {}
            self.plots.children = []
            return
        figs = {}
        for c in self.cards.candidates:
            h = self.cards.histograms.get(c["backtest_id"])
            if not h or "edges" not in h:
                continue
            centers = h["centers"]
            fig = go.FigureWidget()
            fig.add_bar(x=centers, y=h["before"], name="before", opacity=0.6, width=h["width"])
            fig.add_bar(x=centers, y=h["after"], name="after", opacity=0.6, width=h["width"])
            fig.update_layout(barmode="overlay", height=220, width=340, margin=dict(l=30, r=10, t=30, b=30),
                              title=dict(text=f"{c['intervention_id'] or c['backtest_id']}: {c['verdict']}",
                                         font=dict(size=11)), xaxis_title="reward", legend=dict(orientation="h"))
            figs[c["backtest_id"]] = fig
        self.figures = figs
        self.plots.children = list(figs.values())


def histogram(before: np.ndarray, after: np.ndarray, bins: int = N_BINS) -> dict:
    """Common bins for both; discrete rewards (few distinct values) get one bin per value."""
    before = before[np.isfinite(before)]
    after = after[np.isfinite(after)]
    both = np.concatenate([before, after])
    if both.size == 0:
        return {"edges": [], "centers": [], "width": 0, "before": [], "after": [], "n_before": 0, "n_after": 0}
    values = np.unique(both)
    if values.size <= bins:
        gaps = np.diff(values)
        width = float(gaps.min()) * 0.8 if gaps.size else 0.8
        edges = np.concatenate([values - width / 2, [values[-1] + width / 2]])
        centers = values
        before_c = [int((before == v).sum()) for v in values]
        after_c = [int((after == v).sum()) for v in values]
        edges_out = edges.tolist()
    else:
        edges = np.linspace(float(values[0]), float(values[-1]), bins + 1)
        centers = (edges[:-1] + edges[1:]) / 2
        width = float(edges[1] - edges[0]) * 0.95
        before_c = np.histogram(before, edges)[0].astype(int).tolist()
        after_c = np.histogram(after, edges)[0].astype(int).tolist()
        edges_out = edges.tolist()
    return {"edges": edges_out, "centers": [float(c) for c in centers], "width": width, "before": before_c,
            "after": after_c, "n_before": int(before.size), "n_after": int(after.size),
            "mean_before": float(before.mean()) if before.size else None,
            "mean_after": float(after.mean()) if after.size else None}
