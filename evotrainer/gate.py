"""The promotion gate: is a candidate version better than the best so far on the SAME held-out items?

`compare` pairs the two versions' val rollouts by `item_id` (each version at its own final
evaluation step), scores each item as the share of its k samples judged correct, and summarises
the per-item deltas (candidate - baseline) with a paired percentile bootstrap CI, a Wilcoxon
signed-rank test, an exact McNemar test when both sides sampled once per item, and a paired
Cohen's d (`evotrainer.stats`).

`decide` turns that into a `schema.Decision`:
- validity vetoes (findings with `veto=True`) -> "vetoed", whatever the score;
- no baseline (the first version) -> "promote", with no stats;
- CI low > rule.promote_if_ci_low_above -> "promote";
- CI high < rule.reject_if_ci_high_below -> "reject";
- otherwise "inconclusive": keep the parent as the best.
Decisions are only returned; the caller stores them with `Store.write_decision`.

`best_version` walks the chain of stored decisions from the first version to the latest
promoted one.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

import numpy as np
import polars as pl
from pydantic import Field, model_validator

from . import stats as st
from .errors import EvoTrainerError
from .schema import Decision, Finding, Frozen, GateStats

__all__ = ["DEFAULT_RULE", "GateError", "GateRule", "best_version", "compare", "decide", "paired_item_scores"]


class GateError(EvoTrainerError):
    """The gate cannot compare two versions (missing or too few shared held-out items)."""


class GateRule(Frozen):
    """Thresholds and bootstrap settings of the gate (defaults: the CI of Δ must exclude 0)."""

    promote_if_ci_low_above: float = 0.0
    reject_if_ci_high_below: float = 0.0
    B: int = Field(10_000, ge=100)
    seed: int = 0
    level: float = Field(0.95, gt=0.0, lt=1.0)
    min_items: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> GateRule:
        if self.reject_if_ci_high_below > self.promote_if_ci_low_above:
            raise ValueError(
                "reject_if_ci_high_below must not exceed promote_if_ci_low_above "
                f"({self.reject_if_ci_high_below} > {self.promote_if_ci_low_above}): "
                "a candidate could then be promoted and rejected at once"
            )
        return self

    def describe(self) -> str:
        pct = f"{self.level * 100:g}%"
        return (
            f"promote if the {pct} CI low of the mean per-item Δ(share correct) > "
            f"{self.promote_if_ci_low_above:g}; reject if its CI high < {self.reject_if_ci_high_below:g}; "
            "otherwise inconclusive (keep the parent); validity vetoes block promotion. "
            f"Paired percentile bootstrap over held-out items (B={self.B}, seed={self.seed}), "
            f"each version at its final eval step, at least {self.min_items} shared items."
        )


DEFAULT_RULE = GateRule()  # frozen, so one shared default is safe


# --------------------------------------------------------------------------- per-item scores


_NEEDED = ("version", "step", "item_id", "correct")


def _final_step_counts(val: pl.LazyFrame | pl.DataFrame, side: str) -> tuple[pl.DataFrame, str | None, int | None]:
    """Per item at the frame's last val step: n (samples with a verdict) and c (correct)."""
    lf = val.lazy()
    names = lf.collect_schema().names()
    missing = [c for c in _NEEDED if c not in names]
    if missing:
        raise GateError(f"{side} val rollouts lack columns {missing}; pass rollouts read from the store")
    if "split" in names:
        lf = lf.filter(pl.col("split") == "val")
    df = lf.select(_NEEDED).collect()
    versions = sorted(v for v in df["version"].unique().to_list() if v is not None)
    if len(versions) > 1:
        raise GateError(f"{side} val rollouts mix versions {versions}; pass one version's val rollouts per side")
    version = versions[0] if versions else None
    if df.height == 0:
        return pl.DataFrame(schema={"item_id": pl.String, "n": pl.Int64, "c": pl.Int64}), version, None
    step = int(df["step"].max())
    items = (
        df.filter(pl.col("step") == step)
        # A null verdict (unverifiable) is left out, as in Avg@k's mean.
        .filter(pl.col("correct").is_not_null())
        .group_by("item_id")
        .agg(n=pl.len().cast(pl.Int64), c=pl.col("correct").cast(pl.Int64).sum())
        .sort("item_id")
    )
    return items, version, step


def paired_item_scores(
    candidate_val: pl.LazyFrame | pl.DataFrame, baseline_val: pl.LazyFrame | pl.DataFrame,
) -> tuple[pl.DataFrame, dict]:
    """Items both versions were evaluated on, with per-side sample counts, correct counts, scores
    and the delta; plus a summary dict (versions, steps, item counts of each side).

    `delta` is computed as (c_cand * n_base - c_base * n_cand) / (n_cand * n_base): the numerator
    is an exact integer, so items with the same true delta get bit-identical deltas and the
    Wilcoxon test sees real ties as ties.
    """
    cand, cand_v, cand_step = _final_step_counts(candidate_val, "candidate")
    base, base_v, base_step = _final_step_counts(baseline_val, "baseline")
    joined = cand.join(base, on="item_id", how="inner", suffix="_base").rename(
        {"n": "n_cand", "c": "c_cand"}
    )
    joined = joined.with_columns(
        score_cand=pl.col("c_cand") / pl.col("n_cand"),
        score_base=pl.col("c_base") / pl.col("n_base"),
        delta=(pl.col("c_cand") * pl.col("n_base") - pl.col("c_base") * pl.col("n_cand")).cast(pl.Float64)
        / (pl.col("n_cand") * pl.col("n_base")).cast(pl.Float64),
    ).sort("item_id")
    info = {
        "candidate": cand_v, "baseline": base_v,
        "candidate_step": cand_step, "baseline_step": base_step,
        "candidate_items": cand.height, "baseline_items": base.height, "shared_items": joined.height,
    }
    return joined, info


def _side(name: str | None, fallback: str) -> str:
    return name if name is not None else fallback


def compare(
    candidate_val: pl.LazyFrame | pl.DataFrame, baseline_val: pl.LazyFrame | pl.DataFrame,
    rule: GateRule = DEFAULT_RULE,
) -> GateStats:
    """Paired comparison of two versions' held-out evaluations over the items they share.

    Each side is one version's val rollouts (for example `store.rollouts(version, "val")`); only
    its last eval step is used. The per-item score is the share of that item's samples judged
    correct; k reported for each side is the smallest number of samples per shared item.
    Raises GateError naming the counts when fewer than `rule.min_items` items are shared.
    """
    joined, info = paired_item_scores(candidate_val, baseline_val)
    n = joined.height
    if n < rule.min_items:
        cand = _side(info["candidate"], "candidate")
        base = _side(info["baseline"], "baseline")
        raise GateError(
            f"cannot compare {cand} with {base}: {cand} has {info['candidate_items']} val items "
            f"(final eval step {info['candidate_step']}), {base} has {info['baseline_items']} "
            f"(final eval step {info['baseline_step']}), {n} shared, fewer than min_items={rule.min_items}; "
            "evaluate both versions on the same held-out items"
        )
    deltas = joined["delta"].to_numpy()
    low, high = st.paired_bootstrap_ci(deltas, B=rule.B, seed=rule.seed, level=rule.level)
    k_cand = int(joined["n_cand"].min())
    k_base = int(joined["n_base"].min())
    p_mcnemar = None
    if int(joined["n_cand"].max()) == 1 and int(joined["n_base"].max()) == 1:
        b = int(((joined["c_cand"] == 1) & (joined["c_base"] == 0)).sum())
        c = int(((joined["c_cand"] == 0) & (joined["c_base"] == 1)).sum())
        p_mcnemar = st.mcnemar_exact(b, c)
    return GateStats(
        n_items=n,
        k_candidate=k_cand,
        k_baseline=k_base,
        mean_candidate=float(joined["score_cand"].mean()),
        mean_baseline=float(joined["score_base"].mean()),
        mean_delta=float(np.mean(deltas)),
        ci_low=low,
        ci_high=high,
        ci_level=rule.level,
        bootstrap_b=rule.B,
        bootstrap_seed=rule.seed,
        p_wilcoxon=st.wilcoxon_signed_rank(deltas),
        p_mcnemar=p_mcnemar,
        effect_size=st.paired_cohens_d(deltas),
    )


# --------------------------------------------------------------------------- decisions


def _decision_id(candidate: str, baseline: str | None, outcome: str, stats: GateStats | None,
                 vetoes: tuple[str, ...], rule: GateRule) -> str:
    blob = json.dumps(
        {
            "candidate": candidate, "baseline": baseline, "outcome": outcome,
            "stats": stats.model_dump(mode="json") if stats is not None else None,
            "vetoes": list(vetoes), "rule": rule.model_dump(mode="json"),
        },
        sort_keys=True, separators=(",", ":"),
    )
    return "d-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def _fmt_p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def _stats_text(s: GateStats) -> str:
    pct = f"{s.ci_level * 100:g}%"
    return (
        f"Avg@k {s.mean_candidate:.4f} (k={s.k_candidate}) vs {s.mean_baseline:.4f} (k={s.k_baseline}) "
        f"on {s.n_items} shared items: Δ {s.mean_delta:+.4f}, {pct} CI [{s.ci_low:+.4f}, {s.ci_high:+.4f}], "
        f"Wilcoxon p={_fmt_p(s.p_wilcoxon)}"
        + (f", McNemar p={_fmt_p(s.p_mcnemar)}" if s.p_mcnemar is not None else "")
    )


def _val(store, version: str) -> pl.LazyFrame:
    """The version's val rollouts at its last eval step (only that partition is read)."""
    last = max(store.steps(version, "val"))
    return store.rollouts(version, "val", steps=(last, last),
                          columns=["version", "split", "step", "item_id", "correct"])


def decide(
    store, candidate: str, baseline: str | None, *, vetoes: Sequence[Finding] = (),
    rule: GateRule = DEFAULT_RULE, decided_by: str = "gate",
) -> Decision:
    """The gate's verdict on `candidate` against `baseline` (the best version so far).

    Vetoes (findings with veto=True; others are ignored) win over any score, also for a first
    version: invalid evidence must not become the best. Then: no baseline -> promote; otherwise
    the paired CI of the per-item delta decides (see GateRule.describe()). With a veto the stats
    are still computed when the evidence allows, for the record. The decision is returned, not
    stored: call `store.write_decision(decision)`.
    """
    if baseline is not None and baseline == candidate:
        raise GateError(f"candidate and baseline are both {candidate}; compare a version with another one")
    veto_findings = [f for f in vetoes if f.veto]
    veto_ids = tuple(dict.fromkeys(f.finding_id for f in veto_findings))

    stats: GateStats | None = None
    stats_note = ""
    if baseline is not None:
        try:
            for v in (candidate, baseline):
                if not store.steps(v, "val"):
                    raise GateError(f"{v} has no val rollouts in {store.root}; evaluate it before gating")
            stats = compare(_val(store, candidate), _val(store, baseline), rule)
        except GateError as exc:
            if not veto_ids:
                raise
            stats_note = f" (no stats: {exc})"

    if veto_ids:
        outcome = "vetoed"
        what = "; ".join(f"{f.finding_id} {f.code}: {f.message}" for f in veto_findings)
        score = f" Score, not used: {_stats_text(stats)}." if stats is not None else stats_note
        reason = (f"vetoed by {len(veto_ids)} validity finding(s) whatever the score: {what}.{score}")
    elif baseline is None:
        outcome = "promote"
        reason = f"{candidate} is the first version: nothing to compare against, promoted as the baseline"
    else:
        assert stats is not None
        text = _stats_text(stats)
        if stats.ci_low > rule.promote_if_ci_low_above:
            outcome = "promote"
            reason = f"promote {candidate} over {baseline}: CI low {stats.ci_low:+.4f} > {rule.promote_if_ci_low_above:g}; {text}"
        elif stats.ci_high < rule.reject_if_ci_high_below:
            outcome = "reject"
            reason = f"reject {candidate}, keep {baseline}: CI high {stats.ci_high:+.4f} < {rule.reject_if_ci_high_below:g}; {text}"
        else:
            outcome = "inconclusive"
            reason = (f"inconclusive, keep {baseline}: the CI [{stats.ci_low:+.4f}, {stats.ci_high:+.4f}] "
                      f"reaches neither threshold; {text}")
        if stats.p_wilcoxon is None:
            reason += " (Wilcoxon undefined: every shared item has Δ = 0)"

    return Decision(
        decision_id=_decision_id(candidate, baseline, outcome, stats, veto_ids, rule),
        candidate=candidate,
        baseline=baseline,
        outcome=outcome,
        stats=stats,
        vetoes=veto_ids,
        rule=rule.describe(),
        decided_by=decided_by,
        reason=reason,
    )


def best_version(decisions: Iterable[Decision]) -> str | None:
    """The latest promoted version, following the decision chain from the first version.

    Decisions are replayed in time order (`created_at`; the input order only breaks exact ties,
    since `Store.decisions()` lists by id). The chain starts empty; a "promote" whose baseline is
    the current best (None for the first version) extends it. A promotion against a version that
    is no longer the best is stale and ignored: the candidate never beat the current best. A
    later non-promote decision on a pair that is in the chain (a veto found afterwards, a
    person's override) rolls the chain back to that pair's baseline, dropping what was built on
    the overturned version.
    """
    ordered = sorted(enumerate(decisions), key=lambda t: (t[1].created_at, t[0]))
    chain: list[str] = []  # chain[i] was promoted against chain[i-1] (chain[0] against None)
    for _, d in ordered:
        current = chain[-1] if chain else None
        if d.outcome == "promote":
            if d.baseline == current and d.candidate not in chain:
                chain.append(d.candidate)
        elif d.candidate in chain:
            i = chain.index(d.candidate)
            if (chain[i - 1] if i else None) == d.baseline:
                del chain[i:]
    return chain[-1] if chain else None
