"""Held-out evaluation: k sampled completions per item, scored by the harness, stored as split=val.

Sampling uses the same temperature scaling as training, and `mean_logprob` is the mean
log-probability of the sampled tokens under the temperature-scaled distribution (what TRL
computes for the sampling policy), so train and val log-probs are comparable.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import polars as pl
import torch

from ..envs import Domain, Item
from ..evidence import group_id, rollout_uid
from ..harness import rewards as reward_mod
from ..harness.rewards import RewardContext
from ..schema import HarnessSpec


@dataclass(frozen=True)
class Sample:
    text: str
    n_tokens: int
    truncated: bool
    stop_reason: str
    mean_logprob: float


@torch.no_grad()
def sample_completions(
    model, tokenizer, prompts: list[str], k: int, *, temperature: float, top_p: float, max_new_tokens: int,
    batch_prompts: int = 8, seed: int = 0,
) -> tuple[list[list[Sample]], list[int]]:
    """k samples for each prompt (already chat-formatted text). Returns samples and prompt token counts.

    Runs under a forked RNG so that evaluating mid-training does not shift the training samples.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _sample(model, tokenizer, prompts, k, temperature=temperature, top_p=top_p,
                       max_new_tokens=max_new_tokens, batch_prompts=batch_prompts)


def _sample(model, tokenizer, prompts, k, *, temperature, top_p, max_new_tokens, batch_prompts):
    model.eval()
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))
    out: list[list[Sample]] = []
    n_prompt_tokens: list[int] = []
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(prompts), batch_prompts):
            chunk = prompts[start : start + batch_prompts]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            n_prompt_tokens.extend(int(m.sum()) for m in enc["attention_mask"])
            gen = model.generate(
                **enc, do_sample=True, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                num_return_sequences=k, output_logits=True, return_dict_in_generate=True, pad_token_id=pad_id,
                eos_token_id=list(eos_ids),
            )
            seqs = gen.sequences[:, enc["input_ids"].shape[1] :]
            logits = torch.stack(gen.logits, dim=1).float() / temperature  # (B*k, T, V)
            logps = torch.log_softmax(logits, dim=-1).gather(-1, seqs[:, : logits.shape[1], None]).squeeze(-1)
            for p in range(len(chunk)):
                samples = []
                for j in range(k):
                    row = p * k + j
                    ids = seqs[row].tolist()
                    n = len(ids)
                    stop = "length"
                    for t, tok in enumerate(ids):
                        if tok in eos_ids:
                            n, stop = t + 1, "eos"
                            break
                    lp = logps[row, :n]
                    mean_lp = float(lp.mean()) if n else math.nan
                    text = tokenizer.decode(ids[:n], skip_special_tokens=True)
                    samples.append(Sample(text, n, stop == "length", stop, mean_lp))
                out.append(samples)
    finally:
        tokenizer.padding_side = old_side
    return out, n_prompt_tokens


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def val_rows(
    *, campaign: str, version: str, step: int, items: list[Item], prompts: list[str], samples: list[list[Sample]],
    n_prompt_tokens: list[int], domain: Domain, harness: HarnessSpec, max_completion_length: int,
) -> pl.DataFrame:
    rows = []
    for g, (item, prompt, group, npt) in enumerate(zip(items, prompts, samples, n_prompt_tokens)):
        for s, smp in enumerate(group):
            verdict = domain.verify(item, smp.text)
            rows.append({
                "rollout_uid": rollout_uid(campaign, version, "val", step, g, s),
                "campaign": campaign, "version": version, "split": "val", "step": step,
                "item_id": item.item_id, "group_id": group_id(version, "val", step, g), "sample_idx": s,
                "prompt": prompt, "completion": smp.text, "n_prompt_tokens": npt,
                "n_completion_tokens": smp.n_tokens, "truncated": smp.truncated, "stop_reason": smp.stop_reason,
                "verifier": json.dumps(verdict, sort_keys=True), "correct": bool(verdict["correct"]),
                "advantage": None, "filtered": False, "filter_reason": None, "mean_logprob": smp.mean_logprob,
                "n_turns": 1, "n_tool_calls": 0,
            })
    frame = pl.DataFrame(rows, infer_schema_length=None)
    # the same scoring code as training and backtests
    return reward_mod.score_frame(harness.rewards, frame, RewardContext(max_completion_length=max_completion_length))
