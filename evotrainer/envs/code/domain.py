"""The code Domain: generated function-writing tasks for training, HumanEval or generated held-out."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from evotrainer.envs.base import Item
from evotrainer.envs.code.generator import TIERS, check_tiers, generate_items
from evotrainer.envs.code.humaneval import sample_humaneval
from evotrainer.envs.code.verifier import verify_completion

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful Python programmer. Write the complete function, including its `def` line "
    "and any imports it needs, in a single ```python fenced code block. Do not include tests."
)

ValSource = Literal["generated", "humaneval"]


class CodeDomain:
    name = "code"

    def __init__(
        self,
        tiers: Sequence[int] = TIERS,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        val_source: ValSource = "generated",
        timeout_s: float | None = None,
    ) -> None:
        if val_source not in ("generated", "humaneval"):
            raise ValueError(f"code: val_source must be 'generated' or 'humaneval', not {val_source!r}")
        self.tiers: tuple[int, ...] = check_tiers(tiers)
        self.system_prompt = system_prompt
        self.val_source: ValSource = val_source
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"CodeDomain(tiers={self.tiers}, val_source={self.val_source!r})"

    def train_items(self, n: int, seed: int) -> list[Item]:
        return generate_items(n, seed, self.tiers, split="train")

    def val_items(self, n: int, seed: int) -> list[Item]:
        if self.val_source == "humaneval":
            return sample_humaneval(n, seed)
        return generate_items(n, seed, self.tiers, split="val")

    def messages(self, item: Item) -> list[dict[str, str]]:
        if item.source == "humaneval":
            user = (
                "Complete the following Python function. Reply with the complete function "
                "(its signature and body, plus any imports it needs) in a single ```python block.\n\n"
                f"```python\n{item.question.rstrip()}\n```"
            )
        else:
            user = item.question
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": user},
        ]

    def verify(self, item: Item, completion: str) -> dict[str, Any]:
        return verify_completion(item, completion, timeout_s=self.timeout_s)
