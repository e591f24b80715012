"""The campaign loop: creates versions and trains each one in a subprocess.

The controller only reads and writes the store; training runs as
`python -m evotrainer.train VERSION_DIR`, so a crash or an out-of-memory kill is a recorded
status, not a dead notebook kernel. State is derived from the ledger, so `resume` is a replay.

For now the chain uses a fixed harness (every version trains the base policy under the
campaign's harness with its own seed); the agent loop that proposes interventions builds on this.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import paths, policy
from .config import RunConfig
from .envs import build_domain, load_items
from .errors import ConfigError, CorruptTableError, EvoTrainerError, StoreError
from .harness import rewards as reward_mod
from . import interventions
from .loopstate import LoopState, VersionLoop, derive
from .schema import (BacktestCompleted, CampaignAborted, CampaignSpec, Decision, GateAnswered, GateOpened, HealthReported,
                     Intervention, InterventionProposed, InterventionSelected, ProbesCompared, VersionCreated,
                     VersionFailed, VersionJudged, VersionSpec, probe_name, version_name)
from .status import CampaignStatus, VersionState, format_status, from_ledger
from .store import Store

Log = Callable[[str], None]


class TrainingFailed(EvoTrainerError):
    pass


def campaign_spec(config: RunConfig, name: str, preset: str | None) -> CampaignSpec:
    return CampaignSpec(
        name=name, preset=preset, policy=config.policy, data=config.data, train=config.train,
        harness=config.harness, seed=config.seed, warm_start=config.warm_start, gates=config.gates,
        agent=config.agent, claude=config.claude, candidates_per_version=config.candidates_per_version,
        probes=config.probes,
        probe_steps=config.probe_steps,
    )


def open_or_create(campaign_dir: Path, config: RunConfig | None, preset: str | None, resume: bool) -> Store:
    campaign_dir = Path(campaign_dir)
    if resume:
        if not Store.exists(campaign_dir):
            raise StoreError(f"no campaign at {campaign_dir} to resume; drop --resume to start a new one there")
        store = Store.open(campaign_dir)
        bad = store.scan_for_corruption()  # refuse to build on evidence that cannot be read
        if bad:
            names = ", ".join(str(p.relative_to(store.root)) for p, _ in bad[:3])
            raise CorruptTableError(
                f"{len(bad)} unreadable table file(s) in {store.root}: {names}; move them aside with "
                f"`evotrainer doctor {store.root} --quarantine`, then resume"
            )
        return store
    if Store.exists(campaign_dir):
        # Opening first validates its schema version, so a foreign campaign gets that error instead.
        Store.open(campaign_dir)
        raise StoreError(f"{campaign_dir} already holds a campaign; add --resume to continue it or pick another --campaign")
    assert config is not None
    validate_config(config)  # before anything is written: a bad config leaves no trace
    return Store.create(campaign_dir, campaign_spec(config, config.name or campaign_dir.name, preset))


def validate_config(config: RunConfig) -> None:
    """Checks that need more than the schema: the policy exists, the data can supply the items."""
    from .envs.swe.scripted import is_scripted, policy_name

    if is_scripted(config.policy):
        policy_name(config.policy)  # raises on an unknown name
        if config.data.domain != "swe":
            raise ConfigError(f"policy {config.policy!r} is a scripted SWE policy; set data.domain = \"swe\"")
    else:
        policy.check(config.policy, paths.models_dir())
    for name in (n for n in (config.data.train_jsonl, config.data.val_jsonl) if n):
        if not Path(name).is_file():
            raise ConfigError(f"data file {name} does not exist; fix data.train_jsonl / data.val_jsonl")
    try:
        load_items(config.data, build_domain(config.data, config.harness.system_prompt))
    except ValueError as exc:
        raise ConfigError(f"data: {exc}; change data.n_train / data.n_val / data.tiers") from exc
    for c in config.harness.rewards:
        if c.name not in reward_mod.known():
            raise ConfigError(f"harness: unknown reward component {c.name!r}; known: {', '.join(reward_mod.known())}")


def next_version_spec(store: Store, index: int) -> VersionSpec:
    spec = store.campaign
    name = version_name(index)
    parent = version_name(index - 1) if index > 0 else None
    warm = bool(spec.warm_start and parent is not None)
    base_policy = str(store.final_dir(parent)) if warm else spec.policy
    return VersionSpec(
        version=name, parent=parent, policy=base_policy, warm_start=warm, confounded=warm,
        harness=spec.harness, data=spec.data, train=spec.train, seed=spec.seed + index,
        note="fixed harness chain" + ("; warm-started from the parent's final weights" if warm else ""),
    )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a SIGKILLed controller takes training down too
    except OSError:
        pass


def train_version(store: Store, version: str, log: Log = print, extra_env: dict | None = None) -> int:
    """Run the training subprocess for one version, echoing its progress lines. Returns its exit code."""
    env = dict(os.environ)
    env["EVOTRAINER_PARENT_PID"] = str(os.getpid())
    env.setdefault("EVOTRAINER_DATA", str(paths.data_dir()))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra_env or {})
    from .envs.swe.scripted import is_scripted

    # A scripted SWE policy has nothing to learn: its own (torch-free) process writes the same evidence.
    module = "evotrainer.envs.swe.scripted" if is_scripted(store.read_version(version).policy) else "evotrainer.train"
    cmd = [sys.executable, "-m", module, str(store.version_dir(version))]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        preexec_fn=_die_with_parent, bufsize=1,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log(line.rstrip("\n"))
    return proc.wait()


def child_version_spec(store: Store, index: int, parent: str, iv: Intervention) -> VersionSpec:
    """Version `index`: the parent's harness plus exactly one intervention (a full run by default)."""
    spec = store.campaign
    parent_spec = store.read_version(parent)
    harness, train = interventions.apply(iv, parent_spec.harness, parent_spec.train)
    warm = spec.warm_start
    return VersionSpec(
        version=version_name(index), parent=parent,
        policy=str(store.final_dir(parent)) if warm else spec.policy, warm_start=warm, confounded=warm,
        harness=harness, data=parent_spec.data, train=train, seed=spec.seed + index,
        intervention=iv.intervention_id, note=interventions.describe(iv),
    )


class WaitingForGate(EvoTrainerError):
    """The campaign is held at a human gate; answer it with `evotrainer gate` and resume."""


class Paused(EvoTrainerError):
    """A pause was requested (Lab.pause / pause.request); the loop stopped between phases."""


def _check_pause(store: Store) -> None:
    if store.pause_requested():
        raise Paused(f"campaign {store.root} paused between phases; resume with Lab.resume() or "
                     f"`evotrainer run --campaign {store.root} --resume` after removing pause.request")


def run_campaign(
    campaign_dir: Path, config: RunConfig | None, versions: int, resume: bool = False,
    preset: str | None = None, log: Log = print, agent=None,
) -> CampaignStatus:
    """Run the loop until the chain has `versions` trained and judged versions, a gate holds, or abort."""
    store = open_or_create(campaign_dir, config, preset, resume)
    policy.check(store.campaign.policy, paths.models_dir())  # a resumed campaign's model may have moved
    agent = agent or make_agent(store.campaign.agent, store, log)
    log(f"campaign {store.campaign.name} at {store.root}")
    with store.controller_lock():
        try:
            for index in range(versions):
                if not _advance_version(store, index, agent, log):
                    break
        except (WaitingForGate, Paused) as held:
            log(str(held))
    final = from_ledger(store)
    log(format_status(final, store))
    log(f"results: {store.root}  (rollouts under versions/*/rollouts, ledger.jsonl; `evotrainer status {store.root}`)")
    return final


def make_agent(name: str, store: Store | None = None, log: Log = print):
    """The campaign's trainer agent. "claude" reads `store.campaign.claude` (its spec) and needs the
    `anthropic` package and ANTHROPIC_API_KEY; it is the only agent that imports `anthropic`."""
    if name == "playbook":
        from .agent.playbook import PlaybookAgent

        return PlaybookAgent()
    if name == "claude":
        from .agent.claude import ClaudeAgent
        from .schema import ClaudeAgentSpec

        return ClaudeAgent(store.campaign.claude if store is not None else ClaudeAgentSpec(), log=log)
    raise EvoTrainerError(f"unknown trainer agent {name!r}; available here: playbook, claude")


def _state(store: Store) -> LoopState:
    return derive(store.ledger.events(), store.campaign.name)


def _advance_version(store: Store, index: int, agent, log: Log) -> bool:
    """Drive version `index` through every phase it still lacks. False when the campaign stopped."""
    name = version_name(index)
    state = _state(store)
    if state.aborted:
        log("campaign was aborted at a gate; nothing more to do")
        return False
    _check_pause(store)
    lp = state.loop(name)
    if name not in state.status.versions:
        if index == 0:
            spec = next_version_spec(store, 0)
        else:
            iv = _choose_intervention(store, index, agent, log)
            if iv is None:
                return False
            parent = store.read_intervention(iv).parent
            spec = child_version_spec(store, index, parent, store.read_intervention(iv))
        store.write_version(spec)
        store.ledger.append(VersionCreated(version=name, parent=spec.parent, reason=spec.note))
        _maybe_die("version_created")
    if state.status.versions.get(name) is None or state.status.versions[name].state is not VersionState.TRAINED:
        _train(store, name, log)
        _maybe_die("training_finished")
        state = _state(store)
        lp = state.loop(name)
    if lp.health is None:
        _diagnose(store, name, log)
        _maybe_die("health_reported")
        state = _state(store)
        lp = state.loop(name)
    if lp.judged is None:
        _judge(store, name, state, log)
        _maybe_die("version_judged")
        state = _state(store)
        lp = state.loop(name)
    if "completion" in store.campaign.gates and "completion" not in lp.gates_answered:
        _hold(store, name, "completion", (lp.judged.decision_id,), lp)
    ans = lp.gates_answered.get("completion")
    if ans is not None and ans.answer == "abort":
        return False
    return True


def _choose_intervention(store: Store, index: int, agent, log: Log) -> str | None:
    """Propose, backtest and select the intervention that will create version `index`."""
    from .agent.base import AgentContext

    name = version_name(index)
    # Skills first: a person's completion-gate override of the previous version is final by now.
    from .skills import sync_campaign

    for line in sync_campaign(store):
        log(f"  {line}")
    state = _state(store)
    lp = state.loop(name)
    gates = store.campaign.gates
    if lp.selected:
        return lp.selected
    parent = state.branch_point(before=name)
    if parent is None:
        raise EvoTrainerError(f"no promoted version to branch {name} from; the first version must be judged first")
    if "diagnosis" in gates and "diagnosis" not in lp.gates_answered:
        report = store.read_health_report(parent)
        _hold(store, name, "diagnosis", tuple(f.finding_id for f in (report.alerts if report else ())), lp)
    if _answered(lp, "diagnosis") == "abort":
        _abort(store, name, log)
        return None
    if not lp.proposed:
        ctx = AgentContext.build(store, state, name, parent)
        candidates = agent.propose(ctx)
        if not candidates:
            raise EvoTrainerError(f"the {agent.name} agent proposed nothing for {name}; intervene by hand "
                                  f"(`evotrainer gate {store.root} revise --intervention FILE`)")
        for rank, iv in enumerate(candidates):
            store.write_intervention(iv)
            store.ledger.append(InterventionProposed(version=name, intervention_id=iv.intervention_id,
                                                     parent=parent, rank=rank, actor=agent.name,
                                                     reason=iv.hypothesis.text()))
            log(f"{name}: proposed {iv.intervention_id}: {interventions.describe(iv)}")
        _maybe_die("intervention_proposed")
        lp = _state(store).loop(name)
    if "design" in gates and "design" not in lp.gates_answered:
        _hold(store, name, "design", tuple(lp.proposed), lp)
    # A person's intervention from the design gate, else from the diagnosis gate, replaces the agent's.
    candidates = _candidates(lp, "design")
    if candidates == list(lp.proposed):
        candidates = _candidates(lp, "diagnosis")
    if _answered(lp, "design") == "abort":
        _abort(store, name, log)
        return None
    for iv_id in candidates:
        if iv_id not in lp.backtests:
            report = _backtest(store, store.read_intervention(iv_id), log)
            store.ledger.append(BacktestCompleted(version=name, intervention_id=iv_id, backtest_id=report.backtest_id,
                                                  verdict=report.verdict, reason="; ".join(report.reasons)[:500]))
            _maybe_die("backtest_completed")
    lp = _state(store).loop(name)
    if "backtest" in gates and "backtest" not in lp.gates_answered:
        _hold(store, name, "backtest", tuple(lp.backtests[i][0] for i in candidates if i in lp.backtests), lp)
    if _answered(lp, "backtest") == "abort":
        _abort(store, name, log)
        return None
    revised = lp.gates_answered.get("backtest")
    if revised is not None and revised.answer == "revise" and revised.intervention_id:
        chosen, bt = revised.intervention_id, lp.backtests.get(revised.intervention_id, (None,))[0]
        if chosen not in lp.backtests:
            report = _backtest(store, store.read_intervention(chosen), log)
            bt = report.backtest_id
    else:
        ctx = AgentContext.build(store, state, name, parent)
        reports = {b.backtest_id: b for b in store.backtests()}
        pairs = [(store.read_intervention(i), reports.get(lp.backtests[i][0])) for i in candidates]
        ranked = agent.rank(ctx, pairs)
        if store.campaign.probes > 0:
            ranked = _probe(store, index, parent, ranked[: store.campaign.probes], log)
        chosen, bt = ranked[0][0].intervention_id, (ranked[0][1].backtest_id if ranked[0][1] else None)
    store.ledger.append(InterventionSelected(version=name, intervention_id=chosen, backtest_id=bt, actor=agent.name))
    log(f"{name}: selected {chosen} ({interventions.describe(store.read_intervention(chosen))})")
    _maybe_die("intervention_selected")
    return chosen


def _probe(store: Store, index: int, parent: str, ranked: list, log: Log) -> list:
    """Train each candidate as a short probe from the same parent (same seed, same held-out items)
    and put the probe with the best Avg@k first. Sequential here; independent runs by design, so a
    cluster can run them in parallel."""
    name = version_name(index)
    done = _state(store).loop(name).probes
    if done is None:
        parent_spec = store.read_version(parent)
        steps = store.campaign.probe_steps or max(1, parent_spec.train.max_steps // 3)
        names, avgs = [], []
        for k, (iv, _) in enumerate(ranked):
            pname = probe_name(index, k)
            current = from_ledger(store).versions.get(pname)
            if current is None:
                child = child_version_spec(store, index, parent, iv)
                child = VersionSpec.model_validate({
                    **child.model_dump(), "version": pname, "role": "probe", "note": f"probe: {child.note}",
                    "train": {**child.train.model_dump(), "max_steps": steps, "eval_every": 0}})
                store.write_version(child)
                store.ledger.append(VersionCreated(version=pname, parent=parent, reason=child.note))
            if current is None or current.state is not VersionState.TRAINED:
                _train(store, pname, log)
            names.append(pname)
            avgs.append(from_ledger(store).versions[pname].final_avg_at_k)
        best = max(range(len(ranked)), key=lambda k: (avgs[k] if avgs[k] is not None else -1.0, -k))
        summary = ", ".join(f"{n} {a:.3f}" if a is not None else f"{n} -" for n, a in zip(names, avgs))
        store.ledger.append(ProbesCompared(
            version=name, probes=tuple(names), interventions=tuple(iv.intervention_id for iv, _ in ranked),
            avg_at_k=tuple(avgs), winner=ranked[best][0].intervention_id,
            reason=f"{steps}-step probes from {parent}: {summary}"))
        log(f"{name}: probes {summary}; carrying on {ranked[best][0].intervention_id}")
        _maybe_die("probes_compared")
        done = _state(store).loop(name).probes
    order = {iv: i for i, iv in enumerate(done.interventions)}
    winner = [p for p in ranked if p[0].intervention_id == done.winner]
    rest = sorted((p for p in ranked if p[0].intervention_id != done.winner),
                  key=lambda p: order.get(p[0].intervention_id, 99))
    return winner + rest


def _candidates(lp: VersionLoop, gate: str) -> list[str]:
    ans = lp.gates_answered.get(gate)
    if ans is not None and ans.answer == "revise" and ans.intervention_id:
        return [ans.intervention_id]  # the person's intervention replaces the agent's
    return list(lp.proposed)


def _answered(lp: VersionLoop, gate: str) -> str | None:
    ans = lp.gates_answered.get(gate)
    return ans.answer if ans else None


def _hold(store: Store, version: str, gate: str, subject: tuple[str, ...], lp: VersionLoop) -> None:
    if gate not in lp.gates_opened:
        store.ledger.append(GateOpened(version=version, gate=gate, subject=subject))
    raise WaitingForGate(
        f"{version}: waiting at the {gate} gate (subject: {', '.join(subject) or '-'}); answer with "
        f"`evotrainer gate {store.root} approve|revise|abort --reason ...`, then rerun with --resume"
    )


def _abort(store: Store, version: str, log: Log) -> None:
    state = _state(store)
    if not state.aborted:
        ans = next(iter(state.loop(version).gates_answered.values()), None)
        store.ledger.append(CampaignAborted(version=version, actor=ans.actor if ans else "gate",
                                            reason=ans.reason if ans else ""))
    log(f"{version}: campaign aborted at a gate")


def _backtest(store: Store, iv: Intervention, log: Log):
    from .backtest import run_backtest

    parent_spec = store.read_version(iv.parent)
    candidate, train = interventions.apply(iv, parent_spec.harness, parent_spec.train)
    report = run_backtest(store, candidate, versions=[iv.parent], baseline=parent_spec.harness, intervention=iv,
                          max_completion_length=train.max_completion_length)
    store.write_backtest(report)
    log(f"  backtest {iv.intervention_id} on {iv.parent}: {report.verdict} ({'; '.join(report.reasons)[:160]})")
    return report


def _train(store: Store, name: str, log: Log) -> None:
    _check_pause(store)
    started = time.monotonic()
    log(f"== {name}: training (log: {store.train_log(name)})")
    rc = train_version(store, name, log)
    after = from_ledger(store).versions[name]
    if rc != 0 or after.state is not VersionState.TRAINED:
        why = after.error if after.state is VersionState.FAILED and after.error else (
            f"training process exited with code {rc}" + (" (killed)" if rc < 0 else "")
        )
        if after.state is not VersionState.FAILED:
            store.ledger.append(VersionFailed(version=name, error=why))
        raise TrainingFailed(f"{name} failed: {why}; see {store.train_log(name)}, then rerun with --resume")
    log(f"== {name}: trained in {time.monotonic() - started:.0f}s, Avg@k {after.final_avg_at_k:.3f}")


def _diagnose(store: Store, name: str, log: Log) -> None:
    from .diagnostics.report import health_report_for

    report = health_report_for(store, name)
    store.write_health_report(report)
    crit = tuple(f.finding_id for f in report.findings if f.severity == "critical")
    warn = tuple(f.finding_id for f in report.findings if f.severity == "warning")
    store.ledger.append(HealthReported(version=name, critical=crit, warning=warn))
    for f in report.alerts:
        log(f"  {name} {f.severity.upper()}: {f.message}")


def _judge(store: Store, name: str, state: LoopState, log: Log) -> None:
    from .gate import GateError, decide

    baseline = state.best(before=name)
    report = store.read_health_report(name)
    vetoes = [f for f in (report.findings if report else ()) if f.veto]
    try:
        decision = decide(store, name, baseline, vetoes=vetoes)
    except GateError as exc:
        # The comparison cannot be made (e.g. too few shared held-out items): keep the parent.
        decision = Decision(decision_id="d-" + hashlib.sha256(f"{name}|{baseline}|{exc}".encode()).hexdigest()[:12], candidate=name,
                            baseline=baseline, outcome="inconclusive", stats=None,
                            vetoes=tuple(f.finding_id for f in vetoes), rule="no comparison possible",
                            reason=str(exc))
    store.write_decision(decision)
    store.ledger.append(VersionJudged(version=name, decision_id=decision.decision_id, outcome=decision.outcome,
                                      baseline=baseline, actor=decision.decided_by, reason=decision.reason[:500]))
    st = decision.stats
    ci = f" Δ={st.mean_delta:+.3f} CI [{st.ci_low:+.3f}, {st.ci_high:+.3f}] p={st.p_wilcoxon}" if st else ""
    log(f"== {name}: {decision.outcome.upper()} vs {baseline or '-'}{ci}")
    # Skills: a promoted intervention becomes (or strengthens) a skill; any use of a skill is appended.
    from .skills import sync_campaign

    for line in sync_campaign(store):
        log(f"  {line}")


def _maybe_die(after: str) -> None:
    """Tests only: SIGKILL ourselves right after the named phase's event is in the ledger."""
    if os.environ.get("EVOTRAINER_DEBUG_DIE_AFTER") == after:
        os.kill(os.getpid(), signal.SIGKILL)


def answer_gate(store: Store, answer: str, *, who: str, reason: str, intervention: Intervention | None = None,
                outcome: str | None = None, log: Log | None = None) -> GateAnswered:
    """Answer the gate the campaign is waiting at (APPROVE / REVISE / ABORT), recording who and why."""
    state = _state(store)
    open_gates = [(v, g) for v, lp in sorted(state.versions.items()) for g in sorted(lp.gates_opened)
                  if g not in lp.gates_answered]
    if not open_gates:
        raise EvoTrainerError(f"campaign {store.root} is not waiting at any gate; nothing to answer")
    version, gate = open_gates[-1]
    if not reason.strip():
        raise EvoTrainerError("a gate answer needs a reason (--reason): the ledger records who decided and why")
    iv_id = None
    if answer == "revise":
        if gate in ("design", "backtest", "diagnosis"):
            if intervention is None:
                raise EvoTrainerError(f"REVISE at the {gate} gate needs your intervention (--intervention FILE)")
            parent = state.branch_point(before=version)
            if intervention.parent != parent:
                raise EvoTrainerError(f"the revised intervention must change {parent} (the version it branches from), "
                                      f"not {intervention.parent}")
            interventions.apply(intervention, store.read_version(parent).harness, store.read_version(parent).train)
            store.write_intervention(intervention)
            iv_id = intervention.intervention_id
        elif outcome is None:
            raise EvoTrainerError("REVISE at the completion gate needs --outcome promote|reject|inconclusive")
    ev = GateAnswered(version=version, gate=gate, answer=answer, intervention_id=iv_id,
                      outcome=outcome if gate == "completion" else None, actor=who, reason=reason)
    store.ledger.append(ev)
    if answer == "abort":
        store.ledger.append(CampaignAborted(version=version, actor=who, reason=reason))
    if gate == "completion" and outcome is not None:
        # A person's verdict on a version is evidence for the skill library now, not at the next judgement.
        from . import skills

        with contextlib.suppress(skills.SkillError):
            for line in skills.sync_campaign(store):
                if log is not None:
                    log(line)
    return ev
