"""The co-evolution loop's state, derived by replaying the ledger (resume = replay).

For each version index the loop moves through phases:

    (child only) diagnosis gate -> propose -> design gate -> backtest each -> backtest gate -> select
    -> create -> train -> diagnose -> judge -> completion gate

Each phase ends with one ledger event, so after a crash at any point the next action is the
first phase without its event. Documents are content-addressed, so redoing a phase whose event
was lost rewrites identical files.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import schema
from .status import CampaignStatus, replay


@dataclass
class VersionLoop:
    version: str
    proposed: list[str] = field(default_factory=list)  # intervention ids, rank order
    backtests: dict[str, tuple[str, str]] = field(default_factory=dict)  # iv id -> (backtest id, verdict)
    selected: str | None = None
    selected_backtest: str | None = None
    gates_opened: set[str] = field(default_factory=set)
    gates_answered: dict[str, schema.GateAnswered] = field(default_factory=dict)
    health: schema.HealthReported | None = None
    probes: schema.ProbesCompared | None = None
    judged: schema.VersionJudged | None = None

    @property
    def outcome(self) -> str | None:
        """The effective promotion outcome: a person's completion-gate override wins."""
        ans = self.gates_answered.get("completion")
        if ans is not None and ans.answer == "revise" and ans.outcome is not None:
            return ans.outcome
        return self.judged.outcome if self.judged else None

    @property
    def decided_by(self) -> tuple[str, str]:
        """(who, why) of the effective outcome: the person who overrode it at the completion gate, else the gate."""
        ans = self.gates_answered.get("completion")
        if ans is not None and ans.answer == "revise" and ans.outcome is not None:
            return ans.actor, ans.reason
        if self.judged is not None:
            return self.judged.actor, self.judged.reason
        return "", ""


@dataclass
class LoopState:
    status: CampaignStatus
    versions: dict[str, VersionLoop]
    aborted: bool = False

    def loop(self, version: str) -> VersionLoop:
        return self.versions.setdefault(version, VersionLoop(version))

    def best(self, before: str | None = None) -> str | None:
        """Best version so far: the latest promoted one (the first version is promoted by definition)."""
        best = None
        for name in sorted(self.versions):
            if before is not None and name >= before:
                break
            if self.versions[name].outcome == "promote":
                best = name
        return best

    def branch_point(self, before: str | None = None) -> str | None:
        """Where the next version branches from: the best version; while none is promoted because the
        FIRST version was vetoed (e.g. its score came through the git leak), that first version, so
        the fix of its harness can be tried. (A vetoed version is never a gate baseline.)"""
        best = self.best(before)
        if best is None and self.versions:
            first = min(self.versions)
            if self.versions[first].outcome == "vetoed" and (before is None or first < before):
                return first
        return best

    def consecutive_failures(self) -> int:
        n = 0
        for name in sorted(self.versions, reverse=True):
            out = self.versions[name].outcome
            if out is None:
                continue
            if out == "promote":
                break
            n += 1
        return n


def derive(events: list, name: str) -> LoopState:
    state = LoopState(status=replay(events, name), versions={})
    for ev in events:
        if isinstance(ev, schema.CampaignAborted):
            state.aborted = True
            continue
        if isinstance(ev, schema.CampaignCreated):
            continue
        v = state.loop(ev.version)
        if isinstance(ev, schema.InterventionProposed):
            if ev.intervention_id not in v.proposed:
                v.proposed.append(ev.intervention_id)
        elif isinstance(ev, schema.BacktestCompleted):
            v.backtests[ev.intervention_id] = (ev.backtest_id, ev.verdict)
        elif isinstance(ev, schema.InterventionSelected):
            v.selected, v.selected_backtest = ev.intervention_id, ev.backtest_id
        elif isinstance(ev, schema.GateOpened):
            v.gates_opened.add(ev.gate)
        elif isinstance(ev, schema.GateAnswered):
            v.gates_answered[ev.gate] = ev
        elif isinstance(ev, schema.ProbesCompared):
            v.probes = ev
        elif isinstance(ev, schema.HealthReported):
            v.health = ev
        elif isinstance(ev, schema.VersionJudged):
            v.judged = ev
        elif isinstance(ev, schema.StepsAbandoned | schema.TrainingStarted):
            pass
    return state
