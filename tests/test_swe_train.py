"""LLM policies on the SWE domain: multi-turn rollouts with exact token bookkeeping, and GRPO through TRL.

The rollout machinery (train/swe_rollout.py) is driven here by a scripted language model that writes
given messages token by token through the real tokenizer, so the test knows what a solving policy
says and checks what the trainer would see; the campaign test trains the tiny random Llama for real.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from evotrainer.envs.swe.domain import SweDomain
from evotrainer.envs.swe.policies import parse_hunks
from evotrainer.envs.swe.toy import build_toy_instances
from evotrainer.schema import DataSpec, HarnessSpec, SweEnvSpec, TrainConfig, VersionSpec
from evotrainer.store import Store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def swe_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe")
    build_toy_instances(root, n=4, seed=0)
    return root


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    from transformers import AutoTokenizer

    from evotrainer.train.tiny import build_tiny_policy

    tok = AutoTokenizer.from_pretrained(str(build_tiny_policy(data_dir / "models" / "tiny-llama")))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


class ScriptedLM:
    """Writes message k of `script` at its k-th generate() call, for every row of the batch."""

    def __init__(self, tokenizer, script: list[str]):
        self.tok, self.script, self.calls, self.inputs = tokenizer, script, 0, []
        self.training, self.device = True, torch.device("cpu")

    def eval(self):
        self.training = False

    def train(self):
        self.training = True

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, eos_token_id, **_):
        text = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        new = self.tok(text, add_special_tokens=False)["input_ids"][:max_new_tokens - 1] + [eos_token_id[0]]
        self.inputs.append([row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)])
        return torch.cat([input_ids, torch.tensor([new] * input_ids.shape[0])], dim=1)


def call(name, **arguments) -> str:
    return "I will act now. <tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def spec_for(swe_dir, **env) -> VersionSpec:
    return VersionSpec(version="v000", parent=None, policy="tiny", seed=0,
                       harness=HarnessSpec(system_prompt="Fix the bug with tools.",
                                           swe=SweEnvSpec(max_tokens_per_turn=2048, **env)),
                       data=DataSpec(domain="swe", swe_dir=str(swe_dir), n_train=2, n_val=1),
                       train=TrainConfig(max_completion_length=8192))


def test_scripted_lm_solves_through_the_text_protocol_with_exact_tokens(swe_dir, tokenizer, tmp_path):
    from evotrainer.train.swe_rollout import run_rollouts

    domain = SweDomain(str(swe_dir), "Fix the bug with tools.")
    spec = spec_for(swe_dir)
    item = domain.val_items(1, 0)[0]
    inst, _ = domain.instance(item)
    [(path, before, after)] = parse_hunks(inst.gold_patch)
    script = ['{"name": "read_file", "arguments": {"path": 3',  # malformed: a failed tool turn, not a crash
              call("read_file", path=path), call("search_replace", path=path, old=before, new=after),
              call("run_tests"), call("submit")]
    lm = ScriptedLM(tokenizer, script)
    [r] = run_rollouts(lm, tokenizer, domain, spec, [item], tmp_path, temperature=1.0, top_p=1.0,
                       max_completion_length=8192)
    assert r.verifier["correct"] and r.verifier["reward"] == 1.0
    s = r.episode.summary()
    assert s["stop_reason"] == "submitted" and s["n_edits"] == 1 and s["self_tested"] and s["n_tool_calls"] == 5
    tools = [t for t in r.episode.turns if t["role"] == "tool"]
    assert [t["tool_name"] for t in tools] == ["invalid", "read_file", "search_replace", "run_tests", "submit"]
    assert [t["tool_ok"] for t in tools] == [False, True, True, True, True]
    # each turn was generated from exactly the rollout's own tokens: prompt + completion so far
    seq = r.prompt_ids + r.completion_ids
    for k, [ctx] in enumerate(lm.inputs):
        assert seq[:len(ctx)] == ctx, f"turn {k} context differs from the rollout's tokens"
    # env_mask marks exactly the model's tokens; observations (tool outputs) are masked out of the loss
    model_tokens = [t for t, m in zip(r.completion_ids, r.env_mask) if m]
    written = [i for text in script for i in tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]]
    assert model_tokens == written and len(r.env_mask) == len(r.completion_ids)
    assert "[tool run_tests ok]" in tokenizer.decode([t for t, m in zip(r.completion_ids, r.env_mask) if not m])


def test_completion_budget_ends_the_rollout(swe_dir, tokenizer, tmp_path):
    from evotrainer.train.swe_rollout import run_rollouts

    domain = SweDomain(str(swe_dir), "Fix the bug with tools.")
    item = domain.val_items(1, 0)[0]
    lm = ScriptedLM(tokenizer, [call("list_dir")])
    rs = run_rollouts(lm, tokenizer, domain, spec_for(swe_dir), [item, item], tmp_path, temperature=1.0, top_p=1.0,
                      max_completion_length=300)
    for r in rs:
        assert len(r.completion_ids) == len(r.env_mask) <= 300
        assert not r.episode.done and r.verifier["reward"] == 0.0  # never submitted, nothing changed


def test_leaky_history_is_there_for_llm_policies_too(swe_dir, tokenizer, tmp_path):
    from evotrainer.train.swe_rollout import run_rollouts

    domain = SweDomain(str(swe_dir), "Fix the bug with tools.")
    item = domain.val_items(1, 0)[0]
    outs = {}
    for clear in (False, True):
        lm = ScriptedLM(tokenizer, [call("run_in_terminal", command="git log -p -n 1"), call("submit")])
        [r] = run_rollouts(lm, tokenizer, domain, spec_for(swe_dir, clear_git_log=clear), [item],
                           tmp_path / str(clear), temperature=1.0, top_p=1.0, max_completion_length=8192)
        outs[clear] = r.episode.turns[1]["tool_output"]
        assert r.episode.summary()["used_git_history"]
    _, before, after = parse_hunks(domain.instance(item)[0].gold_patch)[0]
    [fixed] = [ln for ln in after.splitlines() if ln not in before.splitlines()]
    assert "refactor" in outs[False] and "-" + fixed in outs[False]  # the original line, readable
    assert "refactor" not in outs[True]


CONFIG = """
policy = "tiny"
versions = 1
[data]
domain = "swe"
swe_dir = "{swe}"
n_train = 3
n_val = 1
[train]
max_steps = 2
prompts_per_step = 2
group_size = 2
eval_k = 2
max_completion_length = 96
[harness]
system_prompt = "Fix the bug. Reply with one <tool_call>{{\\"name\\": ..., \\"arguments\\": {{...}}}}</tool_call>."
rewards = [{{name = "env_reward", weight = 1.0}}]
[harness.swe]
turn_cap = 6
max_tokens_per_turn = 16
"""


@pytest.mark.slow
def test_grpo_on_swe_with_the_tiny_policy(swe_dir, data_dir, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(swe=swe_dir))
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", str(cfg), "--preset", "smoke",
                          "--campaign", str(tmp_path / "camp")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    store = Store.open(tmp_path / "camp")
    train = store.rollouts(["v000"], "train").collect()
    assert train.height == 8 and sorted(set(train["step"])) == [1, 2]
    assert train["n_turns"].min() >= 2 and train["mean_logprob"].is_not_null().all()
    assert {"n_edits", "used_git_history", "r.env_reward"} <= set(train.columns)
    turns = store.turns(["v000"], "train").collect()
    assert set(turns["rollout_uid"]) == set(train["rollout_uid"])
    # a random-initialised model writes no valid calls: each is recorded as a failed tool turn
    tools = turns.filter(pl.col("role") == "tool")
    assert tools.height == int(train["n_tool_calls"].sum()) and not tools["tool_ok"].any()
    val = store.rollouts(["v000"], "val").collect()
    assert val.height == 2 and store.turns(["v000"], "val").collect().height >= 4
    metrics = store.metrics(["v000"]).collect()
    assert metrics.height > 0
