"""The math Domain: procedural arithmetic tiers, boxed-answer prompting, math-verify checking."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evotrainer.envs.base import Item
from evotrainer.envs.math.generator import check_tiers, generate_items
from evotrainer.envs.math.verifier import verify_completion

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful math solver. Reason briefly, step by step, then give the final answer "
    "as a number in \\boxed{}, for example \\boxed{42}."
)


class MathDomain:
    name = "math"

    def __init__(self, tiers: Sequence[int] = (0,), system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> None:
        self.tiers: tuple[int, ...] = check_tiers(tiers)
        self.system_prompt = system_prompt

    def __repr__(self) -> str:
        return f"MathDomain(tiers={self.tiers})"

    def train_items(self, n: int, seed: int) -> list[Item]:
        return generate_items(n, seed, self.tiers, split="train")

    def val_items(self, n: int, seed: int) -> list[Item]:
        return generate_items(n, seed, self.tiers, split="val")

    def messages(self, item: Item) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": item.question},
        ]

    def verify(self, item: Item, completion: str) -> dict[str, Any]:
        return verify_completion(item.answer, completion)
