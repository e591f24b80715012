"""Run configuration: presets, TOML config files, and their validation.

A config file is TOML with the sections of `RunConfig` (all optional; unset values come from the
preset). Errors are one line naming the file, the field and the fix.
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from .errors import ConfigError
from .schema import ClaudeAgentSpec, DataSpec, Frozen, HarnessSpec, TrainConfig


class RunConfig(Frozen):
    name: str | None = None
    policy: str = "default"  # "default" (SmolLM2-135M-Instruct), "tiny", a local HF dir, or a hub id
    seed: int = 0
    versions: int = Field(2, gt=0)
    warm_start: bool = False
    gates: tuple[Literal["diagnosis", "design", "backtest", "completion"], ...] = ()
    agent: Literal["playbook", "claude"] = "playbook"
    claude: ClaudeAgentSpec = ClaudeAgentSpec()  # [claude] section: model, base_url, budget_usd, ...
    candidates_per_version: int = Field(3, ge=1, le=10)
    probes: int = Field(0, ge=0, le=9)
    probe_steps: int | None = Field(None, gt=0)
    data: DataSpec = DataSpec()
    train: TrainConfig = TrainConfig()
    harness: HarnessSpec = HarnessSpec()


PRESETS: dict[str, RunConfig] = {
    # Tiny random-initialised Llama, a handful of steps: for tests and CI (seconds per version).
    "smoke": RunConfig(
        policy="tiny",
        versions=2,
        data=DataSpec(tiers=(0,), n_train=16, n_val=7, seed=0),
        train=TrainConfig(
            max_steps=3, prompts_per_step=2, group_size=4, max_prompt_length=128, max_completion_length=12,
            learning_rate=1e-4, eval_k=4, checkpoint_every=1,
        ),
    ),
    # The embedded SmolLM2-135M-Instruct on one-digit sums: a real GRPO run on two CPU cores.
    "default": RunConfig(
        policy="default",
        versions=2,
        data=DataSpec(tiers=(0, 1), n_train=200, n_val=16, seed=0),
        train=TrainConfig(
            max_steps=10, prompts_per_step=4, group_size=4, max_prompt_length=256, max_completion_length=64,
            learning_rate=2e-6, eval_k=4, checkpoint_every=5,
        ),
    ),
}


def preset(name: str) -> RunConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field '{loc}': {err['msg']}{more}"


def load(path: str | Path | None, preset_name: str = "default") -> RunConfig:
    base = preset(preset_name)
    if path is None:
        return base
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the path")
    try:
        raw = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}; fix the syntax") from exc
    merged = _deep_merge(base.model_dump(mode="json"), raw)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"config {path}: {one_line(exc)}; fix that value") from exc
