"""What a trainer agent sees and must do: propose single-factor interventions, rank them by backtest."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..schema import BacktestReport, HealthReport, Intervention, VersionSpec
from ..store import Store

# Saturation (PAPER-FACTS, the SWE-9B case: "three recipe changes < 1pp each"): the last
# SATURATION_WINDOW recipe changes each moved Avg@k by less than SATURATION_MIN_GAIN over their parent.
SATURATION_WINDOW = 3
SATURATION_MIN_GAIN = 0.01  # 1 percentage point of Avg@k


@dataclass(frozen=True)
class HistoryEntry:
    version: str
    parent: str | None
    intervention: Intervention | None
    outcome: str | None  # promote / reject / inconclusive / vetoed, or None if not judged
    avg_at_k: float | None = None  # held-out Avg@k of its last evaluation


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
    skills: Any = None  # a skills.SkillLibrary; None: the default library (<data dir>/skills)

    @classmethod
    def build(cls, store: Store, state, version: str, parent: str) -> AgentContext:
        history = []
        for name in store.versions():
            spec = store.read_version(name)
            if spec.role == "probe":
                continue
            iv = store.read_intervention(spec.intervention) if spec.intervention else None
            st = state.status.versions.get(name)
            history.append(HistoryEntry(name, spec.parent, iv, state.loop(name).outcome,
                                        st.final_avg_at_k if st is not None else None))
        return cls(store=store, version=version, parent=parent, parent_spec=store.read_version(parent),
                   health=store.read_health_report(parent), consecutive_failures=state.consecutive_failures(),
                   history=history, n_candidates=store.campaign.candidates_per_version)

    @property
    def domain(self) -> str:
        return self.parent_spec.data.domain

    def skill_library(self):
        from ..skills import SkillLibrary

        if self.skills is None:
            self.skills = SkillLibrary.open()
        return self.skills

    def tried(self) -> set[str]:
        """Changes already used to make a child of this parent (so the agent does not repeat itself)."""
        from ..interventions import describe

        return {describe(iv) for iv in self.tried_interventions()}

    def tried_interventions(self) -> list[Intervention]:
        return [h.intervention for h in self.history if h.intervention is not None and h.parent == self.parent]

    def saturation(self, window: int = SATURATION_WINDOW, min_gain: float = SATURATION_MIN_GAIN
                   ) -> list[tuple[str, float]] | None:
        """The last `window` judged recipe changes with their Avg@k gain over their parent, when every one
        gained less than `min_gain` (saturation); else None.

        Counted in campaign order over versions with an intervention; a procedure change ends the window
        (the count restarts after the analysis order changed), and a version without Avg@k on either side
        means no verdict (None)."""
        avg = {h.version: h.avg_at_k for h in self.history}
        recent: list[tuple[str, float]] = []
        for h in reversed(self.history):
            if h.intervention is None or h.outcome is None:
                continue
            if h.intervention.change.factor == "procedure":
                break
            a, b = h.avg_at_k, avg.get(h.parent) if h.parent else None
            if a is None or b is None:
                return None
            recent.append((h.version, a - b))
            if len(recent) == window:
                break
        if len(recent) < window or any(gain >= min_gain for _, gain in recent):
            return None
        return list(reversed(recent))


class TrainerAgent(Protocol):
    name: str

    def propose(self, ctx: AgentContext) -> list[Intervention]: ...

    def rank(self, ctx: AgentContext, candidates: list[tuple[Intervention, BacktestReport | None]]
             ) -> list[tuple[Intervention, BacktestReport | None]]: ...
