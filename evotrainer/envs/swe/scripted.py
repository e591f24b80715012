"""Train a version whose policy is a scripted SWE policy: `python -m evotrainer.envs.swe.scripted VERSION_DIR`.

A campaign with `policy = "scripted:<name>"` (a name of policies.POLICIES: honest_fixer, leaker,
echo_trapper, abandoner, test_tamperer) runs through the same loop as an LLM policy: the controller starts this
process instead of `python -m evotrainer.train`, and it writes the same evidence: per step,
`prompts_per_step` instances x `group_size` episodes as train rollouts (behaviour columns included)
and their turns, scored by the harness (`apply_harness`: reward components, filters, advantages -
the one implementation training and backtests share); then `eval_k` episodes per held-out
instance as val rollouts and Avg@k; ledger events as the trainer writes them. Nothing is learned:
a scripted version measures the environment and the harness (the git leak, the veto, an env
intervention), which is what tests and demos need, with no LLM and no torch.

The SweEnvSpec of the version's harness configures every episode (clear_git_log, turn cap, token
budget, reward tiers). Killed mid-way, a rerun keeps the steps whose rollouts are on disk and
moves the rest aside (StepsAbandoned), as the trainer does.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from ...errors import EvoTrainerError
from ...evidence import conform_rollouts, rollout_uid
from ...schema import (
    EvalCompleted,
    StepCompleted,
    StepsAbandoned,
    TrainingFinished,
    TrainingStarted,
    VersionFailed,
    VersionSpec,
)
from ...status import from_ledger
from ...store import Store, atomic_write_bytes
from ..base import Item
from .domain import SweDomain
from .env import SweEpisode, conform_behaviour, rollout_row
from .policies import POLICIES

PREFIX = "scripted:"
MARKER = "scripted-policy.json"  # in a scripted version's final dir: which policy it "is"


def is_scripted(policy: str) -> bool:
    return policy.startswith(PREFIX) or (Path(policy) / MARKER).is_file()


def policy_name(policy: str) -> str:
    """The scripted policy's name from "scripted:<name>" or from a scripted version's final dir."""
    if policy.startswith(PREFIX):
        name = policy[len(PREFIX):]
    else:
        name = json.loads((Path(policy) / MARKER).read_text())["policy"]
    if name not in POLICIES:
        raise EvoTrainerError(f"unknown scripted policy {name!r}; choose one of {', '.join(sorted(POLICIES))}")
    return name


def episode(domain: SweDomain, spec: VersionSpec, item: Item, workdir: Path, uid: str) -> SweEpisode:
    inst, d = domain.instance(item)
    env = spec.harness.swe
    return SweEpisode(inst, d, workdir, clear_git_log=env.clear_git_log, turn_cap=env.turn_cap,
                      token_budget=env.token_budget, reward_tiers=env.reward_tiers,
                      partial_needs_change=env.partial_needs_change, rollout_uid=uid)


def _run_one(domain, spec, policy, item, split, step, group, sample, campaign, version, tmp: Path):
    uid = rollout_uid(campaign, version, split, step, group, sample)
    work = tmp / f"{split}-{step}-{group}-{sample}"
    try:
        ep = episode(domain, spec, item, work, uid)
        policy(ep)
        verifier, env_reward = ep.score()
        row = rollout_row(ep.summary(), verifier, env_reward, campaign=campaign, version=version, split=split,
                          step=step, group=group, sample=sample, item_id=item.item_id, prompt=item.question,
                          completion=_transcript(ep.turns))
        return row, ep.turn_rows()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _transcript(turns: list[dict]) -> str:
    """The rollout's `completion`: one line per turn (the turns table holds the full record)."""
    out = []
    for t in turns:
        if t["role"] == "tool":
            out.append(f"[{t['tool_name']} {'ok' if t['tool_ok'] else 'FAILED'}] {t['tool_args'] or ''}")
        else:
            out.append(f"[{t['role']}] {(t['text'] or '')[:200]}")
    return "\n".join(out)


def run_batch(domain, spec, policy, jobs, campaign, version, workers: int = 2) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Episodes for (item, split, step, group, sample) jobs, in parallel; (rollout rows, turn rows)."""
    with tempfile.TemporaryDirectory(prefix=f"evotrainer-swe-{version}-") as tmp, \
            ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futs = [pool.submit(_run_one, domain, spec, policy, *job, campaign, version, Path(tmp)) for job in jobs]
        results = [f.result() for f in futs]
    rows = pl.DataFrame([r for r, _ in results], infer_schema_length=None)
    turns = pl.DataFrame([t for _, ts in results for t in ts], infer_schema_length=None)
    return conform_behaviour(conform_rollouts(rows)), turns


def train_scripted(store: Store, version: str, log=print) -> None:
    from ...harness import apply_harness
    from ...harness.filters import FilterState, state_from_steps
    from ...harness.rewards import RewardContext, score_frame

    spec = store.read_version(version)
    name = policy_name(spec.policy)
    policy = POLICIES[name]
    t, campaign = spec.train, store.campaign.name
    started = time.monotonic()
    with store.version_lock(version, timeout=30):
        prior = from_ledger(store).versions.get(version)
        attempt = (prior.attempts if prior else 0) + 1
        done_steps = sorted(store.steps(version, "train"))
        resume = 0
        while resume + 1 in done_steps:
            resume += 1
        acknowledged = set(prior.evals) if prior else set()
        stray_val = [s for s in store.steps(version, "val") if s not in acknowledged]
        moved, where = store.abandon_steps_after(version, resume, f"scripted rerun after step {resume}",
                                                 also_val_steps=stray_val)
        if moved:
            store.ledger.append(StepsAbandoned(version=version, after_step=resume, steps=tuple(moved),
                                               moved_to=where, actor="trainer",
                                               reason="written by an interrupted attempt"))
        store.ledger.append(TrainingStarted(version=version, attempt=attempt, resume_from_step=resume,
                                            pid=os.getpid(), actor="trainer"))
        domain = SweDomain(spec.data.swe_dir, spec.harness.system_prompt)
        from .. import load_items

        train_items, val_items = load_items(spec.data, domain)
        log(f"{version}: scripted policy {name!r} on {len(train_items)} train / {len(val_items)} held-out "
            f"SWE instances (clear_git_log={spec.harness.swe.clear_git_log})")
        ctx = RewardContext(max_completion_length=t.max_completion_length)
        state = FilterState()
        if resume and spec.harness.group_filter.kind == "std_ema":
            state = state_from_steps(spec.harness.group_filter,
                                     store.rollouts(version, "train", steps=(None, resume)).collect())
        walk = train_items  # already in the domain's seeded order
        for step in range(resume + 1, t.max_steps + 1):
            t0 = time.monotonic()
            jobs = []
            for g in range(t.prompts_per_step):
                item = walk[((step - 1) * t.prompts_per_step + g) % len(walk)]
                jobs += [(item, "train", step, g, k) for k in range(t.group_size)]
            rows, turns = run_batch(domain, spec, policy, jobs, campaign, version)
            rows, state = apply_harness(spec.harness, rows, ctx, state)
            if turns.height:
                store.append_turns(version, "train", step, turns)
            store.append_rollouts(version, "train", step, rows)
            reward, correct = float(rows["reward"].mean()), float(rows["correct"].cast(pl.Float64).mean())
            store.ledger.append(StepCompleted(version=version, step=step, n_rollouts=rows.height, reward_mean=reward,
                                              correct_mean=correct, seconds=time.monotonic() - t0, actor="trainer"))
            log(f"{version} step {step}/{t.max_steps}  reward {reward:.3f}  correct {correct:.3f}  "
                f"turns {float(rows['n_turns'].mean()):.1f}")
        if t.max_steps not in from_ledger(store).versions[version].evals:
            jobs = [(item, "val", t.max_steps, g, k) for g, item in enumerate(val_items) for k in range(t.eval_k)]
            rows, turns = run_batch(domain, spec, policy, jobs, campaign, version)
            rows = score_frame(spec.harness.rewards, rows, ctx)
            if turns.height:
                store.append_turns(version, "val", t.max_steps, turns)
            store.append_rollouts(version, "val", t.max_steps, rows)
            avg = float(rows.group_by("item_id").agg(pl.col("correct").cast(pl.Float64).mean())["correct"].mean())
            store.ledger.append(EvalCompleted(version=version, step=t.max_steps, k=t.eval_k, n_items=len(val_items),
                                              avg_at_k=avg, actor="trainer"))
            log(f"{version}: Avg@{t.eval_k} at step {t.max_steps} = {avg:.3f} over {len(val_items)} items")
        final = store.final_dir(version)
        final.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(final / MARKER, json.dumps({"policy": name}).encode() + b"\n")
        store.ledger.append(TrainingFinished(version=version, steps=t.max_steps, seconds=time.monotonic() - started,
                                             checkpoint=str(final.relative_to(store.root)), actor="trainer"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m evotrainer.envs.swe.scripted VERSION_DIR", file=sys.stderr)
        return 2
    vdir = Path(argv[0]).resolve()
    store = Store.open(vdir.parent.parent)
    log_file = open(vdir / "train.log", "a", buffering=1)

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")

    try:
        train_scripted(store, vdir.name, log)
    except Exception as exc:
        with contextlib.suppress(Exception):
            store.ledger.append(VersionFailed(version=vdir.name, error=f"{type(exc).__name__}: {exc}"[:500],
                                              actor="trainer"))
        if not isinstance(exc, EvoTrainerError):
            raise
        print(f"evotrainer: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
