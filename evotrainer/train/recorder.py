"""A GRPOTrainer that records every train rollout into the store, step by step.

TRL 1.16 internals this relies on (pinned in pyproject; see ARCHITECTURE.md "Recorder"):
- `_generate_and_score_completions` runs once per optimizer step when
  steps_per_generation == gradient_accumulation_steps and num_iterations == 1 (asserted);
  its rows are in sampler order: the G samples of one prompt are contiguous.
- `_calculate_rewards` returns the per-function rewards; TRL's scalar is their weighted nansum,
  the same arithmetic as `harness.rewards.score`.
- The loss forward (`_get_per_token_logps_and_entropies`, compute_entropy=True) sees the same
  parameters that sampled the batch (one iteration, no off-policy micro-steps), so its per-token
  log-probs ARE the sampling log-probs (temperature-scaled, no top-p renormalisation): recording
  them costs nothing. Rows are tagged with `_rec_row` so the shuffled micro-batches map back.

Write order per optimizer step k (callbacks run in this order in transformers' Trainer):
  on_step_end(k): rollouts k -> on_log(k): metrics k, then StepCompleted(k) in the ledger
  -> checkpoint k (if due) -> generation of step k+1.
So a checkpoint at step k implies every row of steps <= k is on disk and acknowledged.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable

import polars as pl
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from ..envs import Domain, Item
from ..evidence import group_id, rollout_uid
from ..harness import apply_harness
from ..harness import rewards as reward_mod
from ..harness.filters import FilterState
from ..harness.rewards import RewardContext
from ..schema import HarnessSpec, StepCompleted
from ..store import Store

# Tests set this to make "kill mid-version" land between steps deterministically.
_DEBUG_STEP_SLEEP = float(os.environ.get("EVOTRAINER_DEBUG_STEP_SLEEP", "0") or 0)


class VerifierCache:
    """Runs the domain's verifier once per (item, completion) and shares the outcome among components."""

    def __init__(self, domain: Domain, items: dict[str, Item]):
        self.domain = domain
        self.items = items
        self._cache: dict[tuple[str, str], dict] = {}

    def get(self, item_id: str, completion: str) -> dict:
        key = (item_id, completion)
        if key not in self._cache:
            self._cache[key] = self.domain.verify(self.items[item_id], completion)
        return self._cache[key]

    def clear(self) -> None:
        self._cache.clear()


def completion_text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in completion)
    return str(completion)


class BatchScorer:
    """Scores one generation batch once with the harness (`score_frame`); each TRL reward function
    returns its component's column. The same code scores stored rollouts in backtests."""

    def __init__(self, harness: HarnessSpec, cache: VerifierCache, max_completion_length: int):
        self.harness, self.cache = harness, cache
        self.ctx = RewardContext(max_completion_length=max_completion_length)
        self.eos: set[int] = set()  # set by the trainer once it knows its EOS ids
        self._key: tuple | None = None
        self._scored: pl.DataFrame | None = None

    def frame(self, completions, completion_ids, item_id, verifiers=None) -> pl.DataFrame:
        """`verifiers` (JSON strings): outcomes the environment already produced (multi-turn SWE episodes
        scored by their hidden tests), used instead of the domain's verifier on the text."""
        texts = [completion_text(c) for c in completions]
        if verifiers is None:
            verifiers = [json.dumps(self.cache.get(i, t), sort_keys=True) for i, t in zip(item_id, texts)]
        return pl.DataFrame({
            "item_id": list(item_id),
            "completion": texts,
            "verifier": list(verifiers),
            "n_completion_tokens": [len(ids) for ids in completion_ids],
            "truncated": [not (len(ids) > 0 and ids[-1] in self.eos) for ids in completion_ids],
        }, schema_overrides={"n_completion_tokens": pl.Int32})

    def scored(self, completions, completion_ids, item_id, verifiers=None) -> pl.DataFrame:
        key = (id(completions), len(completions))
        if key != self._key:
            self._scored = reward_mod.score_frame(self.harness.rewards, self.frame(completions, completion_ids,
                                                                                  item_id, verifiers), self.ctx)
            self._key = key
        return self._scored


def reward_functions(scorer: BatchScorer) -> list[Callable]:
    """One TRL reward function per harness component (TRL logs each as rewards/<name>/mean)."""
    funcs = []
    for spec in scorer.harness.rewards:
        def fn(prompts, completions, completion_ids, item_id, _name=spec.name, **kwargs):
            col = scorer.scored(completions, completion_ids, item_id, kwargs.get("swe_verifier"))[f"r.{_name}"]
            return [None if v is None else float(v) for v in col.to_list()]

        fn.__name__ = spec.name
        funcs.append(fn)
    return funcs


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler seeds once and has no set_epoch: a resumed run would replay epoch 0's order.
    Re-seeding per epoch makes the prompt order a pure function of (seed, epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed((self.seed or 0) + epoch)


class RecordingGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, store: Store, version: str, cache: VerifierCache, harness: HarnessSpec,
                 scorer: BatchScorer, filter_state: FilterState | None = None,
                 log: Callable[[str], None] = print, **kwargs):
        super().__init__(*args, **kwargs)
        scorer.eos = set(self.eos_token_ids)
        self.scorer = scorer
        self.filter_state = filter_state or FilterState()
        if self.args.steps_per_generation != self.args.gradient_accumulation_steps or self.num_iterations != 1:
            raise ValueError("the recorder needs exactly one generation batch per optimizer step")
        self.store, self.version, self.cache, self.harness, self.log_line = store, version, cache, harness, log
        self._rows: list[dict] | None = None
        self._turns: list[dict] = []  # SWE episodes' turns of the step in flight
        self._logp: torch.Tensor | None = None
        self._loss_rows: torch.Tensor | None = None
        self._stash: dict | None = None
        self._step_started = time.monotonic()
        self.recorder_seconds = 0.0
        self.add_callback(_RecorderCallback(self))

    # -- capture

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rpf = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            self._stash = {"inputs": inputs, "completions": completions, "completion_ids": completion_ids_list,
                           "rewards_per_func": rpf.detach().float().cpu()}
        return rpf

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        if self._rows is not None:
            raise RuntimeError("recorder: the previous step's rows were not flushed before the next generation")
        self._step_started = time.monotonic()
        out = super()._generate_and_score_completions(inputs)
        t0 = time.perf_counter()
        self._turns = []
        self._rows = self._build_rows(out)
        self._apply_harness(out)
        self._logp = torch.full((len(self._rows),), float("nan"))
        out["_rec_row"] = torch.arange(len(self._rows), device=out["advantages"].device)
        self.recorder_seconds += time.perf_counter() - t0
        return out

    def _build_rows(self, out) -> list[dict]:
        s, G = self._stash, self.num_generations
        step = self.state.global_step + 1  # the optimizer step this batch trains
        campaign = self.store.campaign.name
        n = len(s["completion_ids"])
        rpf = s["rewards_per_func"][:n]
        names = [spec.name for spec in self.harness.rewards]
        combined = (rpf * self.reward_weights.float().cpu()).nansum(1)
        prompt_mask = out["prompt_mask"].cpu().bool()
        prompt_ids = out["prompt_ids"].cpu()
        eos = set(self.eos_token_ids)
        advantages = out["advantages"].detach().float().cpu()
        rows = []
        for i in range(n):
            inp = s["inputs"][i]
            ids = s["completion_ids"][i]
            ended = len(ids) > 0 and ids[-1] in eos
            text = completion_text(s["completions"][i])
            episode = "swe_verifier" in inp  # a multi-turn SWE episode (train/swe_rollout.py)
            verdict = json.loads(inp["swe_verifier"]) if episode else self.cache.get(inp["item_id"], text)
            g, k = divmod(i, G)
            p_ids = prompt_ids[i][prompt_mask[i]].tolist()
            row = {
                "rollout_uid": rollout_uid(campaign, self.version, "train", step, g, k),
                "campaign": campaign, "version": self.version, "split": "train", "step": step,
                "item_id": inp["item_id"], "group_id": group_id(self.version, "train", step, g), "sample_idx": k,
                "prompt": self.processing_class.decode(p_ids, skip_special_tokens=False),
                "completion": text, "n_prompt_tokens": len(p_ids), "n_completion_tokens": len(ids),
                "truncated": not ended, "stop_reason": "eos" if ended else "length",
                "reward": float(combined[i]), "verifier": json.dumps(verdict, sort_keys=True),
                "correct": bool(verdict.get("correct")), "advantage": float(advantages[i]),
                "filtered": False, "filter_reason": None, "mean_logprob": math.nan,
                "n_turns": 1, "n_tool_calls": 0,
            }
            for j, name in enumerate(names):
                v = float(rpf[i, j])
                row[f"r.{name}"] = None if math.isnan(v) else v
            if episode:
                summary = json.loads(inp["swe_summary"])
                row["stop_reason"] = summary.pop("stop_reason")
                summary.pop("n_tokens", None)
                row.update(summary)
                self._turns += [{**t, "rollout_uid": row["rollout_uid"]} for t in json.loads(inp["swe_turns"])]
            rows.append(row)
        if any(rows[i]["item_id"] != rows[i - i % G]["item_id"] for i in range(n)):
            raise RuntimeError("recorder: a GRPO group's samples are not contiguous; TRL's sampler changed")
        self.cache.clear()
        return rows

    def _apply_harness(self, out) -> None:
        """Rewards, trajectory and group filters, advantages: the harness functions backtests use.

        TRL already computed rewards with the same components (via BatchScorer) and advantages with
        the same arithmetic; the harness adds the filters. Its advantages replace TRL's (a filtered
        rollout gets 0: no gradient), and the dapo token-mean denominator counts kept tokens only.
        """
        frame = pl.DataFrame(self._rows, infer_schema_length=None)
        scored, self.filter_state = apply_harness(self.harness, frame, self.scorer.ctx, self.filter_state)
        trl_adv = out["advantages"].detach().float().cpu()
        if not (scored["filtered"].any() or self.harness.scale_rewards != "group"):
            # no filter acted: the harness must reproduce TRL's own numbers (one implementation)
            diff = (torch.tensor(scored["advantage"].fill_null(0.0).to_list()) - trl_adv).abs().max().item()
            if diff > 1e-3:
                raise RuntimeError(f"recorder: harness advantages differ from TRL's by {diff:.2e}")
        adv = torch.tensor(scored["advantage"].fill_null(0.0).to_list(), dtype=out["advantages"].dtype,
                           device=out["advantages"].device)
        out["advantages"] = adv
        keep = torch.tensor((~scored["filtered"]).to_list(), device=out["completion_mask"].device)
        kept_tokens = (out["completion_mask"] * keep[:, None]).sum()
        out["num_items_in_batch"] = kept_tokens.to(out["num_items_in_batch"].dtype) if torch.is_tensor(
            out["num_items_in_batch"]) else kept_tokens
        for row, reward, adv_v, filt, why in zip(self._rows, scored["reward"], scored["advantage"],
                                                  scored["filtered"], scored["filter_reason"]):
            row.update(reward=reward, advantage=adv_v, filtered=bool(filt), filter_reason=why)
        for name in [c.name for c in self.harness.rewards]:
            for row, v in zip(self._rows, scored[f"r.{name}"]):
                row[f"r.{name}"] = v

    def _compute_loss(self, model, inputs):
        self._loss_rows = inputs.get("_rec_row") if model.training else None
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._loss_rows = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        res = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                         *args, **kwargs)
        idx = self._loss_rows
        if idx is not None and kwargs.get("compute_entropy") and self._logp is not None:
            mask = attention_mask[:, -logits_to_keep:].float()
            mean = (res[0].detach().float() * mask).sum(1) / mask.sum(1).clamp(min=1)
            self._logp[idx.cpu()] = mean.cpu()
            self._loss_rows = None
        return res

    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        if isinstance(sampler, RepeatSampler) and sampler.shuffle:
            sampler.__class__ = EpochSeededRepeatSampler
        return sampler

    # -- flush

    def flush_rollouts(self) -> None:
        if self._rows is None:
            return
        t0 = time.perf_counter()
        step = self._rows[0]["step"]
        if step != self.state.global_step:
            raise RuntimeError(f"recorder: rows of step {step} flushed at step {self.state.global_step}")
        df = pl.DataFrame(self._rows, infer_schema_length=None).with_columns(
            pl.Series("mean_logprob", self._logp.tolist(), dtype=pl.Float64)
        )
        if self._turns:  # turns first: a step's rollouts on disk imply its turns are
            self.store.append_turns(self.version, "train", step, pl.DataFrame(self._turns, infer_schema_length=None))
            self._turns = []
        if "n_edits" in df.columns:
            from ..envs.swe.env import conform_behaviour
            from ..evidence import conform_rollouts

            df = conform_behaviour(conform_rollouts(df))
        self.store.append_rollouts(self.version, "train", step, df)
        self._pending = (step, len(self._rows), float(df["reward"].mean()),
                         float(df["correct"].cast(pl.Float64).mean()))
        self._rows, self._logp = None, None
        self.recorder_seconds += time.perf_counter() - t0

    def flush_metrics(self, logs: dict) -> None:
        t0 = time.perf_counter()
        step = self.state.global_step
        values = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        pending = getattr(self, "_pending", None)
        if pending is None or pending[0] != step:
            return  # a log call without a new optimizer step (e.g. the final summary)
        values["evotrainer/recorder_seconds"] = self.recorder_seconds
        self.store.append_metrics(self.version, step, values, source="trl",
                                  sources={"evotrainer/recorder_seconds": "evotrainer"})
        _, n, reward, correct = pending
        seconds = time.monotonic() - self._step_started
        self.store.ledger.append(StepCompleted(version=self.version, step=step, n_rollouts=n, reward_mean=reward,
                                               correct_mean=correct, seconds=seconds, actor="trainer"))
        self._pending = None
        self.recorder_seconds += time.perf_counter() - t0
        self.log_line(
            f"{self.version} step {step}/{self.state.max_steps}  reward {reward:.3f}  correct {correct:.3f}  "
            f"len {values.get('completions/mean_length', float('nan')):.1f}  "
            f"zero-std groups {values.get('frac_reward_zero_std', float('nan')):.2f}  {seconds:.1f}s"
        )


class _RecorderCallback(TrainerCallback):
    def __init__(self, trainer: RecordingGRPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.flush_rollouts()
        if _DEBUG_STEP_SLEEP:
            time.sleep(_DEBUG_STEP_SLEEP)  # tests only: widens the window for a kill between steps
        if state.global_step >= state.max_steps:
            control.should_save = True  # always leave a resumable checkpoint at the last step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "train_runtime" not in logs:
            self.trainer.flush_metrics(logs)

    def on_save(self, args, state, control, **kwargs):
        # Written last: a checkpoint without this marker was cut off mid-save and is never resumed from.
        ckpt = f"{args.output_dir}/checkpoint-{state.global_step}"
        with open(f"{ckpt}/.complete", "w") as fh:
            fh.write(str(state.global_step))
