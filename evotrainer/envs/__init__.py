"""Domains: where items come from and how completions are verified."""
from __future__ import annotations

from ..schema import DataSpec
from .base import Domain, Item, ensure_disjoint


def build_domain(data: DataSpec, system_prompt: str | None = None) -> Domain:
    if data.domain == "math":
        from .math import DEFAULT_SYSTEM_PROMPT, MathDomain

        return MathDomain(tiers=data.tiers, system_prompt=system_prompt or DEFAULT_SYSTEM_PROMPT)
    if data.domain == "code":
        from .code import DEFAULT_SYSTEM_PROMPT as CODE_PROMPT
        from .code import CodeDomain

        return CodeDomain(tiers=data.tiers, system_prompt=system_prompt or CODE_PROMPT, val_source=data.val_source)
    if data.domain == "swe":
        from .swe.domain import SweDomain

        return SweDomain(data.swe_dir, system_prompt)
    raise ValueError(f"unknown domain {data.domain!r}")  # unreachable: DataSpec validates the literal


def load_items(data: DataSpec, domain: Domain) -> tuple[list[Item], list[Item]]:
    """Train and held-out items for a DataSpec: external JSONL where given, else generated."""
    from .math import load_jsonl

    if data.domain == "swe":
        if data.train_jsonl or data.val_jsonl:
            raise ValueError("swe items are built instances (data.swe_dir), not JSONL files")
        train, val = domain.split_items(data.n_train, data.n_val, data.seed)  # type: ignore[attr-defined]
        ensure_disjoint(train, val)
        return train, val
    train = load_jsonl(data.train_jsonl)[: data.n_train] if data.train_jsonl else domain.train_items(data.n_train, data.seed)
    val = load_jsonl(data.val_jsonl)[: data.n_val] if data.val_jsonl else domain.val_items(data.n_val, data.seed)
    ensure_disjoint(train, val)
    return train, val


__all__ = ["Domain", "Item", "build_domain", "ensure_disjoint", "load_items"]
