"""Train one version: `python -m evotrainer.train VERSION_DIR`.

The only process that imports torch/transformers/trl/peft. It reads the VersionSpec, trains with
the recording GRPOTrainer, saves the final weights, evaluates k samples per held-out item and
records each stage in the ledger. Killed at any moment, a rerun resumes from the last complete
checkpoint: steps written after it are moved aside (never duplicated), and nothing acknowledged
in the ledger is lost.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

from transformers import TrainerCallback

from .. import paths, policy
from ..envs import build_domain, load_items
from ..errors import EvoTrainerError
from ..schema import DataSelectionSpec, EvalCompleted, StepsAbandoned, TrainingFinished, TrainingStarted, VersionFailed, VersionSpec
from ..status import from_ledger
from ..store import Store, atomic_write_bytes

FINAL_MARKER = ".complete"


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, data):
        for s in self.streams:
            s.write(data)
            s.flush()
        return len(data)

    def flush(self):
        for s in self.streams:
            s.flush()


def latest_complete_checkpoint(ckpt_root: Path) -> tuple[int, Path | None]:
    best, best_path = 0, None
    if ckpt_root.exists():
        for d in ckpt_root.glob("checkpoint-*"):
            if (d / ".complete").exists():
                step = int(d.name.split("-")[1])
                if step > best:
                    best, best_path = step, d
    return best, best_path


def recover(store: Store, version: str, log) -> int:
    """Make the store consistent with the last complete checkpoint; returns the step to resume from."""
    ckpt_root = store.checkpoints_dir(version)
    step, _ = latest_complete_checkpoint(ckpt_root)
    if ckpt_root.exists():
        for d in ckpt_root.glob("checkpoint-*"):
            if not (d / ".complete").exists():
                shutil.rmtree(d, ignore_errors=True)  # cut off mid-save; not evidence
    vstatus = from_ledger(store).versions.get(version)
    acknowledged_evals = set(vstatus.evals) if vstatus else set()
    # Val partitions never acknowledged by an EvalCompleted event (a crash between the file and the
    # event) are moved aside together with every partition past the checkpoint.
    stray_val = [s for s in store.steps(version, "val") if s not in acknowledged_evals and s <= step]
    moved, where = store.abandon_steps_after(version, step, f"resumed from checkpoint at step {step}",
                                             also_val_steps=stray_val)
    if moved:
        store.ledger.append(StepsAbandoned(version=version, after_step=step, steps=tuple(moved), moved_to=where,
                                           actor="trainer", reason="written after the last complete checkpoint"))
        log(f"{version}: moved steps {moved} of the interrupted attempt to {where}")
    return step


def grpo_config(spec: VersionSpec, output_dir: Path, save_checkpoints: bool = True):
    from trl import GRPOConfig

    t = spec.train
    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=t.max_steps,
        per_device_train_batch_size=t.prompts_per_step * t.group_size,
        gradient_accumulation_steps=1,
        num_generations=t.group_size,
        max_completion_length=t.max_completion_length,
        beta=t.beta,
        loss_type=t.loss_type,
        temperature=t.temperature,
        top_p=t.top_p,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        learning_rate=t.learning_rate,
        lr_scheduler_type="constant",  # a version's schedule must not depend on where a resume happened
        scale_rewards=spec.harness.scale_rewards,
        reward_weights=[c.weight for c in spec.harness.rewards],
        seed=spec.seed,
        data_seed=spec.seed,
        logging_steps=1,
        save_strategy="steps" if save_checkpoints else "no",
        save_steps=t.checkpoint_every,
        save_total_limit=2,  # rotation runs before our completion marker: keep the previous complete one
        report_to="none",
        use_cpu=not _cuda(),
        bf16=t.dtype == "bfloat16",
        gradient_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=True,
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def load_policy(spec: VersionSpec, models_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec.policy == "tiny":
        from .tiny import build_tiny_policy

        path = str(build_tiny_policy(policy.tiny_dir(models_dir)))
    else:
        path = policy.resolve(spec.policy, models_dir)
    dtype = torch.bfloat16 if spec.train.dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if spec.train.lora is not None:
        from peft import LoraConfig, get_peft_model

        lo = spec.train.lora
        model = get_peft_model(model, LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout,
                                                 target_modules=list(lo.target_modules), task_type="CAUSAL_LM"))
    return model, tokenizer, path


def train(version_dir: Path, log=print) -> None:
    version_dir = Path(version_dir).resolve()
    store = Store.open(version_dir.parent.parent)
    version = version_dir.name
    spec = store.read_version(version)
    models_dir = paths.models_dir()
    with store.version_lock(version, timeout=30):
        _train_locked(store, version, spec, models_dir, log)


def _train_locked(store: Store, version: str, spec: VersionSpec, models_dir: Path, log) -> None:
    import torch
    import transformers
    from datasets import Dataset

    from ..harness.filters import FilterState, state_from_steps
    from .recorder import BatchScorer, RecordingGRPOTrainer, VerifierCache, reward_functions

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    started = time.monotonic()
    prior = from_ledger(store).versions.get(version)
    attempt = (prior.attempts if prior else 0) + 1
    resume_step = recover(store, version, log)
    store.ledger.append(TrainingStarted(version=version, attempt=attempt, resume_from_step=resume_step,
                                        pid=os.getpid(), actor="trainer"))
    log(f"{version}: attempt {attempt}" + (f", resuming after step {resume_step}" if resume_step else ""))

    domain = build_domain(spec.data, spec.harness.system_prompt)
    train_items, val_items = load_items(spec.data, domain)
    if spec.harness.data_selection != DataSelectionSpec():
        from ..harness.data import select_from_store

        train_items, summary = select_from_store(store, spec.harness.data_selection, train_items,
                                                 parent=spec.parent, seed=spec.seed)
        log(f"{version}: data selection kept {len(train_items)} items ({summary})")
    cache = VerifierCache(domain, {i.item_id: i for i in [*train_items, *val_items]})
    dataset = Dataset.from_list([{"prompt": domain.messages(i), "item_id": i.item_id} for i in train_items])

    model, tokenizer, path = load_policy(spec, models_dir)
    log(f"{version}: policy {path} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters), "
        f"{len(train_items)} train / {len(val_items)} held-out items")
    torch.manual_seed(spec.seed)
    t = spec.train
    final_dir = store.final_dir(version)
    if not (final_dir / FINAL_MARKER).exists():
        scorer = BatchScorer(spec.harness, cache, t.max_completion_length)
        # The group filter's EMA state is derived from the evidence: replay the steps already done.
        state = FilterState()
        if resume_step and spec.harness.group_filter.kind == "std_ema":
            state = state_from_steps(spec.harness.group_filter,
                                     store.rollouts(version, "train", steps=(None, resume_step)).collect())
        extra = {}
        if spec.data.domain == "swe":
            os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
            from .swe_rollout import SweRolloutFunc

            extra["rollout_func"] = SweRolloutFunc(domain, spec, train_items)
        trainer = RecordingGRPOTrainer(
            model=model, processing_class=tokenizer, reward_funcs=reward_functions(scorer), **extra,
            args=grpo_config(spec, store.checkpoints_dir(version)), train_dataset=dataset,
            store=store, version=version, cache=cache, harness=spec.harness, scorer=scorer,
            filter_state=state, log=log,
        )
        trainer.remove_callback(transformers.PrinterCallback)  # our recorder prints one line per step
        if t.eval_every:
            trainer.add_callback(_PeriodicEval(store, version, spec, domain, val_items, tokenizer, log))
        _, ckpt = latest_complete_checkpoint(store.checkpoints_dir(version))
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        _save_final(trainer, tokenizer, final_dir)
        model = trainer.model
    else:
        model, tokenizer, _ = load_policy(spec.model_copy(update={"policy": str(final_dir), "train": t.model_copy(update={"lora": None})}), models_dir)

    done = from_ledger(store).versions[version]
    if t.max_steps not in done.evals:
        log(f"{version}: evaluating {len(val_items)} held-out items x {t.eval_k} samples")
        run_eval(store, version, spec, domain, val_items, model, tokenizer, t.max_steps, log)
    store.remove_checkpoints(version)
    store.ledger.append(TrainingFinished(version=version, steps=t.max_steps, seconds=time.monotonic() - started,
                                         checkpoint=str(final_dir.relative_to(store.root)), actor="trainer"))


def run_eval(store, version, spec, domain, items, model, tokenizer, step, log) -> float:
    import polars as pl

    from .evaluate import sample_completions, val_rows

    t = spec.train
    if spec.data.domain == "swe":
        from .swe_rollout import run_swe_eval

        return run_swe_eval(store, version, spec, domain, items, model, tokenizer, step, log)
    prompts = [tokenizer.apply_chat_template(domain.messages(i), tokenize=False, add_generation_prompt=True)
               for i in items]
    samples, n_prompt = sample_completions(
        model, tokenizer, prompts, t.eval_k, temperature=t.eval_temperature, top_p=t.top_p,
        max_new_tokens=t.eval_max_new_tokens or t.max_completion_length, seed=spec.seed * 1000 + step,
    )
    df = val_rows(campaign=store.campaign.name, version=version, step=step, items=items, prompts=prompts,
                  samples=samples, n_prompt_tokens=n_prompt, domain=domain, harness=spec.harness,
                  max_completion_length=t.eval_max_new_tokens or t.max_completion_length)
    store.append_rollouts(version, "val", step, df)
    per_item = df.group_by("item_id").agg(pl.col("correct").cast(pl.Float64).mean())
    avg = float(per_item["correct"].mean())
    store.ledger.append(EvalCompleted(version=version, step=step, k=t.eval_k, n_items=len(items), avg_at_k=avg,
                                      actor="trainer"))
    log(f"{version}: Avg@{t.eval_k} at step {step} = {avg:.3f} over {len(items)} items")
    return avg


class _PeriodicEval(TrainerCallback):
    """Held-out evaluation every `eval_every` steps (the final step is evaluated after training).

    Runs in on_step_end, after the recorder's flush and before the step's checkpoint, so a crash
    mid-eval leaves a val partition past the checkpoint, which resume moves aside.
    """

    def __init__(self, store, version, spec, domain, items, tokenizer, log):
        self.args = (store, version, spec, domain, items)
        self.tokenizer, self.log = tokenizer, log

    def on_step_end(self, args, state, control, model=None, **kwargs):
        store, version, spec, domain, items = self.args
        step = state.global_step
        if step % spec.train.eval_every or step >= state.max_steps:
            return
        run_eval(store, version, spec, domain, items, model, self.tokenizer, step, self.log)
        model.train()


def _save_final(trainer, tokenizer, final_dir: Path) -> None:
    tmp = final_dir.with_name(final_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = trainer.model
    if hasattr(model, "merge_and_unload"):  # LoRA: the final policy is the merged model
        model = model.merge_and_unload()
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    atomic_write_bytes(tmp / FINAL_MARKER, b"ok\n")
    shutil.rmtree(final_dir, ignore_errors=True)
    os.replace(tmp, final_dir)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m evotrainer.train VERSION_DIR", file=sys.stderr)
        return 2
    parent = os.environ.get("EVOTRAINER_PARENT_PID")
    if parent and os.getppid() != int(parent):
        return 3  # the controller died before we started: do not train unsupervised
    version_dir = Path(argv[0])
    log_path = version_dir / "train.log"
    version_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", buffering=1) as fh:
        out = _Tee(sys.__stdout__, fh)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(_Tee(sys.__stderr__, fh)):
            try:
                train(version_dir, log=print)
            except EvoTrainerError as exc:
                _record_failure(version_dir, str(exc))
                print(f"evotrainer: error: {exc}")
                return 2
            except Exception as exc:
                import traceback

                traceback.print_exc()
                _record_failure(version_dir, f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
                return 1
    return 0


def _record_failure(version_dir: Path, error: str) -> None:
    with contextlib.suppress(Exception):
        store = Store.open(version_dir.resolve().parent.parent)
        store.ledger.append(VersionFailed(version=version_dir.name, error=error, actor="trainer"))
