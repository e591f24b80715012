"""The offline playbook agent: findings -> candidate single-factor interventions -> rank by backtest.

It follows PAPER-FACTS' loop: one falsifiable hypothesis per intervention, candidates from the
layer the evidence points at (signal: dead groups, spread; behaviour: truncation, format, length;
data: saturated / never-solved items; reward: hacking, simplification), ranked by their backtest
verdicts. After consecutive failed versions it escalates: 2 in a row with no usable signal
changes the analysis procedure; 3 in a row switches to a layer not tried recently and simplifies
the reward (removes a shaped component). Children always branch from the best version, which is
the roll-back.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import interventions
from ..schema import (BacktestReport, DataSelectionSpec, Finding, GroupFilterSpec, Intervention,
                      TrajectoryFilterSpec)
from .base import AgentContext

LAYER_OF = {"filter": "signal", "data": "data", "reward": "reward", "env": "behaviour", "hparam": "signal",
            "procedure": "procedure", "diagnostic": "procedure"}
VERDICT_ORDER = {"supports": 0, "inconclusive": 1, "contradicts": 2}
ORDERS = ("score_first", "behaviour_first", "signal_first")


@dataclass(frozen=True)
class _Idea:
    change: dict
    if_: str
    then: str
    because: str
    target: str  # a backtest metric where one applies, else avg_at_k
    op: str
    threshold: float
    rollback: str
    evidence: tuple[str, ...]


def _find(findings: tuple[Finding, ...], *codes: str) -> Finding | None:
    for f in findings:
        if f.severity in ("warning", "critical") and (f.code in codes or (f.rule and f.rule in codes)):
            return f
    return None


class PlaybookAgent:
    name = "playbook"

    def propose(self, ctx: AgentContext) -> list[Intervention]:
        findings = ctx.health.findings if ctx.health else ()
        harness = ctx.parent_spec.harness
        train = ctx.parent_spec.train
        ideas: list[_Idea] = []
        names = [c.name for c in harness.rewards]

        # Validity first: a score read out of the git history says nothing about the policy.
        leak = _find(findings, "git_history_leak")
        if leak is not None and not harness.swe.clear_git_log:
            ideas.append(_Idea(
                {"factor": "env", "name": "clear_git_log", "value": True},
                "we give each task repo a single commit of the buggy state (clear_git_log)",
                "correctness falls to what the policy can find without the history, and Git% stops paying",
                "rollouts that ran git log/show were correct far more often: the fix was copied from the history",
                "avg_at_k", ">=", 0.0, "restore the repository history (clear_git_log = false)",
                (leak.finding_id,)))

        hacking = _find(findings, "R4", "reward_hacking")
        if hacking is not None:
            shaped = [c for c in harness.rewards if c.name not in ("correctness", "correctness_tiers")]
            if shaped:
                worst = max(shaped, key=lambda c: abs(c.weight))
                ideas.append(_Idea(
                    {"factor": "reward", "op": "remove", "component": {"name": worst.name, "weight": worst.weight}},
                    f"we remove the shaped component '{worst.name}'", "correctness rises with the reward again",
                    "the shaped reward rose while binary correctness did not (reward hacking)",
                    "order_violations", "<=", 0.0, f"re-add '{worst.name}' at weight {worst.weight}",
                    (hacking.finding_id,)))

        dead = _find(findings, "R1", "dead_groups", "insufficient_signal")
        if dead is not None:
            if harness.group_filter.kind != "std_ema":
                ideas.append(_Idea(
                    {"factor": "filter", "group_filter": GroupFilterSpec(kind="std_ema").model_dump()},
                    "we filter groups with StdGroupFilter (EMA threshold, keep 0.9)",
                    "the share of gradient-carrying rollouts rises and dead groups stop diluting the update",
                    f"{dead.message}", "effective_data", ">", 0.0, "set the group filter back to none",
                    (dead.finding_id,)))
            if not harness.data_selection.drop_saturated or not harness.data_selection.drop_unsolved:
                ideas.append(_Idea(
                    {"factor": "data", "data_selection": DataSelectionSpec(drop_saturated=True, drop_unsolved=True,
                                                                           source_version=ctx.parent).model_dump()},
                    "we drop items every sample solved or none did", "the dead-group ratio falls",
                    "a group of identical outcomes has zero reward variance and no GRPO signal",
                    "dgr", "<", 0.0, "train on the full item set again", (dead.finding_id,)))
            if "correctness_tiers" not in names:
                ideas.append(_Idea(
                    {"factor": "reward", "op": "add", "component": {"name": "correctness_tiers", "weight": 0.2}},
                    "we add tiered correctness (partial credit)", "fewer groups have zero reward variance",
                    "a more continuous reward separates samples that binary correctness ties", "dgr", "<", 0.0,
                    "remove correctness_tiers", (dead.finding_id,)))

        saturated = _find(findings, "saturated_items", "item_saturation")
        if saturated is not None and not harness.data_selection.drop_saturated:
            ideas.append(_Idea(
                {"factor": "data", "data_selection": DataSelectionSpec(drop_saturated=True,
                                                                       source_version=ctx.parent).model_dump()},
                "we drop saturated items", "the dead-group ratio falls", "items solved by every sample teach nothing",
                "dgr", "<", 0.0, "train on the full item set again", (saturated.finding_id,)))
        unsolved = _find(findings, "unsolved_items", "never_solved")
        if unsolved is not None and harness.data_selection.curriculum == "none":
            ideas.append(_Idea(
                {"factor": "data", "data_selection": DataSelectionSpec(curriculum="easy_first",
                                                                       source_version=ctx.parent).model_dump()},
                "we order items easy first", "early steps carry reward variance",
                "never-solved items give all-zero groups", "avg_at_k", ">", 0.0, "train in random order again",
                (unsolved.finding_id,)))

        trunc = _find(findings, "truncation", "high_truncation")
        if trunc is not None:
            if "overlong" not in names:
                ideas.append(_Idea(
                    {"factor": "reward", "op": "add", "component": {"name": "overlong", "weight": 0.5,
                                                                    "params": {"cache_tokens": 16.0}}},
                    "we add a soft overlong penalty", "fewer completions hit the length limit",
                    "truncated completions never reach an answer", "order_violations", "<=", 0.0,
                    "remove the overlong component", (trunc.finding_id,)))
            ideas.append(_Idea(
                {"factor": "env", "name": "max_completion_length", "value": min(8192, train.max_completion_length * 2)},
                "we double the completion budget", "truncation falls and correct answers fit",
                "the answer comes after the current budget", "avg_at_k", ">", 0.0,
                f"restore max_completion_length = {train.max_completion_length}", (trunc.finding_id,)))
            if not harness.trajectory_filter.drop_truncated:
                ideas.append(_Idea(
                    {"factor": "filter", "trajectory_filter": TrajectoryFilterSpec(drop_truncated=True).model_dump()},
                    "we mask truncated completions out of the loss", "no gradient rewards unfinished answers",
                    "truncated rollouts are scored on text that never ended", "correct_wrongly_filtered", "<=", 0.0,
                    "stop masking truncated completions", (trunc.finding_id,)))

        fmt = _find(findings, "format_violations", "format_violation")
        if fmt is not None:
            w = next((c.weight for c in harness.rewards if c.name == "format"), None)
            change = ({"factor": "reward", "op": "reweight", "component": {"name": "format", "weight": min(1.0, w * 3 or 0.3)}}
                      if w is not None else {"factor": "reward", "op": "add", "component": {"name": "format", "weight": 0.2}})
            ideas.append(_Idea(change, "we weight the format component more", "format violations fall",
                               "the policy is not paid enough to follow the answer format", "order_violations", "<=",
                               0.0, "restore the format weight", (fmt.finding_id,)))

        gaming = _find(findings, "length_gaming", "length_correctness")
        if gaming is not None and "overlong" not in names:
            ideas.append(_Idea(
                {"factor": "reward", "op": "add", "component": {"name": "overlong", "weight": 0.5,
                                                                "params": {"cache_tokens": 16.0}}},
                "we penalise overlong completions", "length stops tracking reward",
                "length correlates with reward beyond correctness", "order_violations", "<=", 0.0,
                "remove the overlong component", (gaming.finding_id,)))

        collapse = _find(findings, "R3", "exploration_collapse", "logprob_collapse")
        if collapse is not None and train.temperature < 1.5:
            ideas.append(_Idea(
                {"factor": "hparam", "name": "temperature", "value": round(min(2.0, train.temperature + 0.2), 2)},
                "we raise the sampling temperature by 0.2", "sample diversity and reward spread recover",
                "mean log-prob near 0 means the policy stopped exploring", "avg_at_k", ">", 0.0,
                f"restore temperature {train.temperature}", (collapse.finding_id,)))

        dead_training = _find(findings, "dead_training", "loss_zero")
        if dead_training is not None or not ideas:
            lr = train.learning_rate
            ideas.append(_Idea(
                {"factor": "hparam", "name": "learning_rate", "value": float(min(1e-3, lr * 2))},
                "we double the learning rate", "held-out Avg@k moves beyond the seed noise",
                "the last versions changed too little to measure" if dead_training is None else dead_training.message,
                "avg_at_k", ">", 0.0, f"restore learning_rate {lr:g}",
                (dead_training.finding_id,) if dead_training else ()))

        ideas = self._escalate(ctx, ideas, harness)
        tried = ctx.tried()
        out: list[Intervention] = []
        for idea in ideas:
            try:
                iv = interventions.new(
                    parent=ctx.parent, change=idea.change,
                    hypothesis={"if": idea.if_, "then": idea.then, "because": idea.because},
                    target_metric=idea.target,
                    success_criterion={"metric": idea.target, "op": idea.op, "threshold": idea.threshold},
                    rollback_plan=idea.rollback, evidence=idea.evidence, author="playbook",
                    rationale=f"layer {LAYER_OF[idea.change['factor']]}; consecutive failures {ctx.consecutive_failures}",
                )
                interventions.apply(iv, harness, train)  # drop ideas that would not change anything
            except interventions.InterventionError:
                continue
            if interventions.describe(iv) in tried or any(o.intervention_id == iv.intervention_id for o in out):
                continue
            out.append(iv)
            if len(out) >= ctx.n_candidates:
                break
        return out

    def _escalate(self, ctx: AgentContext, ideas: list[_Idea], harness) -> list[_Idea]:
        n = ctx.consecutive_failures
        if n >= 2:
            order = ORDERS[(ORDERS.index(harness.analysis_order) + 1) % len(ORDERS)]
            proc = _Idea({"factor": "procedure", "analysis_order": order},
                         f"we switch the analysis order to {order}", "the next diagnosis finds a different bottleneck",
                         f"{n} versions in a row failed under {harness.analysis_order}", "avg_at_k", ">", 0.0,
                         f"return to {harness.analysis_order}", ())
            ideas = [proc, *ideas]
        if n >= 3:
            recent = [h.intervention.change.factor for h in ctx.history[-3:] if h.intervention is not None]
            recent_layers = {LAYER_OF[f] for f in recent}
            fresh = [i for i in ideas if LAYER_OF[i.change["factor"]] not in recent_layers]
            stale = [i for i in ideas if LAYER_OF[i.change["factor"]] in recent_layers]
            shaped = [c for c in harness.rewards if c.name not in ("correctness", "correctness_tiers")]
            simplify = []
            if shaped and len(harness.rewards) > 1:
                c = shaped[-1]
                simplify = [_Idea({"factor": "reward", "op": "remove", "component": {"name": c.name, "weight": c.weight}},
                                  f"we simplify the reward by removing '{c.name}'", "the signal is easier to follow",
                                  f"{n} consecutive failures: re-check the harness itself", "order_violations", "<=",
                                  0.0, f"re-add '{c.name}'", ())]
            ideas = [*fresh, *simplify, *stale]
        return ideas

    def rank(self, ctx: AgentContext, candidates: list[tuple[Intervention, BacktestReport | None]]
             ) -> list[tuple[Intervention, BacktestReport | None]]:
        """Supported by its backtest first, then inconclusive, then contradicted; stable otherwise."""
        def key(pair):
            _, report = pair
            return VERDICT_ORDER.get(report.verdict, 1) if report is not None else 1

        return sorted(candidates, key=key)
