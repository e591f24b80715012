"""Saved documents: frozen pydantic models, each carrying `schema_version`.

Every document the store writes is one of these. They forbid unknown fields so a typo in a
config or a file written by a different release is an error, never silently ignored. When a
document's shape changes, bump its SCHEMA_VERSION and add a migration in `migrations.py`.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
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
    """A named reward component (registered in `evotrainer.harness.rewards`) and its weight."""

    name: str
    weight: float = 1.0


class HarnessSpec(Frozen):
    """Everything about how rollouts become a training signal. Versions differ by this."""

    rewards: tuple[RewardComponentSpec, ...] = (
        RewardComponentSpec(name="correctness", weight=1.0),
        RewardComponentSpec(name="format", weight=0.1),
    )
    # Advantage normalisation (TRL's `scale_rewards`): divide by the group's std, the batch's, or not.
    scale_rewards: Literal["group", "batch", "none"] = "group"
    system_prompt: str | None = None  # None: the domain's default

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
    domain: Literal["math"] = "math"
    tiers: tuple[int, ...] = (0,)
    n_train: int = Field(64, gt=0)
    n_val: int = Field(16, gt=0)
    seed: int = 0
    # Optional external JSONL sets (question/answer, GSM8K style) instead of generated items.
    train_jsonl: str | None = None
    val_jsonl: str | None = None


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
    note: str = ""


def version_name(index: int) -> str:
    return f"v{index:03d}"


def version_index(name: str) -> int:
    if len(name) != 4 or not name.startswith("v") or not name[1:].isdigit():
        raise ValueError(f"not a version name: {name!r} (expected like 'v003')")
    return int(name[1:])


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


LedgerEvent = Annotated[
    CampaignCreated | VersionCreated | TrainingStarted | StepCompleted | StepsAbandoned | EvalCompleted | TrainingFinished | VersionFailed,
    Field(discriminator="kind"),
]


def event_to_json(event: Any) -> str:
    return json.dumps(event.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
