"""A tiny, random-initialised Llama policy with a locally built tokenizer.

Used by tests and smoke runs that need a real ``transformers`` causal LM with a
chat template but must not touch the network or a model hub.  The tokenizer is
a byte-level BPE trained (deterministically) on an in-code corpus of
arithmetic / chat text; the model is a 2-layer ``LlamaForCausalLM`` whose
weights depend only on ``seed``.

The special tokens mirror SmolLM2-135M-Instruct (the default policy):
``<|endoftext|>`` = 0, ``<|im_start|>`` = 1 (bos), ``<|im_end|>`` = 2 (eos and
pad), and the chat template is the same ChatML layout, so code exercised
against the tiny policy meets the same quirks (e.g. pad == eos) as the real one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["TINY_CHAT_TEMPLATE", "TINY_MARKER", "build_tiny_policy", "quiet_hf_progress", "tiny_corpus"]

TINY_MARKER = "evotrainer-tiny.json"
_FORMAT_VERSION = 1

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|im_end|>"
_DEFAULT_SYSTEM = "You are a helpful assistant."

# ChatML, same layout as SmolLM2-135M-Instruct's template.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + _DEFAULT_SYSTEM + "<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The files a complete build contains (besides the marker).
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def tiny_corpus(n_lines: int = 400) -> list[str]:
    """The fixed training corpus for the tiny tokenizer (independent of the model seed)."""
    rng = random.Random(1234)
    words = ["plus", "minus", "times", "divided by", "equals", "sum", "difference",
             "product", "total", "number", "answer", "question", "solve", "step",
             "first", "then", "finally", "apples", "oranges", "coins", "has", "gives",
             "how many", "left", "more", "less", "each", "twice", "half"]
    names = ["Alice", "Bob", "Carol", "Dan", "Eve", "Sam", "Mia", "Tom"]
    ops = [("+", "plus"), ("-", "minus"), ("*", "times"), ("/", "divided by")]
    chat = ["system", "user", "assistant", "You are a helpful assistant.", "Please reason step by step,",
            "and put your final answer within \\boxed{}.", "Sure!", "Let me think.", "Hello", "Thanks"]
    lines: list[str] = []
    for i in range(n_lines):
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        sym, word = ops[i % 4]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[sym]
        kind = i % 6
        if kind == 0:
            lines.append(f"What is {a} {sym} {b}? The answer is {value}.")
        elif kind == 1:
            lines.append(f"{a} {word} {b} equals {value}, so the answer is \\boxed{{{value}}}.")
        elif kind == 2:
            n1, n2 = rng.sample(names, 2)
            lines.append(f"{n1} has {a} apples and gives {b} to {n2}. How many apples are left? "
                         f"{a} - {b} = {a - b}. The answer is \\boxed{{{a - b}}}.")
        elif kind == 3:
            lines.append(f"<|im_start|>user\nSolve {a} {sym} {b}.<|im_end|>\n"
                         f"<|im_start|>assistant\nLet me think. {a} {sym} {b} = {value}. "
                         f"The answer is \\boxed{{{value}}}.<|im_end|>")
        elif kind == 4:
            lines.append(" ".join(rng.choice(words) for _ in range(8)) + f" {rng.randint(0, 9999)}.")
        else:
            lines.append(" ".join(rng.choice(chat) for _ in range(3)))
    return lines


def _params(seed: int, vocab_size: int, hidden: int, layers: int) -> dict:
    return {"format_version": _FORMAT_VERSION, "seed": seed, "vocab_size": vocab_size,
            "hidden": hidden, "layers": layers}


def _is_complete(out_dir: Path, params: dict) -> bool:
    marker = out_dir / TINY_MARKER
    if not marker.is_file() or not all((out_dir / f).is_file() for f in _REQUIRED_FILES):
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("params") == params


def _build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one (as SmolLM2 does), then GPT-2 style byte-level splitting.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        model_max_length=512,
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


@contextmanager
def quiet_hf_progress():
    """Temporarily silence transformers' own progress bars ("Loading weights", "Writing model shards")."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _build_into(tmp: Path, params: dict) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _build_tokenizer(params["vocab_size"])
    if len(tokenizer) > params["vocab_size"]:  # cannot happen with BpeTrainer, but be explicit
        raise ValueError(f"tiny tokenizer has {len(tokenizer)} tokens > vocab_size={params['vocab_size']}")
    hidden, layers = params["hidden"], params["layers"]
    heads = max(1, hidden // 16)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = LlamaConfig(
        vocab_size=params["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2) if heads % 2 == 0 else heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
    )
    # Seed a private generator state without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(params["seed"])
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD])
    with quiet_hf_progress():
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    # Hash the produced files so callers / tests can compare builds cheaply.
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / TINY_MARKER).write_text(json.dumps(
        {"params": params, "n_tokens": len(tokenizer), "files": digests}, indent=2, sort_keys=True) + "\n")


def _chmod_like_mkdir(path: Path) -> None:
    """mkdtemp makes 0700 directories (and transformers writes model.safetensors 0600): use umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    for p in path.rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def build_tiny_policy(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 512,
                      hidden: int = 64, layers: int = 2) -> Path:
    """Build (or reuse) a tiny random Llama policy + local tokenizer in ``out_dir``.

    Deterministic: the same parameters give byte-identical files.  Idempotent:
    if ``out_dir`` already holds a complete build with the same parameters
    (recorded in ``evotrainer-tiny.json``), it is returned untouched.  A build
    with other parameters is replaced; a non-empty directory that is not a tiny
    build is never overwritten (``FileExistsError``).
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if vocab_size < 300:
        raise ValueError(f"vocab_size={vocab_size} is too small: need at least 300 (256 bytes + specials + merges)")
    if hidden < 16 or hidden % 16:
        raise ValueError(f"hidden={hidden} must be a positive multiple of 16 (head size 16)")
    if layers < 1:
        raise ValueError(f"layers={layers} must be >= 1")
    params = _params(int(seed), int(vocab_size), int(hidden), int(layers))
    if _is_complete(out_dir, params):
        return out_dir
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} exists and is not a directory; choose another out_dir")
        if any(out_dir.iterdir()) and not (out_dir / TINY_MARKER).exists():
            raise FileExistsError(
                f"{out_dir} is not empty and is not a tiny-policy build; refusing to overwrite it, choose another out_dir")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _build_into(tmp, params)
        _chmod_like_mkdir(tmp)
        if out_dir.exists():  # empty dir, or an older tiny build with other params
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
