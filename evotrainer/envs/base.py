"""What every domain provides: items, prompts and a verifier whose raw outcomes are JSON.

The verifier's output is stored verbatim in the rollout's `verifier` column, so reward
components (and backtests) can be re-computed offline from it without re-running the check.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field


class Item(BaseModel):
    """One dataset item. `item_id` is stable across runs (a content hash or the source's id)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item_id: str
    question: str
    answer: str
    tier: int = 0
    source: str = "generated"
    meta: dict[str, Any] = Field(default_factory=dict)


class Domain(Protocol):
    name: str

    def train_items(self, n: int, seed: int) -> list[Item]: ...

    def val_items(self, n: int, seed: int) -> list[Item]: ...

    def messages(self, item: Item) -> list[dict[str, str]]:
        """Chat messages (system/user) shown to the policy for this item."""
        ...

    def verify(self, item: Item, completion: str) -> dict[str, Any]:
        """Raw, JSON-serialisable verifier outcome. Must contain at least `correct` (bool)."""
        ...


def ensure_disjoint(train: Sequence[Item], val: Sequence[Item]) -> None:
    overlap = {i.item_id for i in train} & {i.item_id for i in val}
    if overlap:
        raise ValueError(f"train and held-out items overlap on {len(overlap)} ids, e.g. {sorted(overlap)[:3]}")
