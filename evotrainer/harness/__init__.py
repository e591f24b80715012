"""Harness components: vectorised functions used both by training and by backtests.

One implementation of each piece of RL math:
  rewards.score_frame         verifier outcome -> r.<component> columns and the weighted `reward`
  filters.apply_trajectory_filter / apply_group_filter / replay_group_filter
  advantages.compute_advantages  TRL 1.16's group-relative advantages (filtered rows -> 0)
  data.select_items           which items a version trains on

`apply_harness` chains them in the order training applies them:
  rewards -> trajectory filter -> group filter (stateful, steps in order) -> advantages.
The trainer calls it on one step's batch with its FilterState; a backtest on every stored step.
"""
from __future__ import annotations

import polars as pl

from ..schema import HarnessSpec
from .advantages import compute_advantages, effective_data_fraction, group_stats
from .filters import FilterState, apply_trajectory_filter, replay_group_filter
from .rewards import MissingVerifierData, RewardContext, VerifierDataError, score_frame


def apply_harness(harness: HarnessSpec, frame: pl.DataFrame, ctx: RewardContext | None = None,
                  state: FilterState | None = None) -> tuple[pl.DataFrame, FilterState]:
    """Score, filter and compute advantages for rows of one or more steps (steps in order).

    Adds/replaces r.<name>, reward, filtered, filter_reason, advantage. Returns the rows and the
    group filter's state after the last step (`state` None: the initial FilterState())."""
    state = state if state is not None else FilterState()
    out = score_frame(harness.rewards, frame, ctx)
    out = apply_trajectory_filter(harness.trajectory_filter, out)
    out, state = replay_group_filter(harness.group_filter, out, state, return_state=True)
    out = compute_advantages(out, harness.scale_rewards)
    return out, state


__all__ = [
    "FilterState",
    "MissingVerifierData",
    "RewardContext",
    "VerifierDataError",
    "apply_harness",
    "compute_advantages",
    "effective_data_fraction",
    "group_stats",
    "score_frame",
]
