"""The offline playbook agent: findings -> candidate single-factor interventions -> rank by backtest.

It follows PAPER-FACTS' loop: one falsifiable hypothesis per intervention, candidates from the
layer the evidence points at (signal: dead groups, spread; behaviour: truncation, format, length;
data: saturated / never-solved items; reward: hacking, simplification), ranked by their backtest
verdicts. Children always branch from the best version, which is the roll-back.

Candidate order:
1. validity first (a leak makes every score meaningless);
2. skills from the library (`evotrainer.skills`) whose trigger matches the parent's findings and
   that worked in this campaign's domain;
3. the built-in rules, ordered by the parent harness's analysis order (`HarnessSpec.analysis_order`):
   score_first = score, signal, data, behaviour, model-state layers; behaviour_first = behaviour and
   model state first; signal_first = signal and data first (the order within a layer is kept).
Escalation (`_escalate`):
- 2 consecutive non-promotions, or saturation (the last 3 recipe changes each moved Avg@k by < 1pp,
  `AgentContext.saturation`), adds a procedure change: the next analysis order;
- 3 consecutive non-promotions: prefer layers not used in the last 3 interventions, and simplify the
  reward (remove a shaped component).
Transfer: after `skills.TRANSFER_AFTER_FAILURES` (3) consecutive non-promotions, or when no untried
in-domain candidate is left (every rule and in-domain skill already tried on this parent, apart from
the generic learning-rate fallback and the procedure switch), skills that worked only in other domains
are offered right after the validity candidates, each with a rationale that names the skill and the
domains it comes from. Every retrieval, with what it found, goes to the campaign's search trace
(`memory.record_search`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import interventions
from ..schema import BacktestReport, DataSelectionSpec, Finding, GroupFilterSpec, Intervention, TrajectoryFilterSpec
from .base import AgentContext

LAYER_OF = {"filter": "signal", "data": "data", "reward": "reward", "env": "behaviour", "hparam": "signal",
            "procedure": "procedure", "diagnostic": "procedure"}
VERDICT_ORDER = {"supports": 0, "inconclusive": 1, "contradicts": 2}
ORDERS = ("score_first", "behaviour_first", "signal_first")
# Which diagnostic layer a built-in rule answers, and the order each analysis procedure reads them in.
ANALYSIS_LAYERS = {
    "score_first": ("validity", "score", "signal", "data", "behaviour", "model", "infra"),
    "behaviour_first": ("validity", "behaviour", "model", "score", "signal", "data", "infra"),
    "signal_first": ("validity", "signal", "data", "score", "behaviour", "model", "infra"),
}


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
    layer: str = "infra"  # the diagnostic layer it answers (ANALYSIS_LAYERS)
    generic: bool = False  # the fallback when nothing specific applies (not an in-domain recipe)
    rationale: str | None = None  # None: "layer ...; consecutive failures ..."
    relative: bool = True  # the success criterion is relative to the parent
    source: str = "rule"  # rule | skill | transfer | escalation


def _find(findings: tuple[Finding, ...], *codes: str) -> Finding | None:
    for f in findings:
        if f.severity in ("warning", "critical") and (f.code in codes or (f.rule and f.rule in codes)):
            return f
    return None


class PlaybookAgent:
    name = "playbook"

    def _rules(self, ctx: AgentContext) -> list[_Idea]:
        """The built-in finding -> candidate rules (the ARCHITECTURE table)."""
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
                (leak.finding_id,), layer="validity"))

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
                    (hacking.finding_id,), layer="score"))

        dead = _find(findings, "R1", "dead_groups", "insufficient_signal")
        if dead is not None:
            if harness.group_filter.kind != "std_ema":
                ideas.append(_Idea(
                    {"factor": "filter", "group_filter": GroupFilterSpec(kind="std_ema").model_dump()},
                    "we filter groups with StdGroupFilter (EMA threshold, keep 0.9)",
                    "the share of gradient-carrying rollouts rises and dead groups stop diluting the update",
                    f"{dead.message}", "effective_data", ">", 0.0, "set the group filter back to none",
                    (dead.finding_id,), layer="signal"))
            if not harness.data_selection.drop_saturated or not harness.data_selection.drop_unsolved:
                ideas.append(_Idea(
                    {"factor": "data", "data_selection": DataSelectionSpec(drop_saturated=True, drop_unsolved=True,
                                                                           source_version=ctx.parent).model_dump()},
                    "we drop items every sample solved or none did", "the dead-group ratio falls",
                    "a group of identical outcomes has zero reward variance and no GRPO signal",
                    "dgr", "<", 0.0, "train on the full item set again", (dead.finding_id,), layer="signal"))
            if "correctness_tiers" not in names:
                ideas.append(_Idea(
                    {"factor": "reward", "op": "add", "component": {"name": "correctness_tiers", "weight": 0.2}},
                    "we add tiered correctness (partial credit)", "fewer groups have zero reward variance",
                    "a more continuous reward separates samples that binary correctness ties", "dgr", "<", 0.0,
                    "remove correctness_tiers", (dead.finding_id,), layer="signal"))

        saturated = _find(findings, "saturated_items", "item_saturation")
        if saturated is not None and not harness.data_selection.drop_saturated:
            ideas.append(_Idea(
                {"factor": "data", "data_selection": DataSelectionSpec(drop_saturated=True,
                                                                       source_version=ctx.parent).model_dump()},
                "we drop saturated items", "the dead-group ratio falls", "items solved by every sample teach nothing",
                "dgr", "<", 0.0, "train on the full item set again", (saturated.finding_id,), layer="data"))
        unsolved = _find(findings, "unsolved_items", "never_solved")
        if unsolved is not None and harness.data_selection.curriculum == "none":
            ideas.append(_Idea(
                {"factor": "data", "data_selection": DataSelectionSpec(curriculum="easy_first",
                                                                       source_version=ctx.parent).model_dump()},
                "we order items easy first", "early steps carry reward variance",
                "never-solved items give all-zero groups", "avg_at_k", ">", 0.0, "train in random order again",
                (unsolved.finding_id,), layer="data"))

        trunc = _find(findings, "truncation", "high_truncation")
        if trunc is not None:
            if "overlong" not in names:
                ideas.append(_Idea(
                    {"factor": "reward", "op": "add", "component": {"name": "overlong", "weight": 0.5,
                                                                    "params": {"cache_tokens": 16.0}}},
                    "we add a soft overlong penalty", "fewer completions hit the length limit",
                    "truncated completions never reach an answer", "order_violations", "<=", 0.0,
                    "remove the overlong component", (trunc.finding_id,), layer="behaviour"))
            ideas.append(_Idea(
                {"factor": "env", "name": "max_completion_length", "value": min(8192, train.max_completion_length * 2)},
                "we double the completion budget", "truncation falls and correct answers fit",
                "the answer comes after the current budget", "avg_at_k", ">", 0.0,
                f"restore max_completion_length = {train.max_completion_length}", (trunc.finding_id,),
                layer="behaviour"))
            if not harness.trajectory_filter.drop_truncated:
                ideas.append(_Idea(
                    {"factor": "filter", "trajectory_filter": TrajectoryFilterSpec(drop_truncated=True).model_dump()},
                    "we mask truncated completions out of the loss", "no gradient rewards unfinished answers",
                    "truncated rollouts are scored on text that never ended", "correct_wrongly_filtered", "<=", 0.0,
                    "stop masking truncated completions", (trunc.finding_id,), layer="behaviour"))

        fmt = _find(findings, "format_violations", "format_violation")
        if fmt is not None:
            w = next((c.weight for c in harness.rewards if c.name == "format"), None)
            change = ({"factor": "reward", "op": "reweight", "component": {"name": "format", "weight": min(1.0, w * 3 or 0.3)}}
                      if w is not None else {"factor": "reward", "op": "add", "component": {"name": "format", "weight": 0.2}})
            ideas.append(_Idea(change, "we weight the format component more", "format violations fall",
                               "the policy is not paid enough to follow the answer format", "order_violations", "<=",
                               0.0, "restore the format weight", (fmt.finding_id,), layer="behaviour"))

        gaming = _find(findings, "length_gaming", "length_correctness")
        if gaming is not None and "overlong" not in names:
            ideas.append(_Idea(
                {"factor": "reward", "op": "add", "component": {"name": "overlong", "weight": 0.5,
                                                                "params": {"cache_tokens": 16.0}}},
                "we penalise overlong completions", "length stops tracking reward",
                "length correlates with reward beyond correctness", "order_violations", "<=", 0.0,
                "remove the overlong component", (gaming.finding_id,), layer="behaviour"))

        collapse = _find(findings, "R3", "exploration_collapse", "logprob_collapse")
        if collapse is not None and train.temperature < 1.5:
            ideas.append(_Idea(
                {"factor": "hparam", "name": "temperature", "value": round(min(2.0, train.temperature + 0.2), 2)},
                "we raise the sampling temperature by 0.2", "sample diversity and reward spread recover",
                "mean log-prob near 0 means the policy stopped exploring", "avg_at_k", ">", 0.0,
                f"restore temperature {train.temperature}", (collapse.finding_id,), layer="model"))

        dead_training = _find(findings, "dead_training", "loss_zero")
        if dead_training is not None or not ideas:
            lr = train.learning_rate
            ideas.append(_Idea(
                {"factor": "hparam", "name": "learning_rate", "value": float(min(1e-3, lr * 2))},
                "we double the learning rate", "held-out Avg@k moves beyond the seed noise",
                "the last versions changed too little to measure" if dead_training is None else dead_training.message,
                "avg_at_k", ">", 0.0, f"restore learning_rate {lr:g}",
                (dead_training.finding_id,) if dead_training else (), layer="infra", generic=dead_training is None))
        return ideas

    def propose(self, ctx: AgentContext) -> list[Intervention]:
        from ..skills import TRANSFER_AFTER_FAILURES, transfer_allowed

        harness = ctx.parent_spec.harness
        order = ANALYSIS_LAYERS.get(harness.analysis_order, ANALYSIS_LAYERS["score_first"])
        rules = sorted(self._rules(ctx), key=lambda i: order.index(i.layer) if i.layer in order else len(order))
        validity = self._materialise(ctx, [i for i in rules if i.layer == "validity"])
        rest = [i for i in rules if i.layer != "validity"]

        # In-domain skills (validated here before) come before the generic rules; a rule that makes the
        # same change gives way to the skill, whose record then counts the use.
        lib = ctx.skill_library()
        tried = ctx.tried_interventions()
        n = ctx.consecutive_failures
        found = lib.retrieve(ctx.health, ctx.domain, tried=tried) if ctx.health else []
        own = [self._from_skill(ctx, s, transfer=None) for s in found]
        own_keys = {_key(i.change) for i in own}
        rest = [i for i in rest if _key(i.change) not in own_keys]
        in_domain = self._materialise(ctx, self._escalate(ctx, [*own, *rest], harness))

        # Other domains' skills: only after in-domain attempts failed (or nothing in-domain is left).
        exhausted = not validity and not any(src != "escalation" and not generic for _, src, generic in in_domain)
        allowed = transfer_allowed(n, exhausted)
        cross, transfers = [], []
        if allowed and ctx.health is not None:
            cross = [s for s in lib.retrieve(ctx.health, ctx.domain, tried=tried, failures=n, exhausted=exhausted)
                     if s.is_transfer(ctx.domain)]
            why = (f"{n} versions in a row without a promotion (>= {TRANSFER_AFTER_FAILURES})"
                   if n >= TRANSFER_AFTER_FAILURES else "no untried in-domain candidate left")
            transfers = self._materialise(ctx, [self._from_skill(ctx, s, transfer=why) for s in cross])
        self._trace(ctx, lib, found, cross, n, exhausted, allowed)

        out: list[Intervention] = []
        for iv, _, _ in [*validity, *transfers, *in_domain]:
            if any(o.intervention_id == iv.intervention_id or interventions.describe(o) == interventions.describe(iv)
                   for o in out):
                continue
            out.append(iv)
            if len(out) >= ctx.n_candidates:
                break
        return out

    # ---- skills

    def _from_skill(self, ctx: AgentContext, skill, transfer: str | None) -> _Idea:
        change = dict(skill.template)
        if change.get("factor") == "data":
            change["data_selection"] = {**change["data_selection"], "source_version": ctx.parent}
        matched = skill.matched(ctx.health) or ()
        crit = skill.success_criterion
        if transfer:
            rationale = (f"skill {skill.skill_id} '{skill.title}': TRANSFER from domain {', '.join(skill.domains)} "
                         f"to {ctx.domain} (cross-domain fallback: {transfer}); it worked in "
                         f"{skill.successes()} version(s) there, {skill.failures(ctx.domain)} failed use(s) in "
                         f"{ctx.domain}; consecutive failures {ctx.consecutive_failures}")
        else:
            rationale = (f"skill {skill.skill_id} '{skill.title}': in-domain ({ctx.domain}: worked "
                         f"{skill.successes(ctx.domain)}x, failed {skill.failures(ctx.domain)}x); "
                         f"consecutive failures {ctx.consecutive_failures}")
        return _Idea(change, skill.hypothesis.if_, skill.hypothesis.then, skill.hypothesis.because,
                     crit.metric, crit.op, crit.threshold, skill.rollback_plan, tuple(matched),
                     layer="skill", rationale=rationale, relative=crit.relative_to_parent,
                     source="transfer" if transfer else "skill")

    def _trace(self, ctx, lib, found, cross, n, exhausted, allowed) -> None:
        if ctx.store is None:
            return
        from .. import memory

        codes = sorted({f.code for f in (ctx.health.alerts if ctx.health else ())})
        memory.record_search(
            ctx.store, "skills.retrieve",
            {"version": ctx.version, "parent": ctx.parent, "domain": ctx.domain, "findings": codes,
             "consecutive_failures": n, "in_domain_exhausted": exhausted, "transfer_allowed": allowed},
            str(lib.root), self.name,
            found=[{"skill_id": s.skill_id, "title": s.title, "status": s.status, "domains": list(s.domains),
                    "transfer": s.is_transfer(ctx.domain)} for s in [*found, *cross]])

    # ---- building candidates

    def _materialise(self, ctx: AgentContext, ideas: list[_Idea]) -> list[tuple[Intervention, str, bool]]:
        """Ideas as validated interventions that change something and were not tried on this parent."""
        harness, train = ctx.parent_spec.harness, ctx.parent_spec.train
        tried = ctx.tried()
        out: list[tuple[Intervention, str, bool]] = []
        for idea in ideas:
            try:
                iv = interventions.new(
                    parent=ctx.parent, change=idea.change,
                    hypothesis={"if": idea.if_, "then": idea.then, "because": idea.because},
                    target_metric=idea.target,
                    success_criterion={"metric": idea.target, "op": idea.op, "threshold": idea.threshold,
                                       "relative_to_parent": idea.relative},
                    rollback_plan=idea.rollback, evidence=idea.evidence, author="playbook",
                    rationale=idea.rationale or (f"layer {LAYER_OF[idea.change['factor']]}; "
                                                 f"consecutive failures {ctx.consecutive_failures}"),
                )
                interventions.apply(iv, harness, train)  # drop ideas that would not change anything
            except interventions.InterventionError:
                continue
            if interventions.describe(iv) in tried or any(o.intervention_id == iv.intervention_id for o, _, _ in out):
                continue
            out.append((iv, idea.source, idea.generic))
        return out

    def _escalate(self, ctx: AgentContext, ideas: list[_Idea], harness) -> list[_Idea]:
        n = ctx.consecutive_failures
        validity = [i for i in ideas if i.layer == "validity"]
        ideas = [i for i in ideas if i.layer != "validity"]
        saturated = ctx.saturation()
        if n >= 2 or saturated:
            order = ORDERS[(ORDERS.index(harness.analysis_order) + 1) % len(ORDERS)]
            if n >= 2:
                because = f"{n} versions in a row failed under {harness.analysis_order}"
            else:
                gains = ", ".join(f"{v} {g * 100:+.1f}pp" for v, g in saturated)
                because = (f"saturation under {harness.analysis_order}: the last {len(saturated)} recipe changes each "
                           f"moved Avg@k by less than 1pp ({gains})")
            proc = _Idea({"factor": "procedure", "analysis_order": order},
                         f"we switch the analysis order to {order}", "the next diagnosis finds a different bottleneck",
                         because, "avg_at_k", ">", 0.0, f"return to {harness.analysis_order}", (),
                         layer="procedure", source="escalation",
                         rationale=f"procedure escalation ({'saturation' if saturated and n < 2 else 'failures'}): "
                                   f"{because}")
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
                                  0.0, f"re-add '{c.name}'", (), layer="score", source="escalation")]
            ideas = [*fresh, *simplify, *stale]
        return [*validity, *ideas]

    def rank(self, ctx: AgentContext, candidates: list[tuple[Intervention, BacktestReport | None]]
             ) -> list[tuple[Intervention, BacktestReport | None]]:
        """Supported by its backtest first, then inconclusive, then contradicted; stable otherwise."""
        def key(pair):
            _, report = pair
            return VERDICT_ORDER.get(report.verdict, 1) if report is not None else 1

        return sorted(candidates, key=key)


def _key(change: dict) -> str:
    from ..skills import skill_id_for

    try:
        return skill_id_for(change)
    except Exception:  # noqa: BLE001 - an idea that is not a valid change never matches a skill
        return repr(change)
