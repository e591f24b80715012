"""Multi-turn SWE rollouts of an LLM policy, for TRL's GRPOTrainer (`rollout_func`) and for held-out evaluation.

One rollout = one SweEpisode driven by the model: each turn the model writes one message (at most
SweEnvSpec.max_tokens_per_turn tokens), `envs.swe.toolcalls.step` runs its tool call (or records the
malformed call as a failed tool turn) and the observation goes back as the next user message. The
episode ends on submit, at the environment's turn cap / token budget, or when the rollout's tokens
reach TrainConfig.max_completion_length; then the hidden tests score it (`SweEpisode.score`).

Token bookkeeping is exact: the rollout is built as ONE token sequence, prompt ids then, turn after
turn, the generated ids (env_mask 1) and the observation's chat-template ids (env_mask 0), and each
turn is generated from exactly that sequence. So the loss's forward pass over prompt + completion
sees what the sampler saw, and TRL masks the observation tokens out of the loss through `env_mask`.

`rollout_func(prompts, trainer)` receives TRL's batch (each prompt already repeated group_size
times) and returns prompt_ids, completion_ids, logprobs (None: TRL recomputes them), env_mask, and,
per rollout, `swe_verifier`, `swe_summary` and `swe_turns` (JSON), which TRL forwards to the reward
functions and the recorder (the harness scores the verifier; the recorder writes the behaviour
columns and the turns table).
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..envs.base import Item
from ..envs.swe.domain import SweDomain
from ..envs.swe.env import SweEpisode
from ..envs.swe.toolcalls import observation_message, step
from ..schema import VersionSpec

_TASK_RE = re.compile(r"^Task (\S+)", re.MULTILINE)


@dataclass
class Rollout:
    item: Item
    episode: SweEpisode
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    verifier: dict | None = None


class ChatTurns:
    """Token ids of the chat-template text that follows a model message and carries an observation."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        probe = "XYZZY-7"
        base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        a = tokenizer.apply_chat_template([*base, {"role": "assistant", "content": probe}], tokenize=False)
        b = tokenizer.apply_chat_template([*base, {"role": "assistant", "content": probe},
                                           {"role": "user", "content": "OBS"}], tokenize=False,
                                          add_generation_prompt=True)
        if not b.startswith(a) or probe not in a:
            raise ValueError("the chat template does not extend a conversation by appending; multi-turn SWE "
                             "rollouts need a prefix-preserving template (ChatML-like)")
        end_of_message = a[a.index(probe) + len(probe):]  # e.g. "<|im_end|>\n"
        self.eos_text = tokenizer.eos_token or ""
        self.after_eos = end_of_message[len(self.eos_text):] if end_of_message.startswith(self.eos_text) else ""
        self.before_obs, self.after_obs = b[len(a):].split("OBS")

    def observation_ids(self, content: str, ended_with_eos: bool) -> list[int]:
        text = ("" if ended_with_eos else self.eos_text) + self.after_eos + self.before_obs + content + self.after_obs
        return self.tok(text, add_special_tokens=False)["input_ids"]


def task_prompt(domain: SweDomain, item: Item) -> list[dict[str, str]]:
    return domain.messages(item)


def item_of_prompt(prompt, items: dict[str, Item]) -> Item:
    text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    m = _TASK_RE.search(text)
    if m is None or m.group(1) not in items:
        raise ValueError("an SWE prompt must start its user message with 'Task <instance_id>' of a known instance")
    return items[m.group(1)]


def run_rollouts(model, tokenizer, domain: SweDomain, spec: VersionSpec, items: list[Item], workdir: Path,
                 *, temperature: float, top_p: float, max_completion_length: int, uids: list[str] | None = None,
                 generator_seed: int | None = None) -> list[Rollout]:
    """Drive one episode per entry of `items` (repeats allowed) with `model`; batched generation per turn."""
    env = spec.harness.swe
    turns = ChatTurns(tokenizer)
    eos_ids = {tokenizer.eos_token_id}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollouts: list[Rollout] = []
    for n, item in enumerate(items):
        inst, d = domain.instance(item)
        ep = SweEpisode(inst, d, Path(workdir) / f"r{n}", clear_git_log=env.clear_git_log, turn_cap=env.turn_cap,
                        token_budget=env.token_budget, reward_tiers=env.reward_tiers,
                        partial_needs_change=env.partial_needs_change, rollout_uid=(uids[n] if uids else ""))
        ids = tokenizer.apply_chat_template(domain.messages(item), tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        rollouts.append(Rollout(item, ep, list(ids)))
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    was_training = model.training
    model.eval()
    try:
        while True:
            active = [r for r in rollouts if not r.episode.done and len(r.completion_ids) < max_completion_length]
            if not active:
                break
            seqs = [r.prompt_ids + r.completion_ids for r in active]
            width = max(len(s) for s in seqs)
            input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
            attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
            budget = max(1, min(env.max_tokens_per_turn,
                                max(max_completion_length - len(r.completion_ids) for r in active)))
            with torch.no_grad():
                out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                                     max_new_tokens=budget, do_sample=True, temperature=temperature, top_p=top_p,
                                     pad_token_id=pad, eos_token_id=list(eos_ids))
            for r, row in zip(active, out[:, width:].tolist()):
                cap = max_completion_length - len(r.completion_ids)
                new: list[int] = []
                for t in row[:cap]:
                    new.append(t)
                    if t in eos_ids:
                        break
                r.completion_ids += new
                r.env_mask += [1] * len(new)
                res = step(r.episode, tokenizer.decode(new, skip_special_tokens=True))
                room = max_completion_length - len(r.completion_ids)
                if r.episode.done or room <= 0:
                    continue
                obs = turns.observation_ids(observation_message(res)["content"], bool(new) and new[-1] in eos_ids)
                if len(obs) >= room:  # no room left to answer the observation: the rollout ends here
                    r.completion_ids += obs[:room]
                    r.env_mask += [0] * min(len(obs), room)
                    continue
                r.completion_ids += obs
                r.env_mask += [0] * len(obs)
    finally:
        if was_training:
            model.train()
    with ThreadPoolExecutor(max_workers=2) as pool:  # hidden tests: subprocesses, so threads overlap them
        for r, (verifier, _) in zip(rollouts, pool.map(lambda r: r.episode.score(), rollouts)):
            r.verifier = verifier
    return rollouts


class SweRolloutFunc:
    """TRL `rollout_func` for SWE items (see the module docstring)."""

    def __init__(self, domain: SweDomain, spec: VersionSpec, items: list[Item]):
        self.domain, self.spec = domain, spec
        self.items = {i.item_id: i for i in items}

    def __call__(self, prompts, trainer) -> dict:
        items = [item_of_prompt(p, self.items) for p in prompts]
        model = trainer.accelerator.unwrap_model(trainer.model)
        t = self.spec.train
        work = Path(tempfile.mkdtemp(prefix="evotrainer-swe-rollouts-"))
        try:
            rs = run_rollouts(model, trainer.processing_class, self.domain, self.spec, items, work,
                              temperature=t.temperature, top_p=t.top_p, max_completion_length=t.max_completion_length)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return {
            "prompt_ids": [r.prompt_ids for r in rs],
            "completion_ids": [r.completion_ids for r in rs],
            "logprobs": None,
            "env_mask": [r.env_mask for r in rs],
            "swe_verifier": [json.dumps({k: v for k, v in r.verifier.items() if k != "output_tail"}, sort_keys=True)
                             for r in rs],
            "swe_summary": [json.dumps(r.episode.summary(), sort_keys=True) for r in rs],
            "swe_turns": [json.dumps(r.episode.turns) for r in rs],
        }


def run_swe_eval(store, version: str, spec: VersionSpec, domain: SweDomain, items: list[Item], model, tokenizer,
                 step_: int, log) -> float:
    """k episodes per held-out item with the current weights -> val rollouts + turns, Avg@k (EvalCompleted)."""
    import polars as pl

    from ..envs.swe.env import conform_behaviour, rollout_row
    from ..evidence import conform_rollouts, rollout_uid
    from ..harness.rewards import RewardContext, score_frame
    from ..schema import EvalCompleted

    t, campaign = spec.train, store.campaign.name
    jobs = [(g, k, item) for g, item in enumerate(items) for k in range(t.eval_k)]
    uids = [rollout_uid(campaign, version, "val", step_, g, k) for g, k, _ in jobs]
    work = Path(tempfile.mkdtemp(prefix="evotrainer-swe-eval-"))
    try:
        rs = run_rollouts(model, tokenizer, domain, spec, [it for _, _, it in jobs], work,
                          temperature=t.eval_temperature, top_p=t.top_p,
                          max_completion_length=t.eval_max_new_tokens or t.max_completion_length, uids=uids,
                          generator_seed=spec.seed * 1000 + step_)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows, turn_rows = [], []
    for (g, k, item), r in zip(jobs, rs):
        rows.append(rollout_row(r.episode.summary(), r.verifier, r.verifier["reward"], campaign=campaign,
                                version=version, split="val", step=step_, group=g, sample=k, item_id=item.item_id,
                                prompt=tokenizer.decode(r.prompt_ids, skip_special_tokens=False),
                                completion=tokenizer.decode(r.completion_ids, skip_special_tokens=True)))
        turn_rows += r.episode.turn_rows()
    df = conform_behaviour(conform_rollouts(pl.DataFrame(rows, infer_schema_length=None)))
    df = score_frame(spec.harness.rewards, df, RewardContext(max_completion_length=t.max_completion_length))
    if turn_rows:
        store.append_turns(version, "val", step_, pl.DataFrame(turn_rows, infer_schema_length=None))
    store.append_rollouts(version, "val", step_, df)
    avg = float(df.group_by("item_id").agg(pl.col("correct").cast(pl.Float64).mean())["correct"].mean())
    store.ledger.append(EvalCompleted(version=version, step=step_, k=t.eval_k, n_items=len(items), avg_at_k=avg,
                                      actor="trainer"))
    log(f"{version}: Avg@{t.eval_k} at step {step_} = {avg:.3f} over {len(items)} SWE items "
        f"(mean turns {float(df['n_turns'].mean()):.1f})")
    return avg
