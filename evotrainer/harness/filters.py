"""Group and trajectory filters: which rollouts contribute gradient.

Both mark rows with `filtered` (bool) and `filter_reason` (str, null when kept); a filtered row
gets advantage 0 (`advantages.compute_advantages` zeroes it), so a filtered group contributes no
gradient. Vectorised (polars/numpy): one training batch and a million stored rollouts alike.

Group filter (GroupFilterSpec.kind)
-----------------------------------
Every group's std is the unbiased std of its scorable rewards (`advantages.group_stats`; 0 with
fewer than two). A group is DEAD when std < zero_std_eps or std == 0 (so eps = 0 still drops
std = 0 groups).

- none:     keep everything.
- zero_std: drop dead groups (reason "zero_std").
- std_ema:  the paper's StdGroupFilter, stateful across steps, defined precisely as:

  State `FilterState(ema_mean, ema_var, n_seen)`: the EMA of the stds of the LIVE groups seen
  so far and their count. Dead groups are always dropped and do not enter the EMA (so the
  threshold describes the spread of groups that have signal and does not sink to 0 when many
  groups are dead), and the warm-up counts live groups.

  One batch = one optimizer step's groups, in group order (by `group_id`, which is sampler order
  within a step). With the state S = (mu, var, n) as it was BEFORE the batch:
    threshold  T = mu - z * sqrt(var),  z = Phi^-1(keep_ratio)   (only if n >= 1, else none)
    the live groups of the batch get global live indices n, n+1, ...; a live group whose index
      < W = warmup_groups (default max(20, ceil(1/ema_decay))) is kept (warm-up: std=0 rule only);
      any other live group is kept iff std >= T (else reason "below_ema_threshold");
    min_keep: if fewer than ceil(min_keep * n_groups_in_batch) groups are kept, threshold-dropped
      groups are put back in decreasing std (ties: group order) until that many are kept or
      none is left; dead groups are never put back.
  Then the EMA absorbs the batch's live groups one by one in group order, for each std x:
    first group ever (n = 0):  mu = x, var = 0
    otherwise:                 delta = x - mu;  mu += d * delta;  var = (1 - d) * (var + d * delta^2)
    n += 1                     (d = ema_decay)
  which equals the EMA of x and of x^2 with var = E[x^2] - mu^2, the form used here to run the
  whole replay as one vectorised scan. Decisions within a batch therefore never depend on each
  other's order; only the state carries from step to step.

  `apply_group_filter` processes one step given the state and returns the new state (the
  trainer); `replay_group_filter` processes many steps in step order from a state (backtests,
  and the trainer rebuilding its state on resume from the stored steps). Applying the steps one
  by one and replaying them at once give the same decisions and state (tested).

Trajectory filter (TrajectoryFilterSpec): drop_truncated masks truncated rollouts ("truncated");
max_completion_tokens masks longer ones ("too_long"). A masked rollout still counts in its
group's mean and std (TRL's mask_truncated_completions does the same); it only loses its gradient.
A row masked by the trajectory filter keeps that reason if its group is dropped as well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from ..schema import GroupFilterSpec, TrajectoryFilterSpec
from .advantages import ADV_TOL, group_stats

REASON_ZERO_STD = "zero_std"
REASON_BELOW = "below_ema_threshold"
REASON_TRUNCATED = "truncated"
REASON_TOO_LONG = "too_long"


@dataclass(frozen=True)
class FilterState:
    """StdGroupFilter state between steps: EMA mean and variance of live-group stds, and how many
    live groups entered it. The initial state is FilterState()."""

    ema_mean: float = 0.0
    ema_var: float = 0.0
    n_seen: int = 0

    @property
    def ema_std(self) -> float:
        return math.sqrt(max(self.ema_var, 0.0))

    def threshold(self, spec: GroupFilterSpec) -> float | None:
        """T = ema_mean - z * ema_std, or None before any live group was seen."""
        if self.n_seen < 1:
            return None
        return self.ema_mean - keep_z(spec.keep_ratio) * self.ema_std


def keep_z(keep_ratio: float) -> float:
    """z = Phi^-1(keep_ratio) (scipy.special.ndtri is what scipy.stats.norm.ppf calls)."""
    from scipy.special import ndtri

    return float(ndtri(keep_ratio))


def warmup_groups(spec: GroupFilterSpec) -> int:
    if spec.warmup_groups is not None:
        return int(spec.warmup_groups)
    return max(20, math.ceil(1.0 / spec.ema_decay - 1e-9))


def is_dead(std: np.ndarray | pl.Series, eps: float) -> np.ndarray:
    s = np.asarray(std, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return ~(s >= eps) | (s <= 0.0)  # NaN -> dead


def _ema_scan(x: np.ndarray, a: float, y0: float) -> np.ndarray:
    """y[k] = a*y[k-1] + (1-a)*x[k] with y[-1] = y0, for all k, as a Hillis-Steele scan (log n passes)."""
    y = (1.0 - a) * x
    if y.size:
        y[0] += a * y0
    shift, coef = 1, a
    while shift < y.size and coef != 0.0:
        y[shift:] = y[shift:] + coef * y[:-shift]
        shift *= 2
        coef *= coef
    return y


# --------------------------------------------------------------------------- group filter


def decide_groups(spec: GroupFilterSpec, groups: pl.DataFrame, state: FilterState = FilterState()
                  ) -> tuple[pl.DataFrame, FilterState]:
    """The core: per-group decisions for a frame of group stats (columns group_id, std, and step
    when it spans several steps), processed in (step, group_id) order. Returns the groups in that
    order with `keep`, `filter_reason`, `threshold` (the one applied; null during warm-up or
    without EMA) and the state after the last step."""
    if "step" not in groups.columns:
        groups = groups.with_columns(pl.lit(0, dtype=pl.Int64).alias("step"))
    g = groups.sort(["step", "group_id"], maintain_order=True)
    std = g["std"].to_numpy().astype(np.float64, copy=True)
    dead = is_dead(std, spec.zero_std_eps)
    n = std.size
    reason = np.zeros(n, dtype=np.int8)  # 0 kept, 1 zero_std, 2 below threshold
    threshold = np.full(n, np.nan)
    keep = np.ones(n, dtype=bool)
    if spec.kind == "none" or n == 0:
        return _decisions(g, keep, reason, threshold), state
    keep[dead] = False
    reason[dead] = 1
    if spec.kind == "zero_std":
        return _decisions(g, keep, reason, threshold), state
    if spec.kind != "std_ema":
        raise ValueError(f"unknown group filter kind {spec.kind!r}")

    d = float(spec.ema_decay)
    a = 1.0 - d
    z = keep_z(spec.keep_ratio)
    W = warmup_groups(spec)
    steps = g["step"].to_numpy()
    live = ~dead
    x = std[live]
    m = x.size
    # EMA after each live group (vectorised), starting from the incoming state.
    if m:
        if state.n_seen == 0:
            mu0, sq0 = x[0], x[0] * x[0]  # first group ever: mu = x, var = 0
        else:
            mu0, sq0 = state.ema_mean, max(state.ema_var, 0.0) + state.ema_mean ** 2
        mu = _ema_scan(x, a, mu0)
        sq = _ema_scan(x * x, a, sq0)
    else:
        mu = sq = np.empty(0)
    # State before each step: after the last live group of the earlier steps.
    live_before = np.cumsum(live) - live  # live groups before each row
    step_change = np.r_[True, steps[1:] != steps[:-1]]
    step_start = np.maximum.accumulate(np.where(step_change, np.arange(n), 0))
    c = live_before[step_start]  # live groups before this row's step
    n_pre = state.n_seen + c
    prev = np.maximum(c - 1, 0)
    mu_pre = np.where(c > 0, mu[prev] if m else 0.0, state.ema_mean)
    var_pre = np.where(c > 0, (sq[prev] - mu[prev] ** 2) if m else 0.0, state.ema_var)
    thr = np.where(n_pre >= 1, mu_pre - z * np.sqrt(np.maximum(var_pre, 0.0)), -np.inf)
    warm = (state.n_seen + live_before) < W
    below = live & ~warm & (std < thr)
    keep = live & ~below
    threshold = np.where(live & ~warm & (n_pre >= 1), thr, np.nan)
    reason[below] = 2
    # min_keep per step: put back threshold-dropped groups by decreasing std.
    if spec.min_keep > 0 and below.any():
        df = pl.DataFrame({"step": steps, "std": std, "keep": keep, "below": below, "i": np.arange(n)})
        df = df.with_columns(
            need=(((pl.len() * spec.min_keep) - 1e-9).ceil().cast(pl.Int64) - pl.col("keep").sum()).over("step"),
        ).with_columns(
            rank=pl.when(pl.col("below")).then(
                pl.col("std").rank("ordinal", descending=True).over(["step", "below"])
            ),
        )
        back = df.select(pl.col("below") & (pl.col("rank") <= pl.col("need"))).to_series().fill_null(False).to_numpy()
        keep |= back
        reason[back] = 0
    if m:
        new_state = FilterState(ema_mean=float(mu[-1]), ema_var=float(max(sq[-1] - mu[-1] ** 2, 0.0)),
                                n_seen=state.n_seen + m)
    else:
        new_state = state
    return _decisions(g, keep, reason, threshold), new_state


_REASONS = {1: REASON_ZERO_STD, 2: REASON_BELOW}


def _decisions(g: pl.DataFrame, keep: np.ndarray, reason: np.ndarray, threshold: np.ndarray) -> pl.DataFrame:
    return g.with_columns(
        pl.Series("keep", keep),
        pl.Series("filter_reason", reason).replace_strict(_REASONS, default=None, return_dtype=pl.String),
        pl.Series("threshold", threshold).fill_nan(None),
    )


def _mark_groups(frame: pl.DataFrame, decisions: pl.DataFrame) -> pl.DataFrame:
    dropped = decisions.filter(~pl.col("keep")).select("group_id", pl.col("filter_reason").alias("_greason"))
    out = frame.join(dropped, on="group_id", how="left", maintain_order="left")
    prev_f = pl.col("filtered").fill_null(False) if "filtered" in frame.columns else pl.lit(False)
    prev_r = pl.col("filter_reason") if "filter_reason" in frame.columns else pl.lit(None, dtype=pl.String)
    return out.with_columns(
        filtered=prev_f | pl.col("_greason").is_not_null(),
        filter_reason=pl.when(prev_f).then(prev_r).otherwise(pl.col("_greason")),
    ).drop("_greason")


def apply_group_filter(spec: GroupFilterSpec, frame: pl.DataFrame, state: FilterState = FilterState()
                       ) -> tuple[pl.DataFrame, FilterState]:
    """One step's rows (group_id, reward) -> rows with `filtered`/`filter_reason` and the new state.

    Rows already `filtered` (trajectory filter) stay filtered with their reason."""
    if "step" in frame.columns and frame["step"].n_unique() > 1:
        raise ValueError("apply_group_filter takes one step's rows; use replay_group_filter for several steps")
    frame2, new_state, _ = _filter_frame(spec, frame, state)
    return frame2, new_state


def replay_group_filter(spec: GroupFilterSpec, frame: pl.DataFrame, state: FilterState = FilterState(),
                        *, return_state: bool = False):
    """Rows of many steps -> rows with `filtered`/`filter_reason`, steps processed in order from
    `state`. With return_state, also the state after the last step."""
    frame2, new_state, _ = _filter_frame(spec, frame, state)
    return (frame2, new_state) if return_state else frame2


def _filter_frame(spec: GroupFilterSpec, frame: pl.DataFrame, state: FilterState):
    if spec.kind == "none":
        out = frame
        if "filtered" not in out.columns:
            out = out.with_columns(filtered=pl.lit(False))
        if "filter_reason" not in out.columns:
            out = out.with_columns(filter_reason=pl.lit(None, dtype=pl.String))
        return out, state, None
    if spec.kind == "std_ema" and "version" in frame.columns and frame["version"].n_unique() > 1:
        raise ValueError("the std_ema filter replays one training run: pass one version's rows at a time")
    stats = group_stats(frame)
    decisions, new_state = decide_groups(spec, stats, state)
    return _mark_groups(frame, decisions), new_state, decisions


def state_from_steps(spec: GroupFilterSpec, frame: pl.DataFrame) -> FilterState:
    """The state after replaying stored steps (the trainer resuming from a checkpoint)."""
    return replay_group_filter(spec, frame, return_state=True)[1]


# --------------------------------------------------------------------------- trajectory filter


def apply_trajectory_filter(spec: TrajectoryFilterSpec, frame: pl.DataFrame) -> pl.DataFrame:
    """Sets `filtered`/`filter_reason` afresh from the row-level rules (truncated, then too_long)."""
    reason = pl.lit(None, dtype=pl.String)
    if spec.max_completion_tokens is not None:
        reason = pl.when(pl.col("n_completion_tokens") > spec.max_completion_tokens).then(
            pl.lit(REASON_TOO_LONG)).otherwise(reason)
    if spec.drop_truncated:
        reason = pl.when(pl.col("truncated").fill_null(False)).then(pl.lit(REASON_TRUNCATED)).otherwise(reason)
    return frame.with_columns(filter_reason=reason).with_columns(filtered=pl.col("filter_reason").is_not_null())


def effective_data_fraction(frame: pl.DataFrame, *, adv_col: str = "advantage") -> float | None:
    """Share of rollouts carrying gradient: not filtered and |advantage| > ADV_TOL."""
    from .advantages import effective_data_fraction as _edf

    return _edf(frame, adv_col=adv_col)


__all__ = [
    "ADV_TOL",
    "FilterState",
    "apply_group_filter",
    "apply_trajectory_filter",
    "decide_groups",
    "effective_data_fraction",
    "keep_z",
    "replay_group_filter",
    "state_from_steps",
    "warmup_groups",
]
