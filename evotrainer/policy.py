"""Which policy a campaign trains, resolved without importing torch.

- "default": SmolLM2-135M-Instruct, fetched by `evotrainer models fetch` into data/models/;
- "tiny": a tiny random-initialised Llama with a locally built tokenizer (tests, smoke runs),
  built on first use by the training process;
- a local Hugging Face model directory (must hold config.json);
- anything else of the form "org/name" is taken as a hub id (only where a hub is reachable).
"""
from __future__ import annotations

import re
from pathlib import Path

from .errors import ModelNotFoundError

DEFAULT_DIRNAME = "smollm2-135m-instruct"
TINY_DIRNAME = "tiny-llama"
MARKER = "evotrainer-model.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def default_dir(models_dir: Path) -> Path:
    return Path(models_dir) / DEFAULT_DIRNAME


def tiny_dir(models_dir: Path) -> Path:
    return Path(models_dir) / TINY_DIRNAME


def check(spec: str, models_dir: Path) -> None:
    """Raise ModelNotFoundError (one line, with the fix) when `spec` cannot be trained."""
    resolve(spec, models_dir)


def resolve(spec: str, models_dir: Path) -> str:
    if spec == "default":
        d = default_dir(models_dir)
        if not (d / MARKER).exists():
            raise ModelNotFoundError(
                f"the default policy is not fetched yet (no {d / MARKER}); run `evotrainer models fetch`"
            )
        return str(d)
    if spec == "tiny":
        return str(tiny_dir(models_dir))
    p = Path(spec).expanduser()
    looks_like_path = spec.startswith((".", "/", "~")) or p.exists() or not _HUB_ID.match(spec)
    if looks_like_path:
        if not p.is_dir():
            raise ModelNotFoundError(f"model path {spec} does not exist; set `policy` to a model directory, 'default' or 'tiny'")
        if not (p / "config.json").exists():
            raise ModelNotFoundError(f"model path {spec} has no config.json; point `policy` at a Hugging Face model directory")
        return str(p.resolve())
    return spec  # a hub id; loading it needs a reachable hub
