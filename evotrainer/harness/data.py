"""Data selection (DataSelectionSpec): which training items a version sees, decided from the stored
rollouts of an earlier version.

Per item the solve rate is the share of its stored rollouts that are `correct` (train split by
default). Steps, in this order:
  1. drop_saturated: items with solve rate == 1 over >= MIN_SAMPLES samples;
     drop_unsolved: items with solve rate == 0 over >= MIN_SAMPLES samples
     (one sample is too little evidence either way; items without evidence are never dropped);
  2. subsample: a seeded random subset of that many items, in their current order;
  3. curriculum easy_first: stable sort by solve rate, highest first; items without evidence last.
A selection that leaves no item is an error.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from ..envs.base import Item
from ..errors import EvoTrainerError
from ..schema import DataSelectionSpec

MIN_SAMPLES = 2


class DataSelectionError(EvoTrainerError):
    """The data selection cannot be applied (no evidence where it needs some, or nothing left)."""


def needs_evidence(spec: DataSelectionSpec) -> bool:
    return spec.drop_saturated or spec.drop_unsolved or spec.curriculum != "none"


def solve_rates(rollouts: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per item_id: n (samples) and solve_rate (share correct)."""
    return (
        rollouts.lazy()
        .group_by("item_id")
        .agg(n=pl.len(), solve_rate=pl.col("correct").fill_null(False).cast(pl.Float64).mean())
        .collect()
    )


def select_items(
    spec: DataSelectionSpec, items: Sequence[Item], rollouts: pl.LazyFrame | pl.DataFrame | None, *,
    seed: int = 0,
) -> tuple[list[Item], dict[str, Any]]:
    """Apply the selection to `items` using `rollouts` (the source version's stored rows; only
    item_id and correct are read). Returns the items and a summary of what was dropped and why."""
    items = list(items)
    summary: dict[str, Any] = {"n_in": len(items), "dropped_saturated": 0, "dropped_unsolved": 0,
                               "dropped_subsample": 0, "n_with_evidence": 0, "curriculum": spec.curriculum}
    rates: dict[str, tuple[int, float]] = {}
    if needs_evidence(spec):
        if rollouts is None:
            raise DataSelectionError("data selection needs the source version's rollouts; none were given")
        table = solve_rates(rollouts.lazy().select("item_id", "correct"))
        if table.height == 0:
            raise DataSelectionError(
                "data selection needs stored rollouts of the source version, and it has none; "
                "train the source version first or turn the selection off")
        rates = {r["item_id"]: (r["n"], r["solve_rate"]) for r in table.iter_rows(named=True)}
    summary["n_with_evidence"] = sum(1 for it in items if it.item_id in rates)

    kept: list[Item] = []
    for it in items:
        n, rate = rates.get(it.item_id, (0, None))
        if n >= MIN_SAMPLES and rate is not None:
            if spec.drop_saturated and rate >= 1.0:
                summary["dropped_saturated"] += 1
                continue
            if spec.drop_unsolved and rate <= 0.0:
                summary["dropped_unsolved"] += 1
                continue
        kept.append(it)

    if spec.subsample is not None and spec.subsample < len(kept):
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(len(kept), size=spec.subsample, replace=False))
        summary["dropped_subsample"] = len(kept) - spec.subsample
        kept = [kept[i] for i in idx]

    if spec.curriculum == "easy_first":
        def key(it: Item) -> tuple[int, float]:
            _, rate = rates.get(it.item_id, (0, None))
            return (1, 0.0) if rate is None else (0, -rate)

        kept = sorted(kept, key=key)  # stable

    if not kept:
        raise DataSelectionError(
            f"data selection left no training items out of {len(items)} (dropped: saturated "
            f"{summary['dropped_saturated']}, unsolved {summary['dropped_unsolved']}); relax the selection")
    summary["n_out"] = len(kept)
    return kept, summary


def select_from_store(store, spec: DataSelectionSpec, items: Sequence[Item], *, parent: str | None,
                      seed: int = 0, split: str = "train") -> tuple[list[Item], dict[str, Any]]:
    """`select_items` with the source version's rollouts read lazily from the store
    (source_version, else `parent`)."""
    source = spec.source_version or parent
    rollouts = None
    if needs_evidence(spec):
        if source is None:
            raise DataSelectionError("data selection needs a source version, and this version has no parent; "
                                     "set data_selection.source_version")
        rollouts = store.rollouts(source, split=split, columns=["item_id", "correct"])
    kept, summary = select_items(spec, items, rollouts, seed=seed)
    summary["source_version"] = source
    return kept, summary
