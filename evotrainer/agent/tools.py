"""The tools a model-backed trainer agent calls: store-backed, bounded, and free of any LLM SDK.

`TOOLS` holds their definitions (name, description, JSON input schema) in the Messages API's tool
format; `ToolBox(ctx).call(name, input)` runs one and returns `(text, is_error)`. Every output is
capped (rows and characters), so one tool call cannot flood the model's context. A tool that is
given bad input returns an error text (`is_error = True`) that says what to fix; nothing is written
to the store for it. What the tools write, and only when asked:

- `propose_intervention`: nothing to the store. A valid proposal (checked with `interventions.new`
  and `interventions.apply` against the parent's harness, not already tried on that parent, citing
  known finding ids) joins `ToolBox.proposals`; the controller stores the ones the agent returns.
- `write_diagnostic`: a diagnostic that ran cleanly is saved as a revision (author = the agent).
- `write_memory`: an append-only note (`evotrainer.memory`).

`backtest` runs `run_backtest` on the parent's stored rollouts and stores nothing. Reads of the
store are traced with `memory.record_search` when the memory module is there. Memory and skills
are imported lazily; when a module is missing, its tools answer "not available".
"""
from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from .. import interventions
from ..errors import EvoTrainerError
from ..schema import Finding, Intervention
from .base import AgentContext

MAX_QUERY_ROWS = 50
MAX_SAMPLE_ROWS = 20
MAX_TURNS = 40
MAX_FINDINGS = 40
MAX_METRICS = 150
DEFAULT_CELL_CHARS = 400
MAX_CELL_CHARS = 2000

SAMPLE_COLUMNS = ("rollout_uid", "step", "item_id", "group_id", "sample_idx", "reward", "correct", "advantage",
                  "filtered", "n_completion_tokens", "truncated", "prompt", "completion")
TURN_SAMPLE_COLUMNS = ("rollout_uid", "turn_idx", "role", "text", "tool_name", "tool_args", "tool_output", "tool_ok",
                       "n_tokens")
WHERE_OPS = ("==", "!=", ">", ">=", "<", "<=", "in", "not_in", "is_null", "not_null", "contains")
AGG_FNS = ("mean", "sum", "min", "max", "std", "median", "count", "n_unique")


class ToolError(Exception):
    """Bad input or an impossible request: returned to the model as an error result, nothing stored."""


# --------------------------------------------------------------------------- tool definitions

_STEPS = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
          "description": "inclusive step range [first, last]; omit for all steps"}
_WHERE = {"type": "array", "description": "row filters, all must hold",
          "items": {"type": "object", "properties": {
              "column": {"type": "string"}, "op": {"type": "string", "enum": list(WHERE_OPS)},
              "value": {"description": "a scalar; a list for in / not_in; omit for is_null / not_null"}},
              "required": ["column", "op"]}}
_CHANGE = {"type": "object", "description": (
    "exactly one change; its 'factor' is one of reward, filter, data, hparam, env, diagnostic, procedure "
    "(shapes in the system prompt)"), "properties": {"factor": {"type": "string", "enum": [
        "reward", "filter", "data", "hparam", "env", "diagnostic", "procedure"]}}, "required": ["factor"]}
_CRITERION = {"type": "object", "properties": {
    "metric": {"type": "string"}, "op": {"type": "string", "enum": [">", ">=", "<", "<="]},
    "threshold": {"type": "number"},
    "relative_to_parent": {"type": "boolean", "description": "threshold on (child - parent); default true"}},
    "required": ["metric", "op", "threshold"]}
_HYPOTHESIS = {"type": "object", "description": "If <if>, then <then>, because <because>.", "properties": {
    "if": {"type": "string"}, "then": {"type": "string"}, "because": {"type": "string"}},
    "required": ["if", "then", "because"]}

TOOLS: list[dict[str, Any]] = [
    {"name": "list_versions",
     "description": ("Every version of the campaign: parent, role, the intervention that made it, held-out Avg@k, "
                     "and the promotion gate's decision (outcome, delta vs baseline with its CI, p-value)."),
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "health_report",
     "description": ("A version's health report: findings (id, diagnostic, severity, message, metric value, "
                     "example rollout_uids) and optionally its metrics. Cite finding ids as evidence."),
     "input_schema": {"type": "object", "properties": {
         "version": {"type": "string"},
         "min_severity": {"type": "string", "enum": ["info", "warning", "critical"], "description": "default info"},
         "include_metrics": {"type": "boolean", "description": "default false"},
         "metric_prefix": {"type": "string", "description": "only metrics whose name starts with this"}},
         "required": ["version"]}},
    {"name": "query_evidence",
     "description": ("Aggregate a table of stored evidence (no rows: use sample_rollouts / sample_turns for rows). "
                     f"Tables: rollouts, turns, metrics (long: version, step, name, value). At most {MAX_QUERY_ROWS} "
                     f"result rows. Aggregates: {', '.join(AGG_FNS)}; every result has n (rows per group)."),
     "input_schema": {"type": "object", "properties": {
         "table": {"type": "string", "enum": ["rollouts", "turns", "metrics"], "description": "default rollouts"},
         "versions": {"type": "array", "items": {"type": "string"}, "description": "default: the parent"},
         "split": {"type": "string", "enum": ["train", "val"], "description": "default: both"},
         "steps": _STEPS, "where": _WHERE,
         "group_by": {"type": "array", "items": {"type": "string"}},
         "aggregates": {"type": "array", "items": {"type": "object", "properties": {
             "column": {"type": "string"}, "fn": {"type": "string", "enum": list(AGG_FNS)}},
             "required": ["column", "fn"]}},
         "order_by": {"type": "string", "description": "a result column, e.g. n or mean_reward"},
         "descending": {"type": "boolean"},
         "limit": {"type": "integer", "minimum": 1, "maximum": MAX_QUERY_ROWS}}}},
    {"name": "sample_rollouts",
     "description": (f"Read up to {MAX_SAMPLE_ROWS} stored rollouts (prompt and completion text cut to max_chars). "
                     "Pick them by rollout_uids, by group_id (a whole GRPO group), or at random under filters."),
     "input_schema": {"type": "object", "properties": {
         "version": {"type": "string", "description": "default: the parent"},
         "split": {"type": "string", "enum": ["train", "val"], "description": "default train"},
         "steps": _STEPS, "where": _WHERE,
         "rollout_uids": {"type": "array", "items": {"type": "string"}},
         "group_id": {"type": "string"},
         "n": {"type": "integer", "minimum": 1, "maximum": MAX_SAMPLE_ROWS, "description": "default 5"},
         "columns": {"type": "array", "items": {"type": "string"}},
         "seed": {"type": "integer"},
         "max_chars": {"type": "integer", "minimum": 20, "maximum": MAX_CELL_CHARS,
                       "description": f"per text cell, default {DEFAULT_CELL_CHARS}"}}}},
    {"name": "sample_turns",
     "description": (f"Read up to {MAX_TURNS} turns of multi-turn rollouts (tool calls and outputs, cut to max_chars), "
                     "by rollout_uids or under filters on the turns table."),
     "input_schema": {"type": "object", "properties": {
         "version": {"type": "string", "description": "default: the parent"},
         "split": {"type": "string", "enum": ["train", "val"], "description": "default train"},
         "rollout_uids": {"type": "array", "items": {"type": "string"}},
         "where": _WHERE,
         "n": {"type": "integer", "minimum": 1, "maximum": MAX_TURNS, "description": "default 20"},
         "max_chars": {"type": "integer", "minimum": 20, "maximum": MAX_CELL_CHARS}}}},
    {"name": "run_diagnostic",
     "description": ("Run one diagnostic on a version (with up to 3 ancestors as trend evidence): a built-in by name, "
                     "or a diagnostic saved earlier with write_diagnostic. Returns its metrics and findings."),
     "input_schema": {"type": "object", "properties": {
         "name": {"type": "string"}, "version": {"type": "string", "description": "default: the parent"}},
         "required": ["name"]}},
    {"name": "write_diagnostic",
     "description": ("Write a diagnostic as Python: `def diagnose(rollouts, metrics):` gets eager polars frames of "
                     "the version and its ancestors (all splits) and returns {\"metrics\": {name: float|None}, "
                     "\"findings\": [{\"severity\": \"info|warning|critical\", \"code\": str, \"message\": str, "
                     "\"rollout_uids\": [...]}]}. It runs in a sandbox (no files, no network, 10 s); when it runs "
                     "cleanly it is saved (a new revision of that name) and its findings can be cited."),
     "input_schema": {"type": "object", "properties": {
         "name": {"type": "string", "description": "lower_snake_case, 2-64 characters"},
         "source": {"type": "string"},
         "reason": {"type": "string", "description": "what it measures and why"},
         "version": {"type": "string", "description": "the version to run it on; default: the parent"}},
         "required": ["name", "source", "reason"]}},
    {"name": "backtest",
     "description": ("Counterfactual re-scoring of the parent's stored train rollouts under the parent's harness "
                     "plus one change (nothing is stored). The success criterion decides the verdict when a "
                     "backtest measures its metric (dgr, reward_spread, effective_data, reward_mean, ...)."),
     "input_schema": {"type": "object", "properties": {
         "change": _CHANGE, "success_criterion": _CRITERION, "steps": _STEPS},
         "required": ["change", "success_criterion"]}},
    {"name": "propose_intervention",
     "description": ("Propose one candidate intervention for the next version: exactly one change to the parent's "
                     "harness with a falsifiable hypothesis, the metric that decides it, a success criterion and a "
                     "rollback plan. It is validated against the parent; an invalid one is refused with the reason. "
                     "Call it once per candidate; the controller backtests the valid ones."),
     "input_schema": {"type": "object", "properties": {
         "change": _CHANGE, "hypothesis": _HYPOTHESIS,
         "target_metric": {"type": "string"}, "success_criterion": _CRITERION,
         "rollback_plan": {"type": "string"},
         "evidence": {"type": "array", "items": {"type": "string"}, "description": "finding ids it rests on"},
         "rationale": {"type": "string", "description": "why this layer and this change, briefly"}},
         "required": ["change", "hypothesis", "target_metric", "success_criterion", "rollback_plan"]}},
    {"name": "read_memory",
     "description": "The campaign's memory: a compact ledger summary, case memory, and notes written earlier.",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "write_memory",
     "description": "Append a note to the campaign's memory (append-only; future rounds read it).",
     "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "search_skills",
     "description": ("Validated skills (trigger -> intervention recipes from earlier campaigns) that match the "
                     "parent's findings, or the findings given by id."),
     "input_schema": {"type": "object", "properties": {
         "finding_ids": {"type": "array", "items": {"type": "string"}},
         "domain": {"type": "string", "description": "default: the campaign's domain"},
         "limit": {"type": "integer", "minimum": 1, "maximum": 10}}}},
    {"name": "rank_candidates",
     "description": ("Only when asked to rank: the candidate intervention ids, best first (every candidate once), "
                     "judged on their backtests and hypotheses."),
     "input_schema": {"type": "object", "properties": {
         "intervention_ids": {"type": "array", "items": {"type": "string"}},
         "reason": {"type": "string"}},
         "required": ["intervention_ids"]}},
]
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
READ_TOOLS = ("list_versions", "health_report", "query_evidence", "sample_rollouts", "sample_turns",
              "run_diagnostic", "write_diagnostic", "backtest", "search_skills")  # traced (memory.record_search)

_ALLOWED_KEYS = {t["name"]: set(t["input_schema"]["properties"]) for t in TOOLS}


# --------------------------------------------------------------------------- formatting helpers


def clean(value: Any) -> Any:
    """JSON-safe, short: floats to 6 significant digits, NaN/inf to None, nested containers cleaned."""
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"...[+{len(text) - limit} chars]"


def _cell(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return cut(value, limit)
    return clean(value)


def dumps(obj: Any) -> str:
    return json.dumps(clean(obj), ensure_ascii=False, separators=(",", ":"), default=str)


def _rows(df: pl.DataFrame, limit: int) -> str:
    """JSON lines; text cells cut to `limit` characters (ids never: they are what the model cites)."""
    keep = {c for c in df.columns if c.endswith(("_id", "_uid")) or c in ("version", "split", "campaign")}
    return "\n".join(dumps({k: v if k in keep else _cell(v, limit) for k, v in row.items()})
                     for row in df.iter_rows(named=True))


def finding_brief(f: Finding) -> dict[str, Any]:
    out: dict[str, Any] = {"id": f.finding_id, "diagnostic": f.diagnostic, "code": f.code, "severity": f.severity,
                           "message": cut(f.message, 400)}
    for k in ("rule", "metric", "value", "threshold", "steps"):
        v = getattr(f, k)
        if v is not None:
            out[k] = v
    if f.veto:
        out["veto"] = True
    if f.rollout_uids:
        out["examples"] = list(f.rollout_uids[:3])
    return out


# --------------------------------------------------------------------------- the toolbox


@dataclass
class ToolBox:
    """The tools over one AgentContext. `phase` is "propose" or "rank"; `proposals` collects the valid
    proposals in order; `ranking` is set by a valid rank_candidates call."""

    ctx: AgentContext
    author: str = "claude"
    max_chars: int = 12_000
    phase: str = "propose"
    rank_ids: tuple[str, ...] = ()
    proposals: list[Intervention] = field(default_factory=list)
    ranking: list[str] | None = None
    seen_findings: set[str] = field(default_factory=set)
    log: Callable[[str], None] | None = None

    @property
    def store(self):
        return self.ctx.store

    # ---- dispatch

    def call(self, name: str, args: Any) -> tuple[str, bool]:
        """Run tool `name` on the model's input. Returns (text, is_error); never raises for bad input."""
        if name not in TOOL_NAMES:
            return f"error: unknown tool {name!r}; available: {', '.join(TOOL_NAMES)}", True
        if isinstance(args, str):  # some endpoints pass the raw argument text through
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                return f"error: the tool input is not valid JSON ({exc.msg} at char {exc.pos}); send an object", True
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return f"error: the tool input must be a JSON object, not {type(args).__name__}", True
        extra = set(args) - _ALLOWED_KEYS[name]
        if extra:
            return (f"error: {name} takes no {', '.join(sorted(extra))}; its fields are "
                    f"{', '.join(sorted(_ALLOWED_KEYS[name])) or 'none'}"), True
        try:
            out = getattr(self, f"_t_{name}")(args)
        except ToolError as exc:
            return self._cap(f"error: {exc}"), True
        except EvoTrainerError as exc:  # the store or a module refused: the model can adjust
            return self._cap(f"error: {exc}"), True
        except pl.exceptions.PolarsError as exc:  # e.g. a filter comparing a string column with a number
            return self._cap(f"error: the query failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"), True
        except Exception as exc:  # noqa: BLE001 - a tool's bug must not end the campaign; it is logged
            self._say(f"tool {name} raised {type(exc).__name__}: {exc}")
            return f"error: the tool failed internally ({type(exc).__name__}); try another approach", True
        if name in READ_TOOLS:
            self._trace(name, args)
        return self._cap(out), False

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f"\n[output cut: {len(text) - self.max_chars} more characters; narrow the request]"

    def _trace(self, tool: str, args: dict) -> None:
        """The search trace (memory.record_search), when the memory module exists."""
        try:
            from .. import memory
        except ImportError:
            return
        record = getattr(memory, "record_search", None)
        if record is None:
            return
        try:
            where = ("ledger" if tool == "list_versions" else "skills" if tool == "search_skills"
                     else ",".join(self._version_list(args)))
            record(self.store, tool, clean(args), where, self.author)
        except Exception as exc:  # noqa: BLE001 - the trace must not break the tool it traces
            self._say(f"memory.record_search failed for {tool}: {type(exc).__name__}: {exc}")

    # ---- argument helpers

    def _version_list(self, args: dict) -> list[str]:
        raw = args.get("versions", args.get("version"))
        if raw is None or raw == []:
            return [self.ctx.parent]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
            raise ToolError("versions must be a list of version names like \"v000\"")
        return raw

    def _versions(self, args: dict) -> list[str]:
        names = self._version_list(args)
        known = self.store.versions()
        bad = [v for v in names if v not in known]
        if bad:
            raise ToolError(f"no version {', '.join(bad)} in this campaign; versions: {', '.join(known) or 'none'}")
        return names

    def _version(self, args: dict) -> str:
        names = self._versions(args)
        if len(names) != 1:
            raise ToolError("give one version")
        return names[0]

    @staticmethod
    def _steps(args: dict) -> tuple[int, int] | None:
        raw = args.get("steps")
        if raw is None:
            return None
        if (not isinstance(raw, list) or len(raw) != 2 or not all(isinstance(s, int) and not isinstance(s, bool)
                                                                   for s in raw) or raw[0] > raw[1]):
            raise ToolError("steps must be [first, last], two integers with first <= last")
        return raw[0], raw[1]

    @staticmethod
    def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
        v = args.get(key, default)
        if v is None:
            return default
        if not isinstance(v, int) or isinstance(v, bool):
            raise ToolError(f"{key} must be an integer")
        return max(lo, min(hi, v))

    @staticmethod
    def _split(args: dict, default: str | None) -> str | None:
        split = args.get("split", default)
        if split not in (None, "train", "val"):
            raise ToolError("split must be \"train\" or \"val\"")
        return split

    @staticmethod
    def _where(lf: pl.LazyFrame, where: Any, cols: Sequence[str]) -> pl.LazyFrame:
        if where is None:
            return lf
        if not isinstance(where, list):
            raise ToolError("where must be a list of {column, op, value}")
        for i, cond in enumerate(where):
            if not isinstance(cond, dict) or "column" not in cond or "op" not in cond:
                raise ToolError(f"where[{i}] must be an object with column, op (and value)")
            col, op, value = cond["column"], cond["op"], cond.get("value")
            if col not in cols:
                raise ToolError(f"where[{i}]: no column {col!r}; columns: {', '.join(cols)}")
            if op not in WHERE_OPS:
                raise ToolError(f"where[{i}]: op {op!r} is not one of {', '.join(WHERE_OPS)}")
            c = pl.col(col)
            if op == "is_null":
                expr = c.is_null()
            elif op == "not_null":
                expr = c.is_not_null()
            elif op in ("in", "not_in"):
                if not isinstance(value, list) or not value:
                    raise ToolError(f"where[{i}]: {op} needs a non-empty list value")
                expr = c.is_in(value) if op == "in" else ~c.is_in(value)
            elif op == "contains":
                if not isinstance(value, str):
                    raise ToolError(f"where[{i}]: contains needs a string value")
                expr = c.cast(pl.String).str.contains(value, literal=True)
            else:
                if isinstance(value, list | dict) or value is None:
                    raise ToolError(f"where[{i}]: {op} needs a scalar value")
                expr = {"==": c == value, "!=": c != value, ">": c > value, ">=": c >= value, "<": c < value,
                        "<=": c <= value}[op]
            lf = lf.filter(expr)
        return lf

    def _json_arg(self, args: dict, key: str, required: bool = True) -> Any:
        """An object argument; a JSON string holding an object is accepted, malformed JSON is refused."""
        if key not in args or args[key] is None:
            if required:
                raise ToolError(f"missing {key}")
            return None
        value = args[key]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ToolError(f"{key} is not valid JSON ({exc.msg} at char {exc.pos}); send it as an object") from None
        if not isinstance(value, dict):
            raise ToolError(f"{key} must be an object, not {type(value).__name__}")
        return value

    def _parent_findings(self) -> tuple[Finding, ...]:
        report = self.ctx.health or self.store.read_health_report(self.ctx.parent)
        return report.findings if report else ()

    # ---- reading the store

    def _t_list_versions(self, args: dict) -> str:
        from ..loopstate import derive
        from ..status import from_ledger

        state = derive(self.store.ledger.events(), self.store.campaign.name)
        status = from_ledger(self.store)
        decisions = {d.decision_id: d for d in self.store.decisions()}
        lines = []
        for name in self.store.versions():
            spec = self.store.read_version(name)
            row: dict[str, Any] = {"version": name, "parent": spec.parent, "role": spec.role}
            if spec.intervention:
                try:
                    iv = self.store.read_intervention(spec.intervention)
                    row["intervention"] = f"{iv.intervention_id}: {interventions.describe(iv)}"
                    row["author"] = iv.author
                except EvoTrainerError:
                    row["intervention"] = spec.intervention
            vs = status.versions.get(name)
            if vs is not None:
                row["state"] = vs.state.value if hasattr(vs.state, "value") else str(vs.state)
                row["steps"] = vs.last_step
                row["avg_at_k"] = vs.final_avg_at_k
            lp = state.versions.get(name)
            if lp is not None and lp.judged is not None:
                row["outcome"] = lp.outcome
                d = decisions.get(lp.judged.decision_id)
                if d is not None and d.stats is not None:
                    s = d.stats
                    row["gate"] = (f"vs {d.baseline}: delta {s.mean_delta:+.3f} CI [{s.ci_low:+.3f}, {s.ci_high:+.3f}] "
                                   f"p={s.p_wilcoxon if s.p_wilcoxon is None else round(s.p_wilcoxon, 4)} n={s.n_items}")
                elif d is not None:
                    row["gate"] = cut(d.reason, 200)
                if d is not None and d.vetoes:
                    row["vetoes"] = list(d.vetoes)
            lines.append(dumps(row))
        return "\n".join(lines) or "no versions yet"

    def _t_health_report(self, args: dict) -> str:
        version = self._version(args)
        report = self.store.read_health_report(version)
        computed = report is None
        if report is None:
            from ..diagnostics.report import health_report_for

            report = health_report_for(self.store, version)
        order = {"info": 0, "warning": 1, "critical": 2}
        floor = args.get("min_severity", "info")
        if floor not in order:
            raise ToolError("min_severity must be info, warning or critical")
        findings = [f for f in report.findings if order[f.severity] >= order[floor]]
        self.seen_findings.update(f.finding_id for f in findings)
        n = {s: sum(f.severity == s for f in report.findings) for s in ("critical", "warning", "info")}
        head = {"version": version, "counts": n, "computed_now": computed or None}
        out = [dumps({k: v for k, v in head.items() if v is not None})]
        out += [dumps(finding_brief(f)) for f in findings[:MAX_FINDINGS]]
        if len(findings) > MAX_FINDINGS:
            out.append(f"... {len(findings) - MAX_FINDINGS} more findings; raise min_severity")
        if args.get("include_metrics"):
            prefix = args.get("metric_prefix") or ""
            items = [(k, v) for k, v in report.metrics.items() if k.startswith(prefix)]
            out.append(dumps({"metrics": dict(items[:MAX_METRICS])}))
            if len(items) > MAX_METRICS:
                out.append(f"... {len(items) - MAX_METRICS} more metrics; use metric_prefix")
        return "\n".join(out)

    def _t_query_evidence(self, args: dict) -> str:
        table = args.get("table", "rollouts")
        versions = self._versions(args)
        steps = self._steps(args)
        split = self._split(args, None)
        if table == "rollouts":
            lf = self.store.rollouts(versions, split, steps)
        elif table == "turns":
            lf = self.store.turns(versions, split, steps)
        elif table == "metrics":
            lf = self.store.metrics(versions, steps)
        else:
            raise ToolError("table must be rollouts, turns or metrics")
        cols = lf.collect_schema().names()
        lf = self._where(lf, args.get("where"), cols)
        group_by = args.get("group_by") or []
        if not isinstance(group_by, list) or not all(isinstance(c, str) for c in group_by):
            raise ToolError("group_by must be a list of column names")
        aggs_raw = args.get("aggregates") or []
        if not isinstance(aggs_raw, list):
            raise ToolError("aggregates must be a list of {column, fn}")
        if not group_by and not aggs_raw:
            raise ToolError("give group_by and/or aggregates (use sample_rollouts or sample_turns to read rows)")
        bad = [c for c in group_by if c not in cols]
        if bad:
            raise ToolError(f"no column {', '.join(bad)} in {table}; columns: {', '.join(cols)}")
        schema = lf.collect_schema()
        exprs = [pl.len().alias("n")]
        for i, a in enumerate(aggs_raw):
            if not isinstance(a, dict) or a.get("column") not in cols or a.get("fn") not in AGG_FNS:
                raise ToolError(f"aggregates[{i}] needs a column of {table} ({', '.join(cols)}) and fn in "
                                f"{', '.join(AGG_FNS)}")
            col, fn = a["column"], a["fn"]
            c = pl.col(col)
            if schema[col] == pl.Boolean and fn in ("mean", "sum", "std", "median", "min", "max"):
                c = c.cast(pl.Float64)
            elif fn in ("mean", "sum", "std", "median") and not schema[col].is_numeric():
                raise ToolError(f"aggregates[{i}]: {fn} needs a numeric or boolean column; {col} is {schema[col]}")
            expr = {"mean": c.mean(), "sum": c.sum(), "min": c.min(), "max": c.max(), "std": c.std(),
                    "median": c.median(), "count": c.count(), "n_unique": c.n_unique()}[fn]
            exprs.append(expr.alias(f"{fn}_{col}"))
        out = lf.group_by(group_by).agg(exprs) if group_by else lf.select(exprs)
        names = out.collect_schema().names()
        order_by = args.get("order_by")
        limit = self._int(args, "limit", 20, 1, MAX_QUERY_ROWS)
        if order_by is not None:
            if order_by not in names:
                raise ToolError(f"order_by {order_by!r} is not a result column; result columns: {', '.join(names)}")
            out = out.sort(order_by, descending=bool(args.get("descending")), nulls_last=True)
        elif group_by:
            out = out.sort(group_by)
        total = out.select(pl.len()).collect().item() if group_by else 1
        df = out.head(limit).collect()
        text = _rows(df, 200)
        if total > df.height:
            text += f"\n[{total} result rows, {df.height} shown; filter, order_by or raise limit]"
        return text or "no rows"

    def _t_sample_rollouts(self, args: dict) -> str:
        version = self._version(args)
        split = self._split(args, "train")
        steps = self._steps(args)
        n = self._int(args, "n", 5, 1, MAX_SAMPLE_ROWS)
        limit = self._int(args, "max_chars", DEFAULT_CELL_CHARS, 20, MAX_CELL_CHARS)
        lf = self.store.rollouts(version, split, steps)
        cols = lf.collect_schema().names()
        want = args.get("columns") or [c for c in SAMPLE_COLUMNS if c in cols]
        if not isinstance(want, list) or not all(isinstance(c, str) for c in want):
            raise ToolError("columns must be a list of column names")
        bad = [c for c in want if c not in cols]
        if bad:
            raise ToolError(f"no column {', '.join(bad)} in rollouts; columns: {', '.join(cols)}")
        if "rollout_uid" not in want:
            want = ["rollout_uid", *want]
        lf = self._where(lf, args.get("where"), cols)
        uids_arg, group = args.get("rollout_uids"), args.get("group_id")
        if uids_arg is not None:
            if not isinstance(uids_arg, list) or not all(isinstance(u, str) for u in uids_arg):
                raise ToolError("rollout_uids must be a list of strings")
            lf = lf.filter(pl.col("rollout_uid").is_in(uids_arg[:MAX_SAMPLE_ROWS]))
        if group is not None:
            if not isinstance(group, str):
                raise ToolError("group_id must be a string")
            lf = lf.filter(pl.col("group_id") == group)
        keys = lf.select("rollout_uid").collect()["rollout_uid"]  # ids first: text is read for the sample only
        total = keys.len()
        if total == 0:
            return f"no rollouts of {version} ({split}) match"
        if group is not None or uids_arg is not None:
            chosen = keys.head(n)
        else:
            seed = args.get("seed", 0)
            chosen = keys.sample(min(n, total), seed=seed if isinstance(seed, int) else 0)
        df = lf.filter(pl.col("rollout_uid").is_in(chosen.implode())).select(want).collect()
        sort = [c for c in ("step", "group_id", "sample_idx") if c in df.columns]
        if sort:
            df = df.sort(sort)
        return _rows(df, limit) + f"\n[{df.height} of {total} matching rollouts]"

    def _t_sample_turns(self, args: dict) -> str:
        version = self._version(args)
        split = self._split(args, "train")
        n = self._int(args, "n", 20, 1, MAX_TURNS)
        limit = self._int(args, "max_chars", DEFAULT_CELL_CHARS, 20, MAX_CELL_CHARS)
        lf = self.store.turns(version, split)
        cols = lf.collect_schema().names()
        lf = self._where(lf, args.get("where"), cols)
        uids = args.get("rollout_uids")
        if uids is not None:
            if not isinstance(uids, list) or not all(isinstance(u, str) for u in uids):
                raise ToolError("rollout_uids must be a list of strings")
            lf = lf.filter(pl.col("rollout_uid").is_in(uids))
        want = [c for c in TURN_SAMPLE_COLUMNS if c in cols]
        sort = [c for c in ("rollout_uid", "turn_idx") if c in cols]
        total = lf.select(pl.len()).collect().item()
        if total == 0:
            return f"no turns of {version} ({split}) match (single-turn domains have no turns table)"
        df = lf.select(want).sort(sort).head(n).collect()
        return _rows(df, limit) + f"\n[{df.height} of {total} matching turns]"

    # ---- diagnostics

    def _lineage(self, version: str) -> list[str]:
        from ..diagnostics.report import lineage

        return lineage(self.store, version, 3)

    def _t_run_diagnostic(self, args: dict) -> str:
        from ..diagnostics import registry
        from ..diagnostics.report import evidence_for

        name = args.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError("name must be a diagnostic name")
        version = self._version(args)
        if name in registry.known():
            res = registry.run(name, evidence_for(self.store, version))
            metrics, findings = res.metrics, list(res.findings)
            source = "built-in"
        else:
            saved = self.store.user_diagnostics(name)
            if not saved:
                user = sorted({m.name for m, _ in self.store.user_diagnostics()})
                raise ToolError(f"no diagnostic {name!r}; built-in: {', '.join(registry.known())}; "
                                f"saved: {', '.join(user) or 'none'}")
            meta, src = saved[-1]
            res = self._run_user(src, version, name)
            metrics, findings = res.metrics, res.findings
            source = f"saved {meta.sha256[:12]} by {meta.author}"
        self.seen_findings.update(f.finding_id for f in findings)
        out = [dumps({"diagnostic": name, "version": version, "source": source, "metrics": metrics})]
        out += [dumps(finding_brief(f)) for f in findings[:MAX_FINDINGS]]
        return "\n".join(out) + ("" if findings else "\nno findings")

    def _run_user(self, source: str, version: str, name: str):
        from ..diagnostics.usercode import run_user_diagnostic

        res = run_user_diagnostic(self.store, source, self._lineage(version), name=name)
        if not res.ok:
            printed = f"; it printed: {cut(res.stdout.strip(), 1500)}" if res.stdout.strip() else ""
            raise ToolError(f"the diagnostic failed: {res.error}{printed}")
        return res

    def _t_write_diagnostic(self, args: dict) -> str:
        from ..diagnostics.usercode import save_user_diagnostic

        name, source, reason = args.get("name"), args.get("source"), args.get("reason")
        if not all(isinstance(x, str) and x.strip() for x in (name, source, reason)):
            raise ToolError("name, source and reason must be non-empty strings")
        version = self._version(args)
        res = self._run_user(source, version, name)  # run first: a diagnostic that fails is not saved
        revisions = self.store.user_diagnostics(name)
        meta = save_user_diagnostic(self.store, name, source, author=self.author, reason=reason,
                                    parent_sha256=revisions[-1][0].sha256 if revisions else None)
        self.seen_findings.update(f.finding_id for f in res.findings)
        out = [dumps({"saved": f"{name} {meta.sha256[:12]}", "version": version, "metrics": res.metrics,
                      "seconds": round(res.seconds, 2)})]
        out += [dumps(finding_brief(f)) for f in res.findings[:MAX_FINDINGS]]
        if res.stdout.strip():
            out.append("printed: " + cut(res.stdout.strip(), 1000))
        return "\n".join(out)

    # ---- interventions

    def _draft(self, args: dict, *, backtest: bool = False) -> Intervention:
        change = self._json_arg(args, "change")
        crit = self._json_arg(args, "success_criterion")
        if backtest:
            fields: dict[str, Any] = {
                "hypothesis": {"if": "backtest probe", "then": "see the verdict", "because": "counterfactual check"},
                "target_metric": crit.get("metric", "?"), "rollback_plan": "not applied",
            }
        else:
            evidence = args.get("evidence") or []
            if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
                raise ToolError("evidence must be a list of finding ids")
            rationale = args.get("rationale") or ""
            if not isinstance(rationale, str):
                raise ToolError("rationale must be a string")
            fields = {"hypothesis": self._json_arg(args, "hypothesis"), "target_metric": args.get("target_metric"),
                      "rollback_plan": args.get("rollback_plan"), "evidence": tuple(evidence),
                      "rationale": rationale[:2000]}
        try:
            iv = interventions.new(parent=self.ctx.parent, change=change, success_criterion=crit,
                                   author=self.author, **fields)
        except interventions.InterventionError as exc:
            raise ToolError(str(exc)) from None
        spec = self.ctx.parent_spec
        try:
            interventions.apply(iv, spec.harness, spec.train)
        except interventions.InterventionError as exc:
            raise ToolError(f"the change does not apply to {self.ctx.parent}: {exc}") from None
        if iv.change.factor == "diagnostic":
            from ..diagnostics import registry

            names = set(registry.known()) | {m.name for m, _ in self.store.user_diagnostics()}
            if iv.change.diagnostic not in names:
                raise ToolError(f"no diagnostic {iv.change.diagnostic!r} to {iv.change.op}; write it first "
                                "(write_diagnostic) or use a built-in")
        return iv

    def _t_backtest(self, args: dict) -> str:
        from ..backtest import run_backtest

        iv = self._draft(args, backtest=True)
        spec = self.ctx.parent_spec
        harness, train = interventions.apply(iv, spec.harness, spec.train)
        report = run_backtest(self.store, harness, versions=[self.ctx.parent], steps=self._steps(args),
                              baseline=spec.harness, intervention=iv,
                              max_completion_length=train.max_completion_length)
        keys = ("dgr", "reward_spread", "effective_data", "reward_mean", "reward_std", "filtered_share",
                "order_violations", "order_violations_correct_vs_wrong", "correct_wrongly_filtered_share",
                "correct_group_filtered", "stored_reward_match")
        return dumps({
            "change": interventions.describe(iv), "verdict": report.verdict,
            "reasons": [cut(r, 400) for r in report.reasons],
            "before": {k: report.before.get(k) for k in keys if k in report.before},
            "after": {k: report.after.get(k) for k in keys if k in report.after},
            "n_rollouts": report.n_rollouts, "n_groups": report.n_groups, "groups_rescued": report.groups_rescued,
            "groups_killed": report.groups_killed, "advantage_sign_flips": report.advantage_sign_flips,
            "examples": list(report.example_rollouts[:5]), "stored": False,
            "note": "counterfactual on fixed rollouts; not a prediction of the next version's score",
        })

    def _t_propose_intervention(self, args: dict) -> str:
        if self.phase != "propose":
            raise ToolError("proposals are closed; this step only ranks the candidates (rank_candidates)")
        n = self.ctx.n_candidates
        if len(self.proposals) >= n:
            raise ToolError(f"you already have {n} valid candidates, the most this campaign backtests; end your turn")
        for key in ("target_metric", "rollback_plan"):
            if not isinstance(args.get(key), str):
                raise ToolError(f"{key} must be a string")
        iv = self._draft(args)
        known = {f.finding_id for f in self._parent_findings()} | self.seen_findings
        unknown = [e for e in iv.evidence if e not in known]
        if unknown:
            some = ", ".join(sorted(known)[:8])
            raise ToolError(f"evidence cites unknown finding id(s) {', '.join(unknown)}; cite ids from the parent's "
                            f"health report or a diagnostic you ran (known: {some or 'none'})")
        what = interventions.describe(iv)
        if what in self.ctx.tried():
            raise ToolError(f"'{what}' was already tried on {self.ctx.parent}; propose something else")
        if any(interventions.describe(p) == what for p in self.proposals):
            raise ToolError(f"'{what}' is already one of your candidates")
        self.proposals.append(iv)
        return (f"accepted {iv.intervention_id}: {what} (candidate {len(self.proposals)} of at most {n}); "
                "the controller will backtest it")

    def _t_rank_candidates(self, args: dict) -> str:
        if self.phase != "rank":
            raise ToolError("rank_candidates is for the ranking step; now propose with propose_intervention")
        ids = args.get("intervention_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise ToolError("intervention_ids must be a non-empty list of candidate ids")
        unknown = [i for i in ids if i not in self.rank_ids]
        if unknown or len(set(ids)) != len(ids):
            raise ToolError(f"rank exactly these ids, each once: {', '.join(self.rank_ids)}")
        self.ranking = list(ids) + [i for i in self.rank_ids if i not in ids]
        return "ranking recorded"

    # ---- memory and skills

    def _t_read_memory(self, args: dict) -> str:
        try:
            from .. import memory
        except ImportError:
            raise ToolError("not available: campaign memory (evotrainer.memory) is not in this release") from None
        summary = memory.compact(self.store, max_chars=max(1000, self.max_chars // 2))
        parts = [summary]
        notes = [n for n in memory.notes(self.store)[-20:] if str(n.get("text", "")) not in summary]
        if notes:
            parts.append("notes (latest last):")
            parts += [dumps(n) for n in notes]
        return "\n".join(parts)

    def _t_write_memory(self, args: dict) -> str:
        text = args.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ToolError("text must be a non-empty string")
        try:
            from .. import memory
        except ImportError:
            raise ToolError("not available: campaign memory (evotrainer.memory) is not in this release") from None
        memory.add_note(self.store, text.strip()[:4000], author=self.author)
        return "noted"

    def _t_search_skills(self, args: dict) -> str:
        try:
            from ..skills import SkillLibrary
        except ImportError:
            raise ToolError("not available: the skill library (evotrainer.skills) is not in this release") from None
        findings = self._parent_findings()
        ids = args.get("finding_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ToolError("finding_ids must be a list of finding ids")
            findings = tuple(f for f in findings if f.finding_id in ids)
        domain = args.get("domain") or self.store.campaign.data.domain
        limit = self._int(args, "limit", 5, 1, 10)
        lib = SkillLibrary.open()
        extra: dict[str, Any] = {}
        params = inspect.signature(lib.retrieve).parameters
        if "failures" in params:  # other domains' skills after repeated failures
            extra["failures"] = self.ctx.consecutive_failures
        if "metrics" in params and self.ctx.health is not None:
            extra["metrics"] = self.ctx.health.metrics
        skills = lib.retrieve(findings, domain, tried=tuple(sorted(self.ctx.tried())), **extra)
        if not skills:
            return "no matching skills"
        out = []
        for s in skills[:limit]:
            out.append(dumps({"skill_id": s.skill_id, "title": s.title, "status": s.status,
                              "domains": list(s.domains), "template": s.template}))
            out.append(cut(s.markdown(), 1500))
        return "\n".join(out)
