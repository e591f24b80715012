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


# --------------------------------------------------------------------------- planted pathologies

# A rate is a float, or (start, end) ramped linearly over the steps given.

_VOCAB = np.array([f"w{i}" for i in range(4000)])


def _ramp(rate, i: int, n: int) -> float:
    if isinstance(rate, tuple):
        a, b = rate
        return float(a + (b - a) * (i / (n - 1) if n > 1 else 0.0))
    return float(rate)


def planted_rollouts(
    campaign: str, version: str, *, steps, n_groups: int, group_size: int, seed: int,
    dead_groups=0.0, format_fail=0.0, truncation=0.0, saturation=0.0, length_gaming: bool = False,
    reward_hacking: bool = False, logprob=None, repetition=0.0, split: str = "train",
    identical=0.0, mean_length: int = 80, correct_share: float = 0.5, max_tokens: int | None = None,
) -> pl.DataFrame:
    """Contract rows (one partition per step) with each pathology planted at a known, exact rate.

    `steps`: an int n (steps 1..n) or the step numbers. Every rate is a float, or (start, end) ramped
    linearly over the steps. Healthy defaults: every group mixes right and wrong (exactly
    round(correct_share * group_size) correct, at least one of each), format always ok, nothing
    truncated, random-word completions (distinct-bigram ratio ~1), log-probs in [-0.6, -0.3].

    Items are the same at every step (item g of the split), so per-item rates are exact too.
    Per step, groups are drawn from one seed-fixed permutation, so a shrinking rate keeps a subset:
      saturation   share of groups (items) whose samples are all correct  -> dead, saturated
      dead_groups  share of groups all wrong (format ok)                   -> dead, never solved
      identical    share of groups whose completions are byte-identical (all wrong) -> dead, duplicates
    so the planted DGR = saturation + dead_groups + identical.
      format_fail  share of ALL rollouts with format_ok false, taken from mixed groups only (so dead
                   groups stay dead); raises if the mixed groups have too few rows
      truncation   share of rollouts truncated at max_tokens (default 4 * mean_length)
      repetition   share of rollouts whose completion loops one 3-word phrase (distinct-bigram ratio < 0.2)
      logprob      None: healthy; else every rollout's mean_logprob = rate +- 0.005 (float or ramp)
      length_gaming  correct rollouts are mean_length tokens longer (length-correctness corr ~0.6)
      reward_hacking a shaped component `r.bonus` (weight 0.5, same value within a group) whose share of
                   groups ramps 0 -> 1 over the steps while correctness stays fixed
    Reward = correct + 0.1 * format_ok (+ 0.5 * bonus).
    """
    step_list = list(range(1, steps + 1)) if isinstance(steps, int) else [int(s) for s in steps]
    if split not in evidence.SPLITS:
        raise ValueError(f"unknown split {split!r}")
    max_tokens = max_tokens or 4 * mean_length
    G, n = group_size, n_groups * group_size
    perm = np.random.default_rng([seed, 1]).permutation(n_groups)
    prefix = "t" if split == "train" else "e"
    frames = []
    for i, step in enumerate(step_list):
        rng = np.random.default_rng([seed, step, 0 if split == "train" else 1])
        n_s = round(_ramp(saturation, i, len(step_list)) * n_groups)
        n_d = round(_ramp(dead_groups, i, len(step_list)) * n_groups)
        n_i = round(_ramp(identical, i, len(step_list)) * n_groups)
        if n_s + n_d + n_i > n_groups:
            raise ValueError("saturation + dead_groups + identical exceed 1")
        kind = np.zeros(n_groups, dtype=np.int8)  # 0 mixed, 1 saturated, 2 dead-wrong, 3 identical
        kind[perm[:n_s]], kind[perm[n_s:n_s + n_d]], kind[perm[n_s + n_d:n_s + n_d + n_i]] = 1, 2, 3
        g = np.repeat(np.arange(n_groups), G)
        s = np.tile(np.arange(G), n_groups)
        k_correct = min(max(round(correct_share * G), 1), G - 1)
        mixed = (rng.random((n_groups, G)).argsort(axis=1) < k_correct).ravel()
        correct = np.where(kind[g] == 1, True, np.where(kind[g] == 0, mixed, False))
        fmt = np.ones(n, dtype=bool)
        n_fail = round(_ramp(format_fail, i, len(step_list)) * n)
        pool = np.flatnonzero(kind[g] == 0)
        if n_fail > pool.size:
            raise ValueError(f"format_fail needs {n_fail} rows of mixed groups, only {pool.size} exist")
        fmt[rng.choice(pool, n_fail, replace=False)] = False
        bonus = np.zeros(n)
        if reward_hacking:
            share = i / (len(step_list) - 1) if len(step_list) > 1 else 1.0
            bonus_groups = rng.choice(n_groups, round(share * n_groups), replace=False)
            bonus = np.isin(g, bonus_groups).astype(float)
        reward = correct.astype(float) + 0.1 * fmt + 0.5 * bonus
        length = rng.integers(mean_length // 2, mean_length * 3 // 2 + 1, n)
        if length_gaming:
            length = length + correct * mean_length
        trunc = np.zeros(n, dtype=bool)
        trunc[rng.choice(n, round(_ramp(truncation, i, len(step_list)) * n), replace=False)] = True
        length = np.where(trunc, max_tokens, np.minimum(length, max_tokens - 1))
        rep = np.zeros(n, dtype=bool)
        rep[rng.choice(n, round(_ramp(repetition, i, len(step_list)) * n), replace=False)] = True
        texts = []
        for r in range(n):
            if rep[r]:
                phrase = " ".join(_VOCAB[rng.integers(0, _VOCAB.size, 3)])
                words = max(int(length[r]), 16)
                texts.append(" ".join([phrase] * (words // 3 + 1)))
            else:
                texts.append(" ".join(_VOCAB[rng.integers(0, _VOCAB.size, int(length[r]))]))
        for gi in np.flatnonzero(kind == 3):
            rows = np.flatnonzero(g == gi)
            for r in rows[1:]:
                texts[r] = texts[rows[0]]
            length[rows] = length[rows[0]]
        if logprob is None:
            lp = -rng.uniform(0.3, 0.6, n)
        else:
            lp = np.minimum(_ramp(logprob, i, len(step_list)) + rng.uniform(-0.005, 0.005, n), -1e-4)
        adv = None
        if split == "train":
            rs = reward.reshape(n_groups, G)
            std = rs.std(axis=1, ddof=1)
            adv = ((rs - rs.mean(axis=1, keepdims=True)) / (std[:, None] + 1e-4)).ravel()
        cols = {
            "rollout_uid": [evidence.rollout_uid(campaign, version, split, step, a, b) for a, b in zip(g, s)],
            "campaign": campaign, "version": version, "split": split, "step": step,
            "item_id": [f"{prefix}-{a:05d}" for a in g],
            "group_id": [evidence.group_id(version, split, step, a) for a in g],
            "sample_idx": s,
            "prompt": [f"Item {prefix}-{a:05d}: what is {a % 97} + {(a * 7) % 89}?" for a in g],
            "completion": [f"{t} \\boxed{{{int(c)}}}" for t, c in zip(texts, correct)],
            "n_prompt_tokens": 20, "n_completion_tokens": length.astype(np.int32),
            "truncated": trunc, "stop_reason": np.where(trunc, "length", "eos"),
            "reward": reward, "r.correctness": correct.astype(float), "r.format": fmt.astype(float),
            "verifier": [json.dumps({"pred": str(int(c)), "gold": "1", "correct": bool(c), "format_ok": bool(f),
                                     "extraction": "boxed" if f else "last_number"}) for c, f in zip(correct, fmt)],
            "correct": correct, "advantage": adv,
            "filtered": False, "filter_reason": None,
            "mean_logprob": lp, "n_turns": 1, "n_tool_calls": 0,
        }
        if reward_hacking:
            cols["r.bonus"] = bonus
        frames.append(pl.DataFrame(cols))
    return evidence.conform_rollouts(pl.concat(frames))


def planted_store(root: str | Path, versions: dict, *, name: str = "planted") -> Store:
    """A temp store whose versions hold planted rollouts (and optionally val rows and metrics).

    versions: {"v000": spec, "v001": spec, ...} in index order; each spec holds planted_rollouts
    keyword arguments for the training rows (defaults: steps=4, n_groups=20, group_size=8, seed=index),
    plus optional "val": keyword arguments for held-out rows (e.g. {"steps": [4], "n_groups": 16}), and
    "metrics": {name: value or [value per step]} written per training step.
    """
    from .controller import next_version_spec
    from .schema import version_name

    store = temp_store(root, name=name)
    for index, (v, spec) in enumerate(versions.items()):
        if v != version_name(index):
            raise ValueError(f"versions must be v000, v001, ... in order; got {v} at position {index}")
        store.write_version(next_version_spec(store, index))
        spec = dict(spec)
        val, metrics = spec.pop("val", None), spec.pop("metrics", None)
        kw = {"steps": 4, "n_groups": 20, "group_size": 8, "seed": index} | spec
        train = planted_rollouts(name, v, split="train", **kw)
        for (step,), part in train.partition_by("step", as_dict=True, maintain_order=True).items():
            store.append_rollouts(v, "train", int(step), part)
        if val is not None:
            vkw = {"n_groups": kw["n_groups"], "group_size": kw["group_size"], "seed": kw["seed"]} | dict(val)
            vkw.setdefault("steps", [max(train["step"])])
            vrows = planted_rollouts(name, v, split="val", **vkw)
            for (step,), part in vrows.partition_by("step", as_dict=True, maintain_order=True).items():
                store.append_rollouts(v, "val", int(step), part)
        if metrics:
            steps = sorted(train["step"].unique().to_list())
            for j, step in enumerate(steps):
                values = {k: (x[j] if isinstance(x, (list, tuple)) else x) for k, x in metrics.items()}
                store.append_metrics(v, step, {k: float(x) for k, x in values.items()}, source="trl")
    return store


def swe_campaign_toml(swe_dir: str | Path, policy: str = "scripted:honest_fixer", *, versions: int | None = None,
                      gates: tuple[str, ...] = (), n_train: int = 3, n_val: int = 2, max_steps: int = 1,
                      prompts_per_step: int = 2, group_size: int = 2, eval_k: int = 2, turn_cap: int = 12) -> str:
    """A small SWE campaign config (TOML, for `evotrainer run CONFIG --preset smoke`): built instances
    at `swe_dir`, the environment's tiered reward, one short step per version."""
    head = [f'policy = "{policy}"']
    if versions is not None:
        head.append(f"versions = {versions}")
    if gates:
        head.append("gates = [" + ", ".join(f'"{g}"' for g in gates) + "]")
    return "\n".join([
        *head, "[data]", 'domain = "swe"', f'swe_dir = "{swe_dir}"', f"n_train = {n_train}", f"n_val = {n_val}",
        "[train]", f"max_steps = {max_steps}", f"prompts_per_step = {prompts_per_step}",
        f"group_size = {group_size}", f"eval_k = {eval_k}",
        "[harness]", 'rewards = [{name = "env_reward", weight = 1.0}]', "[harness.swe]", f"turn_cap = {turn_cap}",
    ]) + "\n"
