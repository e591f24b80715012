"""Seconds per GRPO step: EvoTrainer's recording trainer vs plain TRL GRPOTrainer, same config.

Both runs use the same policy, data, seed and GRPOConfig (checkpointing off in both), so they
sample the same completions; the difference is the recorder: building a row per rollout,
capturing sampling log-probs, writing the step's parquet partition, its metrics and a ledger
event. Runs alternate (plain, recorder, plain, recorder, ...) to spread machine noise; the first
step of each run is warm-up and excluded.

    .venv/bin/python benchmarks/recorder_overhead.py --preset default [--steps 4] [--rounds 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="default")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()

    import torch
    import transformers
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from evotrainer import paths
    from evotrainer.config import preset
    from evotrainer.controller import campaign_spec, next_version_spec
    from evotrainer.envs import build_domain, load_items
    from evotrainer.store import Store
    from evotrainer.train.recorder import RecordingGRPOTrainer, VerifierCache, reward_functions
    from evotrainer.train.runner import grpo_config, load_policy

    transformers.logging.set_verbosity_error()
    cfg = preset(args.preset)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_steps": args.steps})})
    tmp = Path(tempfile.mkdtemp(prefix="evobench-rec-"))

    class StepClock(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_begin(self, args, state, control, **kw):
            if not self.marks:
                self.marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "train_runtime" not in logs:
                self.marks.append(time.perf_counter())

    def one_run(record: bool, tag: str) -> tuple[list[float], float]:
        store = Store.create(tmp / tag, campaign_spec(cfg, tag, args.preset))
        spec = next_version_spec(store, 0)
        store.write_version(spec)
        domain = build_domain(spec.data, spec.harness.system_prompt)
        train_items, val_items = load_items(spec.data, domain)
        cache = VerifierCache(domain, {i.item_id: i for i in [*train_items, *val_items]})
        dataset = Dataset.from_list([{"prompt": domain.messages(i), "item_id": i.item_id} for i in train_items])
        model, tok, _ = load_policy(spec, paths.models_dir())
        torch.manual_seed(spec.seed)
        common = dict(model=model, processing_class=tok, reward_funcs=reward_functions(spec.harness, cache),
                      args=grpo_config(spec, tmp / tag / "out", save_checkpoints=False), train_dataset=dataset)
        trainer = (RecordingGRPOTrainer(**common, store=store, version="v000", cache=cache, harness=spec.harness,
                                        log=lambda s: None) if record else GRPOTrainer(**common))
        trainer.remove_callback(transformers.PrinterCallback)
        clock = StepClock()
        trainer.add_callback(clock)
        trainer.train()
        steps = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
        return steps[1:], getattr(trainer, "recorder_seconds", 0.0)

    plain, rec, rec_own = [], [], []
    for r in range(args.rounds):
        p, _ = one_run(False, f"plain{r}")
        q, own = one_run(True, f"rec{r}")
        plain += p
        rec += q
        rec_own.append(own)
        print(f"round {r}: plain TRL {[round(x, 2) for x in p]} s/step; recorder {[round(x, 2) for x in q]} s/step")
    mp, mr = statistics.mean(plain), statistics.mean(rec)
    n_steps = args.steps * args.rounds
    print(f"preset {args.preset}: plain TRL {mp:.2f} s/step, EvoTrainer recorder {mr:.2f} s/step, "
          f"ratio {mr / mp:.3f} (over {len(plain)} + {len(rec)} steps after warm-up)")
    print(f"recorder's own measured work: {sum(rec_own) / n_steps * 1000:.1f} ms/step "
          f"= {sum(rec_own) / n_steps / mr * 100:.2f}% of a step")


if __name__ == "__main__":
    main()
