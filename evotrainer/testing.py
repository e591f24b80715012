"""Public fakes for tests and demos: synthetic rollouts in the evidence contract and temp stores.

Everything here is core (no torch). The tiny random-initialised policy lives in
`evotrainer.train.tiny` because building it needs torch.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from . import evidence
from .config import PRESETS
from .controller import campaign_spec
from .schema import CampaignSpec
from .store import Store


def synthetic_rollouts(
    campaign: str, version: str, split: str, step: int, n_groups: int, group_size: int,
    seed: int = 0, p_correct: float = 0.3, text_len: int = 200, random_text: bool = False,
) -> pl.DataFrame:
    """Rows that satisfy the rollout contract, with random but plausible values.

    `random_text` fills prompts and completions with random words (realistic entropy for
    benchmarks: repeated filler would compress to nothing and flatter the write path).
    """
    rng = np.random.default_rng([seed, step, n_groups])
    n = n_groups * group_size
    g = np.repeat(np.arange(n_groups), group_size)
    s = np.tile(np.arange(group_size), n_groups)
    correct = rng.random(n) < p_correct
    fmt = rng.random(n) < 0.5
    reward = correct.astype(float) + 0.1 * fmt
    filler = "x" * max(0, text_len - 40)
    if random_text:
        words = np.array([f"w{i}" for i in range(2000)] + list("0123456789+-=") + ["answer", "\\boxed{", "}"])
        n_words = max(1, text_len // 5)
        texts = [" ".join(rng.choice(words, n_words)) for _ in range(n + n_groups)]
        prompts_txt = [f"What is {a % 10} + {(a * 3) % 10}? {texts[n + a]}" for a in g]
        completions_txt = [f"{texts[i]} \\boxed{{{s[i]}}}" for i in range(n)]
    else:
        prompts_txt = [f"What is {a % 10} + {(a * 3) % 10}? {filler}" for a in g]
        completions_txt = [f"The answer is \\boxed{{{b}}}. {filler}" for b in s]
    items = [f"m-{(step * 7919 + gi) % 5000:06d}" for gi in g]
    adv = np.zeros(n)
    for gi in range(n_groups):
        m = g == gi
        r = reward[m]
        adv[m] = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
    return pl.DataFrame(
        {
            "rollout_uid": [evidence.rollout_uid(campaign, version, split, step, a, b) for a, b in zip(g, s)],
            "campaign": campaign, "version": version, "split": split, "step": step,
            "item_id": items,
            "group_id": [evidence.group_id(version, split, step, a) for a in g],
            "sample_idx": s,
            "prompt": prompts_txt,
            "completion": completions_txt,
            "n_prompt_tokens": rng.integers(20, 60, n), "n_completion_tokens": rng.integers(5, 64, n),
            "truncated": rng.random(n) < 0.1, "stop_reason": "eos",
            "reward": reward, "r.correctness": correct.astype(float), "r.format": fmt.astype(float),
            "verifier": [json.dumps({"correct": bool(c), "format_ok": bool(f)}) for c, f in zip(correct, fmt)],
            "correct": correct, "advantage": adv if split == "train" else None,
            "filtered": False, "filter_reason": None,
            "mean_logprob": -rng.random(n), "n_turns": 1, "n_tool_calls": 0,
        }
    )


def temp_store(root: str | Path, name: str = "test", preset: str = "smoke") -> Store:
    spec: CampaignSpec = campaign_spec(PRESETS[preset], name, preset)
    return Store.create(Path(root), spec)
