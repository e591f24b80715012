"""What every domain provides: items, prompts and a verifier whose raw outcomes are JSON.

The verifier's output is stored verbatim in the rollout's `verifier` column, so reward
components (and backtests) can be re-computed offline from it without re-running the check.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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


def split_by_hash(item_id: str, modulus: int = 10) -> str:
    """'val' for about 1 in `modulus` items, decided by the item's content-hash id alone, so a
    generator's train and held-out sets can never overlap whatever the seeds and sizes."""
    digest = item_id.split("-", 1)[-1]
    return "val" if int(digest, 16) % modulus == 0 else "train"


def distinct_in_split(items: Iterable[Item], split: str, split_of: Callable[[str], str]) -> tuple[Item, ...]:
    """The first occurrence of each item id that `split_of` assigns to `split`, in input order."""
    seen: set[str] = set()
    out: list[Item] = []
    for it in items:
        if it.item_id in seen or split_of(it.item_id) != split:
            continue
        seen.add(it.item_id)
        out.append(it)
    return tuple(out)


def check_tiers(tiers: Sequence[int], valid: Sequence[int], domain: str) -> tuple[int, ...]:
    ts = tuple(dict.fromkeys(int(t) for t in tiers))
    if not ts:
        raise ValueError(f"{domain}: at least one tier is required")
    bad = [t for t in ts if t not in valid]
    if bad:
        raise ValueError(f"{domain}: unknown tier(s) {bad}; valid tiers are {list(valid)}")
    return ts


def ensure_disjoint(train: Sequence[Item], val: Sequence[Item]) -> None:
    overlap = {i.item_id for i in train} & {i.item_id for i in val}
    if overlap:
        raise ValueError(f"train and held-out items overlap on {len(overlap)} ids, e.g. {sorted(overlap)[:3]}")
