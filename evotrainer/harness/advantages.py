"""Group-relative advantages (GRPO), the same arithmetic as TRL 1.16's GRPOTrainer
(`multi_objective_aggregation="sum_then_normalize"`):

    A_i = (r_i - mean(r_group)) / (std + eps)      scale = "group": std of the group
                                                   scale = "batch": std over the whole batch
                                                   scale = "none":  no division

- std is the unbiased (N-1) std over the scorable rewards, eps = 1e-4 (TRL's `nanstd` + 1e-4);
- a row whose reward is null/NaN (every component null: "unscorable") is left out of the group's
  mean and std and gets advantage 0; so does every row of a group with fewer than two scorable
  rewards under group scaling (TRL: 0 * inf = NaN -> 0);
- "batch" is one optimizer step's generation batch: the std is taken per `batch_key` (default
  `step` when the frame has it, else the whole frame), the mean is still the group's;
- rows marked `filtered` (group or trajectory filter) get advantage 0 AFTER the computation: the
  filters mask rows out of the loss, they do not change the others' baseline (as TRL's
  `mask_truncated_completions` does).

TRL computes in float32 and we in float64, so recorded and recomputed advantages agree to ~1e-5
relative. Values within ADV_TOL of 0 count as "no gradient" (an all-equal group leaves ~1e-13
after division by eps).

Vectorised (polars) so it runs on one training batch and on a million stored rollouts alike.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import polars as pl

EPS = 1e-4
ADV_TOL = 1e-9  # |advantage| at or below this carries no gradient
DEAD_STD = 1e-3  # the paper's dead-group threshold (reward std < 0.001)

Scale = Literal["group", "batch", "none"]


def _scorable(reward_col: str) -> pl.Expr:
    return pl.col(reward_col).cast(pl.Float64).fill_nan(None)


def advantage_expr(scale: Scale = "group", *, group_col: str = "group_id", batch_key: str | None = None,
                   reward_col: str = "reward") -> pl.Expr:
    """A polars expression for the advantage of each row (0 for unscorable rows)."""
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', not {scale!r}")
    r = _scorable(reward_col)
    centred = r - r.mean().over(group_col)
    if scale == "group":
        adv = centred / (r.std(ddof=1).over(group_col) + EPS)
    elif scale == "batch":
        std = r.std(ddof=1).over(batch_key) if batch_key else r.std(ddof=1)
        adv = centred / (std + EPS)
    else:
        adv = centred
    return adv.fill_nan(None).fill_null(0.0)


def compute_advantages(frame: pl.DataFrame, scale: Scale = "group", *, group_col: str = "group_id",
                       batch_key: str | None = "auto", reward_col: str = "reward",
                       out_col: str = "advantage", zero_filtered: bool = True) -> pl.DataFrame:
    """`frame` with `out_col` (the advantage) added or replaced.

    batch_key "auto": `step` if the frame has it, else the whole frame is one batch.
    zero_filtered: rows whose `filtered` column is true get 0 (if the frame has that column).
    """
    if batch_key == "auto":
        batch_key = "step" if "step" in frame.columns else None
    adv = advantage_expr(scale, group_col=group_col, batch_key=batch_key, reward_col=reward_col)
    if zero_filtered and "filtered" in frame.columns:
        adv = pl.when(pl.col("filtered").fill_null(False)).then(0.0).otherwise(adv)
    # Lazy: the optimiser shares the window computations (3-4x faster than eager at 1M rows).
    return frame.lazy().with_columns(adv.alias(out_col)).collect()


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[object], scale: Scale = "group"
) -> np.ndarray:
    """numpy front end of `compute_advantages` for one batch (rows in any order, NaN = unscorable)."""
    r = np.asarray(rewards, dtype=np.float64)
    codes = _codes(group_ids)
    df = pl.DataFrame({"group_id": codes, "reward": r})
    return compute_advantages(df, scale, batch_key=None)["advantage"].to_numpy()


def _codes(group_ids: Sequence[object]) -> np.ndarray:
    index: dict[object, int] = {}
    return np.fromiter((index.setdefault(g, len(index)) for g in group_ids), dtype=np.int64, count=len(group_ids))


def group_std(rewards: Sequence[float], group_ids: Sequence[object]) -> dict[object, float]:
    """Per group id: unbiased std of its scorable rewards (0.0 with fewer than two)."""
    ids = list(group_ids)
    codes = _codes(ids)
    first = dict(zip(codes.tolist()[::-1], ids[::-1]))
    df = pl.DataFrame({"group_id": codes, "reward": np.asarray(rewards, dtype=np.float64)})
    stats = group_stats(df)
    return {first[g]: float(s) for g, s in zip(stats["group_id"].to_list(), stats["std"].to_list())}


def group_stats(frame: pl.DataFrame | pl.LazyFrame, *, group_col: str = "group_id",
                reward_col: str = "reward") -> pl.DataFrame:
    """One row per group, in first-appearance order: n (rows), n_scored, mean, std (unbiased over
    scorable rewards; 0.0 with fewer than two), dead (std < 0.001), and all_correct / none_correct
    when the frame has a `correct` column. Carries `step` and `version` when the frame has them."""
    lf = frame.lazy()
    cols = lf.collect_schema().names()
    r = _scorable(reward_col)
    aggs = [
        pl.len().alias("n"),
        r.count().alias("n_scored"),
        r.mean().alias("mean"),
        r.std(ddof=1).fill_nan(None).fill_null(0.0).alias("std"),
    ]
    for extra in ("version", "step"):
        if extra in cols and extra != group_col:
            aggs.append(pl.col(extra).first())
    if "correct" in cols:
        c = pl.col("correct").fill_null(False)
        aggs += [c.all().alias("all_correct"), (~c).all().alias("none_correct")]
    out = lf.group_by(group_col, maintain_order=True).agg(aggs)
    return out.with_columns((pl.col("std") < DEAD_STD).alias("dead")).collect()


def effective_data_fraction(frame: pl.DataFrame, *, adv_col: str = "advantage") -> float | None:
    """Share of rollouts that carry gradient: not filtered and |advantage| > ADV_TOL."""
    if frame.height == 0:
        return None
    live = pl.col(adv_col).fill_null(0.0).abs() > ADV_TOL
    if "filtered" in frame.columns:
        live = live & ~pl.col("filtered").fill_null(False)
    return float(frame.select(live.mean()).item())
