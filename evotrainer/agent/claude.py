"""The Claude trainer agent: Anthropic's Messages API with tool use over the store.

The only module of the project that imports `anthropic`. Any Anthropic-compatible endpoint works:
the model, the base URL (`ClaudeAgentSpec.base_url`, else ANTHROPIC_BASE_URL, else the SDK's
default) and the budget come from the campaign's `[claude]` config; the API key comes from
ANTHROPIC_API_KEY when the agent starts and is never stored.

propose(ctx): one conversation per version. The model reads the store through the tools in
`agent/tools.py` (versions and decisions, health reports, evidence queries and samples,
diagnostics, backtests, memory, skills) and answers with `propose_intervention` calls. Each one is
validated against the parent (`interventions.new` + `interventions.apply`); an invalid one goes back
to the model as an error tool_result and is never stored. The round ends when the model has
proposed `ctx.n_candidates` valid interventions, ends its turn, or used `max_tool_rounds` calls.

rank(ctx, pairs): one forced `rank_candidates` call with the backtests; a failed or malformed answer
falls back to the playbook's ranking (by backtest verdict).

Prompt caching: the system prompt and the campaign summary (stable for the campaign) carry a
`cache_control` breakpoint after the tool definitions, and the conversation's latest block carries
a second one, so each tool round re-reads its prefix from the cache.

Money: every phase appends an `AgentUsage` event (calls, tokens, cache tokens, cost from the
configured prices). Before each call the campaign's spend (the sum over those events plus the
current phase) is compared with `budget_usd`; once it is reached the agent stops calling the API
and the playbook answers, recorded. A process killed mid-phase loses that phase's event.

Failures: 429, 408/409, 5xx, timeouts and connection errors are retried (an `x-should-retry`
header overrides the status) with jittered exponential backoff (`backoff_base_s`, `backoff_max_s`)
that honours retry-after / retry-after-ms; the SDK's own retries are off. When the retries run out,
`on_api_failure = "fallback"` lets the playbook propose (the interventions' author is "playbook" and
their rationale names the fallback; a log line says so), and `"wait"` raises `ClaudeUnavailable`:
the controller stops before writing any proposal, so `evotrainer run --resume` redoes the phase.
"""
from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import anthropic

from .. import interventions
from ..errors import ConfigError, EvoTrainerError
from ..schema import HPARAMS, AgentUsage, BacktestReport, ClaudeAgentSpec, Intervention
from .base import AgentContext
from .playbook import PlaybookAgent
from .tools import TOOLS, ToolBox, clean, cut, dumps, finding_brief

Log = Callable[[str], None]
CACHE = {"type": "ephemeral"}
RETRY_STATUS = {408, 409, 429}
MAX_RETRY_AFTER_S = 600.0


class ClaudeUnavailable(EvoTrainerError):
    """The Messages API failed after its retries and on_api_failure = "wait": the campaign stops with
    its state intact; `evotrainer run --resume` retries the same phase."""


class _ApiFailure(Exception):
    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


SYSTEM_PROMPT = """\
You are the trainer agent of an EvoTrainer campaign: agentic RL in which an LLM policy and its \
training harness evolve together. Each version is a GRPO run of the base policy under a harness; a \
child version differs from its parent by exactly ONE intervention. Every rollout is stored as \
evidence. Your job in a propose step: read the evidence of the parent version, find the bottleneck, \
and propose single-factor interventions, each with a falsifiable hypothesis. The controller \
backtests your candidates on the parent's stored rollouts, trains the best one as the child, and a \
promotion gate compares child and parent on held-out items with paired statistics (diagnostics with \
a validity veto can block a high but invalid score).

How to work:
- Start from the parent's health report (findings have ids; cite them as evidence). Check claims on \
the raw evidence (query_evidence aggregates, sample_rollouts / sample_turns read text) before \
proposing. Tool outputs are capped: ask narrow questions.
- Prefer the layer the evidence points at: signal (dead groups, reward spread: filters, reward \
shaping), behaviour (truncation, format, length: env and reward), data (saturated or never-solved \
items), reward (hacking: a shaped reward rising while correctness does not), procedure. After \
repeated failures, switch layers and simplify the reward. Never repeat a change already tried on \
this parent.
- You may write a diagnostic (write_diagnostic) when no built-in measures what you need, and \
backtest a change yourself (backtest) before proposing it. Notes in memory persist across versions.
- Finish by calling propose_intervention once per candidate (up to the number asked for). A refused \
proposal comes back as an error with the reason: fix it and call again. When you have proposed \
your candidates, end your turn with a one-line summary.

An intervention's `change` is ONE of these shapes:
- reward: {"factor": "reward", "op": "add"|"remove"|"reweight"|"set_params", "component": \
{"name": NAME, "weight": W, "params": {...}}}  (remove: name and current weight)
- filter: {"factor": "filter", "group_filter": {"kind": "none"|"zero_std"|"std_ema", "keep_ratio": \
0.9, "ema_decay": 0.1, "min_keep": 0.5}}  OR  {"factor": "filter", "trajectory_filter": \
{"drop_truncated": true, "max_completion_tokens": N}}  (exactly one of the two)
- data: {"factor": "data", "data_selection": {"drop_saturated": bool, "drop_unsolved": bool, \
"source_version": V or null, "curriculum": "none"|"easy_first", "subsample": N or null}}
- hparam: {"factor": "hparam", "name": HPARAM, "value": v}  with HPARAM one of __HPARAMS__
- env: {"factor": "env", "name": "system_prompt"|"max_completion_length"|"clear_git_log"|"turn_cap"|\
"token_budget", "value": v}
- diagnostic: {"factor": "diagnostic", "op": "add"|"retire", "diagnostic": NAME}
- procedure: {"factor": "procedure", "analysis_order": "score_first"|"behaviour_first"|"signal_first"}

hypothesis: {"if": "we ...", "then": "... (observable)", "because": "... (the mechanism)"}. \
success_criterion: {"metric": M, "op": ">"|">="|"<"|"<=", "threshold": x, "relative_to_parent": true} \
where M is a backtest metric (dgr = dead-group ratio, reward_spread, effective_data, reward_mean, \
reward_std, filtered_share, order_violations, correct_wrongly_filtered_share) so the backtest can \
test it, or avg_at_k (held-out score, judged by the gate only). rollback_plan: how to undo it.
"""


def _system_prompt() -> str:
    return SYSTEM_PROMPT.replace("__HPARAMS__", ", ".join(HPARAMS))


def campaign_summary(store) -> str:
    """What stays true for the whole campaign (cached with the system prompt)."""
    from ..diagnostics import registry
    from ..harness import rewards as reward_mod
    from ..interventions import HPARAM_RANGES

    c = store.campaign
    lines = [
        f"Campaign {c.name}: domain {c.data.domain}, policy {c.policy}, preset {c.preset or '-'}, seed {c.seed}.",
        (f"Candidates per version: {c.candidates_per_version}; human gates: {', '.join(c.gates) or 'none'}; "
         f"warm start: {c.warm_start}."),
        "Base harness (v000): " + json.dumps(c.harness.model_dump(mode="json"), sort_keys=True),
        "Base train config: " + json.dumps(c.train.model_dump(mode="json"), sort_keys=True),
        "Data: " + json.dumps(c.data.model_dump(mode="json"), sort_keys=True),
        "Reward components: " + ", ".join(reward_mod.known()),
        "Built-in diagnostics: " + ", ".join(registry.known()),
        "Hyper-parameter ranges: " + ", ".join(f"{k} [{lo:g}, {hi:g}]" for k, (lo, hi) in HPARAM_RANGES.items()),
        ("Evidence tables: rollouts (one row per trajectory: rollout_uid, version, split, step, item_id, group_id, "
         "sample_idx, prompt, completion, n_completion_tokens, truncated, reward, r.<component>, verifier (JSON), "
         "correct, advantage, filtered, filter_reason, mean_logprob, n_turns, n_tool_calls, ...), turns (multi-turn: "
         "rollout_uid, turn_idx, role, text, tool_name, tool_args, tool_output, tool_ok), metrics (version, step, "
         "name, value)."),
    ]
    return "\n".join(lines)


@dataclass
class _Usage:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float = 0.0


def _block_dicts(content) -> list[dict[str, Any]]:
    """The assistant's blocks as request params (text and tool_use; empty text dropped)."""
    out = []
    for b in content:
        if b.type == "text" and b.text:
            out.append({"type": "text", "text": b.text})
        elif b.type == "tool_use":
            out.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
    return out


def _with_breakpoint(messages: list[dict]) -> list[dict]:
    """A copy whose last block carries cache_control: the conversation so far is cached for the next round."""
    out = [dict(m) for m in messages]
    last = dict(out[-1])
    blocks = [dict(b) for b in last["content"]]
    blocks[-1]["cache_control"] = CACHE
    last["content"] = blocks
    out[-1] = last
    return out


def _retry_after(headers) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


class ClaudeAgent:
    name = "claude"

    def __init__(self, spec: ClaudeAgentSpec | None = None, *, log: Log = print, client=None,
                 sleep: Callable[[float], None] = time.sleep):
        self.spec = spec or ClaudeAgentSpec()
        self.log = log
        self._sleep = sleep
        self._playbook = PlaybookAgent()
        if client is None:
            key = os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise ConfigError("the claude agent needs ANTHROPIC_API_KEY in the environment (it is never stored "
                                  "in the campaign); export it and rerun with --resume, or use --agent playbook")
            base_url = self.spec.base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
            # Our own retry loop (jittered, honours retry-after, configurable backoff): the SDK's is off.
            client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0, timeout=self.spec.timeout_s)
        self._client = client

    # ---- money

    @staticmethod
    def spent(store) -> float:
        """The campaign's API spend so far: the sum of its AgentUsage events."""
        return sum(e.cost_usd for e in store.ledger.events() if isinstance(e, AgentUsage))

    def _record(self, ctx: AgentContext, phase: str, usage: _Usage, outcome: str, reason: str) -> None:
        ev = AgentUsage(version=ctx.version, agent=self.name, model=self.spec.model, phase=phase, outcome=outcome,
                        calls=usage.calls, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                        cache_creation_tokens=usage.cache_creation_tokens, cache_read_tokens=usage.cache_read_tokens,
                        cost_usd=round(usage.cost_usd, 8), actor=self.name, reason=reason[:500])
        ctx.store.ledger.append(ev)
        total = self.spent(ctx.store)
        self.log(f"{ctx.version}: claude {phase} ({outcome}): {usage.calls} call(s), {usage.input_tokens} in / "
                 f"{usage.output_tokens} out tokens, cache {usage.cache_read_tokens} read / "
                 f"{usage.cache_creation_tokens} written, ${usage.cost_usd:.4f}; campaign ${total:.4f} of "
                 f"${self.spec.budget_usd:.2f}" + (f" ({reason})" if outcome != "answered" and reason else ""))

    # ---- one API call, with retries

    def _create(self, store, messages: list[dict], usage: _Usage, **extra):
        spec = self.spec
        kw: dict[str, Any] = {
            "model": spec.model, "max_tokens": spec.max_tokens, "tools": TOOLS, "messages": _with_breakpoint(messages),
            "system": [{"type": "text", "text": _system_prompt()},
                       {"type": "text", "text": campaign_summary(store), "cache_control": CACHE}],
        }
        if spec.temperature is not None:
            kw["temperature"] = spec.temperature
        kw.update(extra)
        attempt = 0
        while True:
            headers = None
            try:
                msg = self._client.messages.create(**kw)
                break
            except anthropic.APIStatusError as exc:
                headers = exc.response.headers
                hint = (headers.get("x-should-retry") or "").lower()  # the API's own say, when it gives one
                retryable = hint == "true" or (hint != "false" and (exc.status_code in RETRY_STATUS
                                                                     or exc.status_code >= 500))
                why = f"HTTP {exc.status_code}: {cut(exc.api_message or str(exc), 200)}"
            except anthropic.APITimeoutError:
                retryable, why = True, f"timed out after {spec.timeout_s:g} s"
            except anthropic.APIConnectionError as exc:
                retryable, why = True, f"connection failed: {cut(str(exc), 200)}"
            except anthropic.APIError as exc:  # e.g. an unreadable response body
                retryable, why = False, f"{type(exc).__name__}: {cut(str(exc), 200)}"
            if not retryable or attempt >= spec.max_retries:
                tries = f" after {attempt + 1} attempt(s)" if retryable else ""
                raise _ApiFailure(f"the Messages API failed{tries}: {why}")
            wait = _retry_after(headers)
            if wait is None:
                wait = min(spec.backoff_max_s, spec.backoff_base_s * 2 ** attempt) * random.uniform(0.5, 1.0)
            wait = min(wait, MAX_RETRY_AFTER_S)
            self.log(f"  claude: {why}; retry {attempt + 1} of {spec.max_retries} in {wait:.1f} s")
            self._sleep(wait)
            attempt += 1
        u = msg.usage
        cw, cr = u.cache_creation_input_tokens or 0, u.cache_read_input_tokens or 0
        usage.calls += 1
        usage.input_tokens += u.input_tokens or 0
        usage.output_tokens += u.output_tokens or 0
        usage.cache_creation_tokens += cw
        usage.cache_read_tokens += cr
        usage.cost_usd += spec.prices.cost(u.input_tokens or 0, u.output_tokens or 0, cw, cr)
        return msg

    # ---- propose

    def propose(self, ctx: AgentContext) -> list[Intervention]:
        usage = _Usage()
        spent = self.spent(ctx.store)
        if spent >= self.spec.budget_usd:
            why = f"budget reached: campaign spend ${spent:.4f} >= budget_usd ${self.spec.budget_usd:.2f}"
            return self._fallback(ctx, usage, why)
        box = ToolBox(ctx, author=self.name, max_chars=self.spec.max_tool_result_chars, log=self.log)
        messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": self._brief(ctx)}]}]
        nudged = False
        stop = "the model ended its turn"
        try:
            for _ in range(self.spec.max_tool_rounds):
                if spent + usage.cost_usd >= self.spec.budget_usd:
                    stop = (f"budget reached mid-round: campaign spend ${spent + usage.cost_usd:.4f} >= "
                            f"budget_usd ${self.spec.budget_usd:.2f}")
                    break
                msg = self._create(ctx.store, messages, usage)
                blocks = _block_dicts(msg.content)
                uses = [b for b in blocks if b["type"] == "tool_use"]
                if blocks:
                    messages.append({"role": "assistant", "content": blocks})
                if uses:
                    results = []
                    for b in uses:
                        text, err = box.call(b["name"], b["input"])
                        self.log(f"  claude -> {b['name']}" + (f": refused: {cut(text, 200)}" if err else ""))
                        res = {"type": "tool_result", "tool_use_id": b["id"], "content": text}
                        if err:
                            res["is_error"] = True
                        results.append(res)
                    messages.append({"role": "user", "content": results})
                    if len(box.proposals) >= ctx.n_candidates:
                        stop = f"{len(box.proposals)} valid proposals"
                        break
                    continue
                if box.proposals or nudged:
                    break
                nudged = True  # ended its turn without a proposal: ask once
                nudge = {"type": "text", "text": "You have not proposed anything yet. Call propose_intervention "
                                                 f"for up to {ctx.n_candidates} candidates now."}
                if messages[-1]["role"] == "user":
                    messages[-1] = {"role": "user", "content": [*messages[-1]["content"], nudge]}
                else:
                    messages.append({"role": "user", "content": [nudge]})
            else:
                stop = f"max_tool_rounds ({self.spec.max_tool_rounds}) used"
        except _ApiFailure as exc:
            if box.proposals:
                stop = f"{exc.why}; keeping the {len(box.proposals)} valid proposal(s) made before it"
            elif self.spec.on_api_failure == "wait":
                self._record(ctx, "propose", usage, "stopped", exc.why)
                raise ClaudeUnavailable(
                    f"{ctx.version}: {exc.why}; the campaign stopped before proposing (on_api_failure = \"wait\"); "
                    f"rerun with `evotrainer run --campaign {ctx.store.root} --resume` when the API is back") from None
            else:
                return self._fallback(ctx, usage, f"API failure: {exc.why}")
        if not box.proposals:
            return self._fallback(ctx, usage, f"no valid proposal ({stop})")
        self._record(ctx, "propose", usage, "answered", stop)
        return box.proposals[: ctx.n_candidates]

    def _fallback(self, ctx: AgentContext, usage: _Usage, why: str) -> list[Intervention]:
        """The playbook proposes; each intervention says so in its rationale (author "playbook")."""
        self.log(f"{ctx.version}: claude unavailable ({why}); the playbook proposes instead")
        out = []
        for iv in self._playbook.propose(ctx):
            fields = iv.model_dump(mode="json", by_alias=True, exclude={"intervention_id", "created_at"})
            fields["rationale"] = f"fallback for claude ({cut(why, 300)}); {iv.rationale}"
            out.append(interventions.new(**fields))
        self._record(ctx, "propose", usage, "fallback", why)
        return out

    def _brief(self, ctx: AgentContext) -> str:
        """The round's context: the parent, its harness, the history, its alerts, memory."""
        spec = ctx.parent_spec
        lines = [
            (f"Propose up to {ctx.n_candidates} candidate interventions for version {ctx.version}, a child of "
             f"{ctx.parent} (the best version so far; children always branch from it)."),
            f"Consecutive versions without promotion: {ctx.consecutive_failures}.",
            f"{ctx.parent}'s harness: " + json.dumps(spec.harness.model_dump(mode="json"), sort_keys=True),
            f"{ctx.parent}'s train config: " + json.dumps(spec.train.model_dump(mode="json"), sort_keys=True),
            "", "History (version, parent, change, outcome):",
        ]
        for h in ctx.history:
            what = interventions.describe(h.intervention) if h.intervention else "base"
            lines.append(f"- {h.version} <- {h.parent or '-'}: {what}; {h.outcome or 'not judged'}")
        tried = sorted(ctx.tried())
        lines.append("Already tried on " + ctx.parent + ": " + ("; ".join(tried) if tried else "nothing"))
        alerts = ctx.health.alerts if ctx.health else ()
        lines += ["", f"{ctx.parent}'s health alerts ({len(alerts)}; health_report has all findings and metrics):"]
        lines += [dumps(finding_brief(f)) for f in alerts[:25]] or ["none"]
        memo = self._memory(ctx)
        if memo:
            lines += ["", "Campaign memory:", memo]
        return "\n".join(lines)

    def _memory(self, ctx: AgentContext) -> str:
        try:
            from .. import memory
        except ImportError:
            return ""
        try:
            return memory.compact(ctx.store, max_chars=6000)
        except Exception as exc:  # noqa: BLE001 - memory is context, never a reason to stop
            self.log(f"  claude: memory.compact failed ({type(exc).__name__}: {exc}); continuing without it")
            return ""

    # ---- rank

    def rank(self, ctx: AgentContext, candidates: list[tuple[Intervention, BacktestReport | None]]
             ) -> list[tuple[Intervention, BacktestReport | None]]:
        fallback = self._playbook.rank(ctx, candidates)
        if len(candidates) <= 1:
            return fallback  # nothing to order: no call
        usage = _Usage()
        spent = self.spent(ctx.store)
        if spent >= self.spec.budget_usd:
            why = f"budget reached: campaign spend ${spent:.4f} >= budget_usd ${self.spec.budget_usd:.2f}"
            self._record(ctx, "rank", usage, "fallback", why + "; the playbook's ranking (by verdict)")
            return fallback
        ids = [iv.intervention_id for iv, _ in candidates]
        box = ToolBox(ctx, author=self.name, max_chars=self.spec.max_tool_result_chars, phase="rank",
                      rank_ids=tuple(ids), log=self.log)
        lines = [(f"Rank the candidates for {ctx.version} (child of {ctx.parent}), best first, with rank_candidates. "
                  "Weigh each backtest (counterfactual on the parent's rollouts: evidence, not a prediction), the "
                  "hypothesis, and the risk to held-out correctness."), ""]
        for iv, bt in candidates:
            row: dict[str, Any] = {"id": iv.intervention_id, "change": interventions.describe(iv), "author": iv.author,
                                   "hypothesis": iv.hypothesis.text(), "criterion": iv.success_criterion.text()}
            if bt is not None:
                row["backtest"] = {"verdict": bt.verdict, "reasons": [cut(r, 300) for r in bt.reasons[:6]],
                                   "effective_data": [bt.effective_data_before, bt.effective_data_after],
                                   "groups_rescued": bt.groups_rescued, "groups_killed": bt.groups_killed,
                                   "order_violations": bt.order_violations,
                                   "correct_wrongly_filtered": bt.correct_wrongly_filtered}
            else:
                row["backtest"] = None
            lines.append(dumps(clean(row)))
        messages = [{"role": "user", "content": [{"type": "text", "text": "\n".join(lines)}]}]
        try:
            msg = self._create(ctx.store, messages, usage, tool_choice={"type": "tool", "name": "rank_candidates"})
        except _ApiFailure as exc:
            if self.spec.on_api_failure == "wait":
                self._record(ctx, "rank", usage, "stopped", exc.why)
                raise ClaudeUnavailable(
                    f"{ctx.version}: {exc.why}; the campaign stopped before selecting (on_api_failure = \"wait\"); "
                    f"rerun with `evotrainer run --campaign {ctx.store.root} --resume` when the API is back") from None
            self._record(ctx, "rank", usage, "fallback", f"API failure: {exc.why}; the playbook's ranking")
            return fallback
        call = next((b for b in msg.content if b.type == "tool_use" and b.name == "rank_candidates"), None)
        err = "no rank_candidates call"
        if call is not None:
            text, failed = box.call("rank_candidates", call.input)
            err = text if failed else ""
        if box.ranking is None:
            self.log(f"{ctx.version}: claude's ranking is malformed ({cut(err, 200)}); using the playbook's ranking")
            self._record(ctx, "rank", usage, "fallback", f"malformed ranking: {cut(err, 300)}")
            return fallback
        by_id = {iv.intervention_id: (iv, bt) for iv, bt in candidates}
        reason = call.input.get("reason") if isinstance(call.input, dict) else None
        self._record(ctx, "rank", usage, "answered", str(reason or "ranked")[:500])
        return [by_id[i] for i in box.ranking]
