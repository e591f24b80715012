"""`Lab`: drive a campaign from a notebook cell (or any Python) without blocking it.

The loop runs in a detached `evotrainer run --resume` process (its own session), so a cell never
waits on training, and restarting the kernel neither stops nor forgets the campaign: everything
the Lab shows is read back from the store. Every action a widget offers is a method here, so an
override can be written as a cell and re-run.

    lab = Lab.start("data/campaigns/demo", preset="smoke", versions=3, gates=("design",))
    lab.status()                     # versions, decisions, the gate it waits at
    lab.gate                         # the pending human gate, or None
    lab.proposals[0].approve(reason="matches the dead-group finding", who="alice")
    lab.gate.revise(intervention, reason="...", who="alice")
    lab.pause(); lab.resume(); lab.stop()
    Lab.attach("data/campaigns/demo")   # after a kernel restart: the same campaign, same state

This module is core: it imports no IPython, torch or widget code.
"""
from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import polars as pl

from . import config as config_mod
from . import interventions, paths
from .controller import answer_gate, validate_config
from .errors import EvoTrainerError
from .loopstate import LoopState, derive
from .schema import Intervention
from .status import CampaignStatus, format_status, from_ledger
from .store import Store


class LabError(EvoTrainerError):
    pass


@dataclass(frozen=True)
class PendingGate:
    """The human gate the campaign is held at. Answering it records who and why in the ledger."""

    lab: Lab = field(repr=False)
    version: str
    gate: str
    subject: tuple[str, ...]

    def approve(self, reason: str, who: str | None = None) -> None:
        self.lab._answer("approve", reason, who)

    def revise(self, intervention: Intervention | None = None, *, reason: str, who: str | None = None,
               outcome: str | None = None) -> None:
        """At diagnosis/design/backtest: your intervention replaces the agent's candidates.
        At completion: `outcome` (promote/reject/inconclusive) overrides the gate's decision."""
        self.lab._answer("revise", reason, who, intervention=intervention, outcome=outcome)

    def abort(self, reason: str, who: str | None = None) -> None:
        self.lab._answer("abort", reason, who)


@dataclass(frozen=True)
class Proposal:
    """A candidate intervention the agent proposed for `version`, with its backtest if run."""

    lab: Lab = field(repr=False)
    version: str
    rank: int
    intervention: Intervention
    backtest_id: str | None
    verdict: str | None
    selected: bool

    @property
    def description(self) -> str:
        return interventions.describe(self.intervention)

    def approve(self, reason: str, who: str | None = None) -> None:
        """Carry this proposal on: at the design/backtest gate, it becomes the only candidate."""
        gate = self.lab.gate
        if gate is None or gate.version != self.version:
            raise LabError(f"{self.version} is not waiting at a gate; nothing to approve")
        if gate.gate == "completion":
            raise LabError("the campaign waits at the completion gate; answer lab.gate instead")
        if self.rank == 0 and gate.gate == "design" and len(self.lab.proposals) == 1:
            self.lab._answer("approve", reason, who)
        else:
            self.lab._answer("revise", reason, who, intervention=self.intervention)

    def __repr__(self) -> str:
        bt = f", backtest {self.verdict}" if self.verdict else ""
        return f"<Proposal {self.version}#{self.rank} {self.intervention.intervention_id}: {self.description}{bt}>"


class Lab:
    def __init__(self, store: Store):
        self.store = store

    # ---- opening

    @classmethod
    def start(cls, campaign_dir: str | Path, *, config: str | Path | config_mod.RunConfig | None = None,
              preset: str = "smoke", versions: int | None = None, gates: Sequence[str] | None = None,
              probes: int | None = None) -> Lab:
        """Create a campaign (validated first: a bad config writes nothing) and run it in the background."""
        campaign_dir = Path(campaign_dir)
        if Store.exists(campaign_dir):
            raise LabError(f"{campaign_dir} already holds a campaign; use Lab.attach()")
        cfg = config if isinstance(config, config_mod.RunConfig) else config_mod.load(config, preset)
        updates = {k: v for k, v in (("gates", tuple(gates) if gates is not None else None),
                                     ("versions", versions), ("probes", probes)) if v is not None}
        if updates:
            cfg = config_mod.RunConfig.model_validate({**cfg.model_dump(), **updates})
        validate_config(cfg)
        from .controller import campaign_spec

        store = Store.create(campaign_dir, campaign_spec(cfg, cfg.name or campaign_dir.name, preset))
        lab = cls(store)
        lab._spawn(cfg.versions)
        return lab

    @classmethod
    def attach(cls, campaign_dir: str | Path) -> Lab:
        """The campaign as the store has it, running or not (e.g. after a kernel restart)."""
        return cls(Store.open(campaign_dir))

    # ---- control

    @property
    def running(self) -> bool:
        return self.store.controller_pid() is not None

    def _spawn(self, versions: int | None = None) -> None:
        if self.running:
            return
        versions = versions or self.store.run_target() or 1
        self.store.set_run_target(versions)
        env = dict(os.environ, EVOTRAINER_DATA=str(paths.data_dir()), PYTHONUNBUFFERED="1")
        root = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        with open(self.store.controller_log(), "a") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "evotrainer.cli", "run", "--campaign", str(self.store.root), "--resume",
                 "--versions", str(versions)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,  # survives the kernel: restarting the notebook does not stop training
            )
        deadline = time.monotonic() + 30
        while not self.running and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def resume(self, versions: int | None = None) -> None:
        """Continue after a pause, a gate answer, a stop or a crash."""
        self.store.request_pause(False)
        self._spawn(versions)

    def pause(self) -> None:
        """Stop after the current phase (a version in training finishes its training first)."""
        self.store.request_pause(True)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop now: the controller is terminated and takes its training process with it; resume later."""
        self.store.request_pause(True)
        pid = self.store.controller_pid()
        if pid and pid > 0:
            try:
                os.killpg(os.getpgid(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.1)

    def wait(self, timeout: float = 600.0, poll: float = 0.2) -> CampaignStatus:
        """Block until the controller stops (finished, paused, or holding at a gate). For scripts and tests."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(poll)
        if self.running:
            raise LabError(f"campaign {self.store.root} still running after {timeout:.0f}s")
        return self.status()

    # ---- reading (all from the store)

    def status(self) -> CampaignStatus:
        return from_ledger(self.store)

    def loop_state(self) -> LoopState:
        return derive(self.store.ledger.events(), self.store.campaign.name)

    def summary(self) -> str:
        return format_status(self.status(), self.store) + ("\n  (controller running)" if self.running else "")

    def __repr__(self) -> str:
        return self.summary()

    @property
    def gate(self) -> PendingGate | None:
        state = self.loop_state()
        pending = [(v, g) for v, lp in sorted(state.versions.items()) for g in sorted(lp.gates_opened)
                   if g not in lp.gates_answered]
        if not pending or state.aborted:
            return None
        version, gate = pending[-1]
        opened = [e for e in self.store.ledger.events() if e.kind == "gate_opened" and e.version == version
                  and e.gate == gate]
        return PendingGate(self, version, gate, opened[-1].subject if opened else ())

    @property
    def proposals(self) -> list[Proposal]:
        """The candidates for the newest version that has any, in the agent's rank order."""
        state = self.loop_state()
        with_props = [v for v, lp in sorted(state.versions.items()) if lp.proposed]
        if not with_props:
            return []
        version = with_props[-1]
        lp = state.versions[version]
        out = []
        for rank, iv_id in enumerate(lp.proposed):
            bt = lp.backtests.get(iv_id)
            out.append(Proposal(self, version, rank, self.store.read_intervention(iv_id), bt[0] if bt else None,
                                bt[1] if bt else None, lp.selected == iv_id))
        return out

    def rollouts(self, versions=None, split=None, steps=None, columns=None) -> pl.LazyFrame:
        return self.store.rollouts(versions, split, steps, columns)

    def live(self) -> dict:
        """The version in flight: its last step's numbers, for a progress bar."""
        st = self.status()
        training = [v for v in st.versions.values() if v.state.value == "training"]
        if not training:
            return {"version": None}
        v = training[-1]
        spec = self.store.read_version(v.version)
        last = v.steps.get(v.last_step)
        dgr = None
        if last is not None:
            m = self.store.metrics(v.version, steps=(v.last_step, v.last_step)).filter(
                pl.col("name") == "frac_reward_zero_std").collect()
            dgr = float(m["value"][0]) if m.height else None
        return {"version": v.version, "step": v.last_step, "max_steps": spec.train.max_steps,
                "reward": last[1] if last else None, "correct": last[2] if last else None, "dgr": dgr}

    # ---- acting

    def _answer(self, answer: str, reason: str, who: str | None, *, intervention: Intervention | None = None,
                outcome: str | None = None) -> None:
        answer_gate(self.store, answer, who=who or getpass.getuser(), reason=reason, intervention=intervention,
                    outcome=outcome)

    def intervention(self, **fields) -> Intervention:
        """Write your own intervention (validated; `parent` defaults to the best version)."""
        fields.setdefault("parent", self.loop_state().branch_point() or self.store.versions()[-1])
        fields.setdefault("author", getpass.getuser())
        return interventions.new(**fields)
