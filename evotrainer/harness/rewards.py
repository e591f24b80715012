"""Reward components and the composer.

A component is a plain function registered by name:

    component(verifier: dict, completion: str) -> float | None

It reads the verifier's raw outcome (stored verbatim in the rollout's `verifier` column), so a
backtest can re-score stored rollouts offline with exactly the code training used. `None` means
"not applicable" and is stored as null; it counts as 0 in the weighted total.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..schema import RewardComponentSpec

RewardComponent = Callable[[Mapping[str, Any], str], "float | None"]

_REGISTRY: dict[str, RewardComponent] = {}


def register(name: str) -> Callable[[RewardComponent], RewardComponent]:
    def deco(fn: RewardComponent) -> RewardComponent:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward component {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def get(name: str) -> RewardComponent:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown reward component {name!r}; known: {sorted(_REGISTRY)}") from None


def known() -> list[str]:
    return sorted(_REGISTRY)


@register("correctness")
def correctness(verifier: Mapping[str, Any], completion: str) -> float:
    """1 for a correct final answer, else 0 (the binary CR of the paper)."""
    return 1.0 if verifier.get("correct") else 0.0


@register("format")
def format_ok(verifier: Mapping[str, Any], completion: str) -> float | None:
    """1 when the answer is given in the required format (e.g. \\boxed{}), else 0."""
    if "format_ok" not in verifier:
        return None
    return 1.0 if verifier["format_ok"] else 0.0


def score(
    components: Sequence[RewardComponentSpec], verifier: Mapping[str, Any], completion: str
) -> tuple[float, dict[str, float | None]]:
    """Weighted total and each component's raw value (before weighting)."""
    values: dict[str, float | None] = {}
    total = 0.0
    for spec in components:
        value = get(spec.name)(verifier, completion)
        if value is not None:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"reward component {spec.name!r} returned {value}")
            total += spec.weight * value
        values[spec.name] = value
    return total, values
