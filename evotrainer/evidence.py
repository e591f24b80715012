"""The evidence contract: rollout / turn / metric table schemas and pure helpers over them.

One row per trajectory in `rollouts`. Required columns are listed in ROLLOUT_COLUMNS; more may be
added freely, and each reward component has its own float column `r.<name>` (null = not
applicable). Columns are never removed or renamed without a migration.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

REWARD_PREFIX = "r."

ROLLOUT_COLUMNS: dict[str, pl.DataType] = {
    "rollout_uid": pl.String(),
    "campaign": pl.String(),
    "version": pl.String(),
    "split": pl.String(),
    "step": pl.Int32(),
    "item_id": pl.String(),
    "group_id": pl.String(),
    "sample_idx": pl.Int32(),
    "prompt": pl.String(),
    "completion": pl.String(),
    "n_prompt_tokens": pl.Int32(),
    "n_completion_tokens": pl.Int32(),
    "truncated": pl.Boolean(),
    "stop_reason": pl.String(),
    "reward": pl.Float64(),
    "verifier": pl.String(),
    "correct": pl.Boolean(),
    "advantage": pl.Float64(),
    "filtered": pl.Boolean(),
    "filter_reason": pl.String(),
    "mean_logprob": pl.Float64(),
    "n_turns": pl.Int32(),
    "n_tool_calls": pl.Int32(),
}

TURN_COLUMNS: dict[str, pl.DataType] = {
    "rollout_uid": pl.String(),
    "turn_idx": pl.Int32(),
    "role": pl.String(),
    "text": pl.String(),
    "tool_name": pl.String(),
    "tool_args": pl.String(),
    "tool_output": pl.String(),
    "tool_ok": pl.Boolean(),
    "n_tokens": pl.Int32(),
    "mean_logprob": pl.Float64(),
}

METRIC_COLUMNS: dict[str, pl.DataType] = {
    "campaign": pl.String(),
    "version": pl.String(),
    "step": pl.Int32(),
    "name": pl.String(),
    "value": pl.Float64(),
    "source": pl.String(),
}

SPLITS = ("train", "val")


def group_id(version: str, split: str, step: int, group: int) -> str:
    """Globally unique within a campaign, so a careless group_by cannot merge groups of two steps."""
    return f"{version}/{split}/{step:06d}/{group:04d}"


def rollout_uid(campaign: str, version: str, split: str, step: int, group: int, sample: int) -> str:
    return f"{campaign}/{group_id(version, split, step, group)}/{sample:03d}"


def reward_columns(columns: Iterable[str]) -> list[str]:
    return [c for c in columns if c.startswith(REWARD_PREFIX)]


class ContractError(ValueError):
    pass


def conform(df: pl.DataFrame, required: Mapping[str, pl.DataType], table: str) -> pl.DataFrame:
    """Check required columns exist and cast them to the contract's dtypes (extra columns kept).

    Raises ContractError naming the missing or uncastable columns; never drops data silently.
    """
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ContractError(f"{table} rows lack required columns {missing}")
    casts = []
    for name, dtype in required.items():
        if df.schema[name] != dtype:
            casts.append(pl.col(name).cast(dtype, strict=True))
    if table == "rollouts":
        for name in reward_columns(df.columns):
            if df.schema[name] != pl.Float64:
                casts.append(pl.col(name).cast(pl.Float64, strict=True))
    if casts:
        try:
            df = df.with_columns(casts)
        except Exception as exc:  # polars raises several types for bad casts
            raise ContractError(f"{table} rows have a column of the wrong type: {exc}".splitlines()[0]) from exc
    ordered = list(required) + [c for c in df.columns if c not in required]
    return df.select(ordered)


def conform_rollouts(df: pl.DataFrame) -> pl.DataFrame:
    df = conform(df, ROLLOUT_COLUMNS, "rollouts")
    bad_split = df.filter(~pl.col("split").is_in(SPLITS))
    if bad_split.height:
        raise ContractError(f"rollouts have unknown split values {bad_split['split'].unique().to_list()}")
    if df["rollout_uid"].n_unique() != df.height:
        raise ContractError("rollouts repeat a rollout_uid within one append")
    return df


# --------------------------------------------------------------------------- pure helpers


def per_item_scores(val: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per version and item: k (samples) and the share correct (Avg@k's unit)."""
    lf = val.lazy()
    return (
        lf.group_by(["version", "step", "item_id"])
        .agg(k=pl.len(), score=pl.col("correct").cast(pl.Float64).mean(), reward=pl.col("reward").mean())
        .sort(["version", "step", "item_id"])
        .collect()
    )


def avg_at_k(val: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per version and evaluation step: Avg@k = mean over items of the per-item share correct."""
    items = per_item_scores(val)
    return (
        items.group_by(["version", "step"])
        .agg(avg_at_k=pl.col("score").mean(), n_items=pl.len(), k=pl.col("k").min())
        .sort(["version", "step"])
    )


def step_summary(train: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per version and step: rollout count, mean reward, share correct."""
    return (
        train.lazy()
        .group_by(["version", "step"])
        .agg(
            n_rollouts=pl.len(),
            reward_mean=pl.col("reward").mean(),
            correct_mean=pl.col("correct").cast(pl.Float64).mean(),
        )
        .sort(["version", "step"])
        .collect()
    )
