"""What a trainer agent sees and must do: propose single-factor interventions, rank them by backtest."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..schema import BacktestReport, HealthReport, Intervention, VersionSpec
from ..store import Store


@dataclass(frozen=True)
class HistoryEntry:
    version: str
    parent: str | None
    intervention: Intervention | None
    outcome: str | None  # promote / reject / inconclusive / vetoed, or None if not judged


@dataclass
class AgentContext:
    store: Store
    version: str  # the version the chosen intervention will create
    parent: str  # the best version so far: children branch from it
    parent_spec: VersionSpec
    health: HealthReport | None  # the parent's health report
    consecutive_failures: int
    history: list[HistoryEntry] = field(default_factory=list)
    n_candidates: int = 3

    @classmethod
    def build(cls, store: Store, state, version: str, parent: str) -> AgentContext:
        history = []
        for name in store.versions():
            spec = store.read_version(name)
            if spec.role == "probe":
                continue
            iv = store.read_intervention(spec.intervention) if spec.intervention else None
            history.append(HistoryEntry(name, spec.parent, iv, state.loop(name).outcome))
        return cls(store=store, version=version, parent=parent, parent_spec=store.read_version(parent),
                   health=store.read_health_report(parent), consecutive_failures=state.consecutive_failures(),
                   history=history, n_candidates=store.campaign.candidates_per_version)

    def tried(self) -> set[str]:
        """Changes already used to make a child of this parent (so the agent does not repeat itself)."""
        from ..interventions import describe

        return {describe(h.intervention) for h in self.history
                if h.intervention is not None and h.parent == self.parent}


class TrainerAgent(Protocol):
    name: str

    def propose(self, ctx: AgentContext) -> list[Intervention]: ...

    def rank(self, ctx: AgentContext, candidates: list[tuple[Intervention, BacktestReport | None]]
             ) -> list[tuple[Intervention, BacktestReport | None]]: ...
