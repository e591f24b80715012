"""Interventions: one typed, single-factor change to a version's harness, validated.

An Intervention carries exactly one `change` (its type is the factor: reward, filter, data,
hparam, env, diagnostic, procedure), a falsifiable hypothesis, the metric that decides it, a
success criterion, a rollback plan, and the finding ids it rests on. `apply` turns a parent's
(harness, train config) into the child's, refusing no-ops and out-of-range values.
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .config import one_line
from .errors import EvoTrainerError
from .harness import rewards as reward_mod
from .schema import (
    DataChange,
    DiagnosticChange,
    EnvChange,
    FilterChange,
    HarnessSpec,
    HparamChange,
    Intervention,
    ProcedureChange,
    RewardChange,
    RewardComponentSpec,
    SweEnvSpec,
    TrainConfig,
)


class InterventionError(EvoTrainerError):
    """An intervention is malformed, changes more or less than one factor, or is out of range."""


# Ranges an agent or a person may move a hyper-parameter within (wider is almost surely a typo).
HPARAM_RANGES: dict[str, tuple[float, float]] = {
    "learning_rate": (1e-8, 1e-3),
    "temperature": (0.05, 2.0),
    "top_p": (0.05, 1.0),
    "epsilon": (0.01, 1.0),
    "epsilon_high": (0.01, 1.0),
    "beta": (0.0, 1.0),
    "group_size": (2, 64),
    "max_steps": (1, 100_000),
}
CATEGORICAL_HPARAMS = {"scale_rewards": ("group", "batch", "none"), "loss_type": ("dapo", "grpo", "dr_grpo", "bnpo")}


def _identity(fields: dict[str, Any]) -> str:
    keep = {k: v for k, v in fields.items() if k not in ("intervention_id", "created_at")}
    blob = json.dumps(keep, sort_keys=True, default=str, separators=(",", ":"))
    return "iv-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def new(**fields: Any) -> Intervention:
    """Build and validate an Intervention; its id is a content hash (a repeat is the same id)."""
    if "changes" in fields:
        changes = fields.pop("changes")
        if not isinstance(changes, list) or len(changes) != 1:
            factors = [c.get("factor", "?") if isinstance(c, dict) else "?" for c in (changes or [])]
            raise InterventionError(
                f"an intervention changes exactly one factor; this one changes {len(factors)} "
                f"({', '.join(factors) or 'none'}): split it into single-factor interventions"
            )
        fields["change"] = changes[0]
    try:
        draft = Intervention.model_validate({**fields, "intervention_id": ""})
    except ValidationError as exc:
        raise InterventionError(f"invalid intervention: {one_line(exc)}") from exc
    dumped = draft.model_dump(mode="json", by_alias=True)
    return draft.model_copy(update={"intervention_id": _identity(dumped)})


def load(path: str | Path, **overrides: Any) -> Intervention:
    """Read an intervention from JSON or TOML (fields of Intervention; `changes` may list one)."""
    path = Path(path)
    if not path.is_file():
        raise InterventionError(f"intervention file {path} does not exist; check the path")
    try:
        text = path.read_text()
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InterventionError(f"intervention file {path} cannot be parsed: {exc}") from exc
    if not isinstance(raw, dict):
        raise InterventionError(f"intervention file {path} must hold one object")
    raw.pop("intervention_id", None)
    raw.update(overrides)
    try:
        return new(**raw)
    except InterventionError as exc:
        raise InterventionError(f"{path}: {exc}") from exc


def apply(iv: Intervention, harness: HarnessSpec, train: TrainConfig) -> tuple[HarnessSpec, TrainConfig]:
    """The child's harness and train config: the parent's with this one change. Validates ranges."""
    ch = iv.change
    h, t = harness, train
    if isinstance(ch, RewardChange):
        h = h.model_copy(update={"rewards": _reward_change(h.rewards, ch)})
    elif isinstance(ch, FilterChange):
        if ch.group_filter is not None:
            if ch.group_filter == h.group_filter:
                raise InterventionError("filter change sets the group filter it already has; it changes nothing")
            h = h.model_copy(update={"group_filter": ch.group_filter})
        else:
            if ch.trajectory_filter == h.trajectory_filter:
                raise InterventionError("filter change sets the trajectory filter it already has; it changes nothing")
            h = h.model_copy(update={"trajectory_filter": ch.trajectory_filter})
    elif isinstance(ch, DataChange):
        if ch.data_selection == h.data_selection:
            raise InterventionError("data change sets the data selection it already has; it changes nothing")
        h = h.model_copy(update={"data_selection": ch.data_selection})
    elif isinstance(ch, HparamChange):
        h, t = _hparam_change(h, t, ch)
    elif isinstance(ch, EnvChange):
        if ch.name == "system_prompt":
            if not isinstance(ch.value, str) or not ch.value.strip():
                raise InterventionError("env change system_prompt needs a non-empty string")
            h = h.model_copy(update={"system_prompt": ch.value})
        elif ch.name in SWE_ENV_SETTINGS:
            h = h.model_copy(update={"swe": _swe_env_change(h.swe, ch)})
        else:
            if not isinstance(ch.value, int) or isinstance(ch.value, bool) or not 1 <= ch.value <= 8192:
                raise InterventionError(f"env change max_completion_length must be an integer in 1..8192 (got {ch.value!r})")
            if ch.value == t.max_completion_length:
                raise InterventionError("env change sets max_completion_length to its current value; it changes nothing")
            t = t.model_copy(update={"max_completion_length": ch.value})
    elif isinstance(ch, ProcedureChange):
        if ch.analysis_order == h.analysis_order:
            raise InterventionError(f"procedure change keeps analysis order {ch.analysis_order}; it changes nothing")
        h = h.model_copy(update={"analysis_order": ch.analysis_order})
    elif isinstance(ch, DiagnosticChange):
        pass  # changes how versions are judged (the diagnostics registry), not how they train
    # Re-validate: model_copy(update=...) skips validation.
    try:
        h = HarnessSpec.model_validate(h.model_dump())
        t = TrainConfig.model_validate(t.model_dump())
    except ValidationError as exc:
        raise InterventionError(f"intervention {iv.intervention_id} yields an invalid harness: {one_line(exc)}") from exc
    return h, t


SWE_ENV_SETTINGS = ("clear_git_log", "turn_cap", "token_budget")


def _swe_env_change(env: SweEnvSpec, ch: EnvChange) -> SweEnvSpec:
    want_bool = ch.name == "clear_git_log"
    if want_bool != isinstance(ch.value, bool) or (not want_bool and not isinstance(ch.value, int)):
        kind = "true or false" if want_bool else "an integer"
        raise InterventionError(f"env change {ch.name} needs {kind} (got {ch.value!r})")
    if getattr(env, ch.name) == ch.value:
        raise InterventionError(f"env change sets {ch.name} to its current value {ch.value!r}; it changes nothing")
    try:
        return SweEnvSpec.model_validate({**env.model_dump(), ch.name: ch.value})
    except ValidationError as exc:
        raise InterventionError(f"env change {ch.name}={ch.value!r} is out of range: {one_line(exc)}") from exc


def _reward_change(current: tuple[RewardComponentSpec, ...], ch: RewardChange) -> tuple[RewardComponentSpec, ...]:
    name = ch.component.name
    if name not in reward_mod.known():
        raise InterventionError(f"unknown reward component {name!r}; known: {', '.join(reward_mod.known())}")
    names = [c.name for c in current]
    if ch.op == "add":
        if name in names:
            raise InterventionError(f"reward component {name!r} is already in the harness; use op 'reweight'")
        if ch.component.weight == 0:
            raise InterventionError(f"adding {name!r} with weight 0 changes nothing")
        return (*current, ch.component)
    if name not in names:
        raise InterventionError(f"reward component {name!r} is not in the harness (it has {names}); use op 'add'")
    if ch.op == "remove":
        if len(current) == 1:
            raise InterventionError(f"cannot remove {name!r}: it is the only reward component")
        return tuple(c for c in current if c.name != name)
    old = current[names.index(name)]
    if ch.op == "reweight":
        if ch.component.weight == old.weight:
            raise InterventionError(f"reweight keeps {name!r} at weight {old.weight}; it changes nothing")
        new_c = old.model_copy(update={"weight": ch.component.weight})
    else:  # set_params
        if ch.component.params == old.params:
            raise InterventionError(f"set_params keeps {name!r}'s params; it changes nothing")
        new_c = old.model_copy(update={"params": ch.component.params})
    return tuple(new_c if c.name == name else c for c in current)


def _hparam_change(h: HarnessSpec, t: TrainConfig, ch: HparamChange) -> tuple[HarnessSpec, TrainConfig]:
    if ch.name in CATEGORICAL_HPARAMS:
        allowed = CATEGORICAL_HPARAMS[ch.name]
        if ch.value not in allowed:
            raise InterventionError(f"hparam {ch.name} must be one of {allowed} (got {ch.value!r})")
        current = getattr(h, ch.name) if ch.name == "scale_rewards" else getattr(t, ch.name)
    else:
        lo, hi = HPARAM_RANGES[ch.name]
        if isinstance(ch.value, str) or not lo <= float(ch.value) <= hi:
            raise InterventionError(f"hparam {ch.name} = {ch.value!r} is out of range [{lo:g}, {hi:g}]")
        current = getattr(t, ch.name)
    if ch.value == current:
        raise InterventionError(f"hparam change keeps {ch.name} = {current!r}; it changes nothing")
    if ch.name == "scale_rewards":
        return h.model_copy(update={"scale_rewards": ch.value}), t
    value = int(ch.value) if ch.name in ("group_size", "max_steps") else ch.value
    return h, t.model_copy(update={ch.name: value})


def describe(iv: Intervention) -> str:
    ch = iv.change
    if isinstance(ch, RewardChange):
        what = f"reward: {ch.op} {ch.component.name} (weight {ch.component.weight:g}{', params ' + str(ch.component.params) if ch.component.params else ''})"
    elif isinstance(ch, FilterChange):
        spec = ch.group_filter or ch.trajectory_filter
        what = f"filter: {spec.model_dump(exclude_defaults=True) or spec}"
    elif isinstance(ch, DataChange):
        what = f"data: {ch.data_selection.model_dump(exclude_defaults=True)}"
    elif isinstance(ch, HparamChange | EnvChange):
        what = f"{ch.factor}: {ch.name} = {ch.value!r}"
    elif isinstance(ch, ProcedureChange):
        what = f"procedure: analysis order {ch.analysis_order}"
    else:
        what = f"diagnostic: {ch.op} {ch.diagnostic}"
    return what
