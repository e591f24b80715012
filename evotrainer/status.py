"""Campaign state, derived: by replaying the ledger, or by reading the tables.

The two must agree (a test checks); `evotrainer status` prints the ledger's view and says so
when the tables disagree with it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from . import evidence, schema
from .store import Store


class VersionState(str, enum.Enum):
    CREATED = "created"
    TRAINING = "training"
    TRAINED = "trained"
    FAILED = "failed"


@dataclass
class VersionStatus:
    version: str
    parent: str | None = None
    state: VersionState = VersionState.CREATED
    attempts: int = 0
    # step -> (n_rollouts, reward_mean, correct_mean)
    steps: dict[int, tuple[int, float, float]] = field(default_factory=dict)
    # eval step -> (k, n_items, avg_at_k)
    evals: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    error: str | None = None
    seconds: float | None = None

    @property
    def last_step(self) -> int:
        return max(self.steps, default=0)

    @property
    def final_avg_at_k(self) -> float | None:
        if not self.evals:
            return None
        return self.evals[max(self.evals)][2]

    def comparable(self) -> dict:
        """The facts both derivations can see (tables know nothing of states or attempts)."""
        return {
            "version": self.version,
            "steps": {s: (n, round(r, 9), round(c, 9)) for s, (n, r, c) in sorted(self.steps.items())},
            "evals": {s: (k, n, round(a, 9)) for s, (k, n, a) in sorted(self.evals.items())},
        }


@dataclass
class CampaignStatus:
    name: str
    versions: dict[str, VersionStatus] = field(default_factory=dict)
    ledger_torn_lines: int = 0

    def comparable(self) -> list[dict]:
        return [v.comparable() for _, v in sorted(self.versions.items())]

    @property
    def best(self) -> VersionStatus | None:
        scored = [v for v in self.versions.values() if v.state is VersionState.TRAINED and v.final_avg_at_k is not None]
        return max(scored, key=lambda v: (v.final_avg_at_k, -schema.version_index(v.version)), default=None)


def replay(events: list, name: str) -> CampaignStatus:
    status = CampaignStatus(name=name)
    training_events = (schema.VersionCreated, schema.TrainingStarted, schema.StepCompleted, schema.StepsAbandoned,
                       schema.EvalCompleted, schema.TrainingFinished, schema.VersionFailed)
    for ev in events:
        if isinstance(ev, schema.CampaignCreated):
            status.name = ev.name
            continue
        if not isinstance(ev, training_events):
            continue  # the loop's own events (proposals, gates, decisions): see loopstate
        v = status.versions.setdefault(ev.version, VersionStatus(version=ev.version))
        if isinstance(ev, schema.VersionCreated):
            v.parent = ev.parent
        elif isinstance(ev, schema.TrainingStarted):
            v.state = VersionState.TRAINING
            v.attempts = max(v.attempts, ev.attempt)
            v.error = None
        elif isinstance(ev, schema.StepCompleted):
            v.steps[ev.step] = (ev.n_rollouts, ev.reward_mean, ev.correct_mean)
        elif isinstance(ev, schema.StepsAbandoned):
            for s in ev.steps:
                if s > ev.after_step:
                    v.steps.pop(s, None)
                v.evals.pop(s, None)
        elif isinstance(ev, schema.EvalCompleted):
            v.evals[ev.step] = (ev.k, ev.n_items, ev.avg_at_k)
        elif isinstance(ev, schema.TrainingFinished):
            v.state = VersionState.TRAINED
            v.seconds = ev.seconds
        elif isinstance(ev, schema.VersionFailed):
            v.state = VersionState.FAILED
            v.error = ev.error
    return status


def from_ledger(store: Store) -> CampaignStatus:
    events = store.ledger.events()
    status = replay(events, store.campaign.name)
    status.ledger_torn_lines = store.ledger.torn_lines
    return status


def from_tables(store: Store) -> CampaignStatus:
    status = CampaignStatus(name=store.campaign.name)
    for version in store.versions():
        spec = store.read_version(version)
        v = VersionStatus(version=version, parent=spec.parent)
        train = evidence.step_summary(store.rollouts(version, "train", columns=["version", "step", "reward", "correct"]))
        for row in train.iter_rows(named=True):
            v.steps[row["step"]] = (row["n_rollouts"], row["reward_mean"], row["correct_mean"])
        val = store.rollouts(version, "val", columns=["version", "step", "item_id", "correct", "reward"])
        for row in evidence.avg_at_k(val).iter_rows(named=True):
            v.evals[row["step"]] = (row["k"], row["n_items"], row["avg_at_k"])
        status.versions[version] = v
    return status


def format_status(status: CampaignStatus, store: Store | None = None) -> str:
    lines = [f"campaign {status.name}"]
    loop = None
    specs = {}
    if store is not None:
        from .loopstate import derive

        spec = store.campaign
        lines.append(
            f"  policy {spec.policy} | domain {spec.data.domain} tiers {list(spec.data.tiers)} | "
            f"{spec.train.max_steps} steps x {spec.train.prompts_per_step} prompts x {spec.train.group_size} samples"
            + (f" | human gates: {', '.join(spec.gates)}" if spec.gates else "")
        )
        loop = derive(store.ledger.events(), status.name)
        specs = {v: store.read_version(v) for v in store.versions()}
    header = (f"  {'version':8} {'parent':7} {'state':9} {'steps':>6} {'reward(last)':>12} {'correct(last)':>13} "
              f"{'Avg@k':>8}      {'decision':13} intervention")
    lines.append(header)
    judged = loop is not None and any(lp.judged for lp in loop.versions.values())
    best_name = loop.best() if judged else (status.best.version if status.best else None)
    for name, v in sorted(status.versions.items()):
        last = v.steps.get(v.last_step)
        reward = f"{last[1]:.3f}" if last else "-"
        correct = f"{last[2]:.3f}" if last else "-"
        avg = v.final_avg_at_k
        k = v.evals[max(v.evals)][0] if v.evals else None
        avg_s = f"{avg:.3f}" if avg is not None else "-"
        decision = "-"
        if loop is not None and name in loop.versions and loop.versions[name].outcome:
            lp = loop.versions[name]
            decision = lp.outcome + (" (person)" if lp.outcome != (lp.judged.outcome if lp.judged else None) else "")
        iv = ""
        spec = specs.get(name)
        if spec is not None and spec.intervention:
            iv = f"{spec.intervention}: {spec.note}"
        mark = " *best" if best_name == name else ""
        lines.append(
            f"  {name:8} {v.parent or '-':7} {v.state.value:9} {len(v.steps):>6} {reward:>12} {correct:>13} "
            f"{avg_s:>8}{f' k={k}' if k else '    '} {decision + mark:13} {iv}".rstrip()
        )
        if v.error:
            lines.append(f"           error: {v.error}")
    if loop is not None:
        waiting = [(n, g) for n, lp in sorted(loop.versions.items()) for g in sorted(lp.gates_opened)
                   if g not in lp.gates_answered]
        for n, g in waiting:
            lines.append(f"  waiting: {n} at the {g} gate (evotrainer gate {store.root} approve|revise|abort)")
        if loop.aborted:
            lines.append("  campaign aborted at a gate")
    if status.ledger_torn_lines:
        lines.append(f"  note: {status.ledger_torn_lines} torn ledger line(s) from a crashed writer were skipped")
    return "\n".join(lines)
