"""SWE text protocol: one assistant message -> one tool call on a SweEpisode, robust to malformed calls.

Uses the tiny local instance of test_swe_env (a two-commit git repo built in tmp_path; nothing downloaded).
"""
from __future__ import annotations

import inspect
import json
import random

import polars as pl
import pytest

from evotrainer.envs.swe.env import INVALID_TOOL, TOOL_NAMES, SweEpisode
from evotrainer.envs.swe.toolcalls import (
    ERROR_KINDS,
    EXAMPLE_CALL,
    TOOL_SPECS,
    ParsedCall,
    ParseError,
    StepResult,
    observation_message,
    parse_tool_call,
    protocol_failures,
    step,
    tools_prompt,
)
from evotrainer.evidence import TURN_COLUMNS, conform
from tests.test_swe_env import build_instance


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    return build_instance(tmp_path_factory.mktemp("swe_tc"))


_n = iter(range(10_000))


def episode(instance, tmp_path, **kw) -> SweEpisode:
    inst, d = instance
    return SweEpisode(inst, d, tmp_path / f"work{next(_n)}", **kw)


def call(name, arguments=None, *, before: str = "") -> str:
    obj = {"name": name} if arguments is None else {"name": name, "arguments": arguments}
    return f"{before}<tool_call>{json.dumps(obj)}</tool_call>"


# --------------------------------------------------------------------------- specs and prompt


def test_specs_match_the_episode_methods():
    assert tuple(TOOL_SPECS) == TOOL_NAMES
    for name, spec in TOOL_SPECS.items():
        params = [p for p in inspect.signature(getattr(SweEpisode, name)).parameters.values() if p.name != "self"]
        assert [p.name for p in params] == [a.name for a in spec.args], name
        for p, a in zip(params, spec.args, strict=True):
            assert a.required == (p.default is inspect.Parameter.empty), (name, a.name)
            if not a.required:
                assert a.default == p.default, (name, a.name)


def test_tools_prompt_teaches_the_format():
    prompt = tools_prompt()
    assert EXAMPLE_CALL in prompt and "<tool_call>" in prompt and "</tool_call>" in prompt
    assert "exactly one tool call" in prompt
    for spec in TOOL_SPECS.values():
        assert spec.signature() in prompt
    assert "read_file(path: str, start?: int, end?: int)" in prompt
    assert parse_tool_call(EXAMPLE_CALL) == ParsedCall("read_file", {"path": "pkg/mod.py"}, "tag")


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, source", [
    ('<tool_call>{"name": "read_file", "arguments": {"path": "calc/ops.py"}}</tool_call>', "tag"),
    ('Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "calc/ops.py"}}\n</tool_call>\n', "tag"),
    ('<tool_call>{"name": "read_file", "arguments": {"path": "calc/ops.py"}}', "tag"),  # unterminated tag
    ('<tool_call>\n```json\n{"name": "read_file", "arguments": {"path": "calc/ops.py"}}\n```\n</tool_call>', "tag"),
    ('I will read it:\n```json\n{"name": "read_file", "arguments": {"path": "calc/ops.py"}}\n```', "fence"),
    ('```python\nx = 1\n```\n```\n{"name": "read_file", "arguments": {"path": "calc/ops.py"}}\n```', "fence"),
    ('```json{"name": "read_file", "arguments": {"path": "calc/ops.py"}}```', "fence"),
    ('  {"name": "read_file", "arguments": {"path": "calc/ops.py"}}  ', "bare"),
    ('Reading: {"name": "read_file", "arguments": {"path": "calc/ops.py"}} then I fix it.', "embedded"),
])
def test_accepted_forms(text, source):
    assert parse_tool_call(text) == ParsedCall("read_file", {"path": "calc/ops.py"}, source)


def test_parse_details():
    # raw newlines inside JSON strings (multi-line search_replace) are accepted
    p = parse_tool_call('<tool_call>{"name": "search_replace", "arguments": {"path": "a.py", "old": "x\n  y", '
                        '"new": "z"}}</tool_call>')
    assert isinstance(p, ParsedCall) and p.arguments["old"] == "x\n  y"
    # only the first call runs; the others are counted
    p = parse_tool_call(call("list_dir") + call("submit") + call("submit"))
    assert p == ParsedCall("list_dir", {}, "tag", ignored=2)
    # optional arguments given as null count as not given; arguments may be left out without required ones
    assert parse_tool_call(call("read_file", {"path": "a", "start": None})).arguments == {"path": "a"}
    assert parse_tool_call(call("submit")).arguments == {}
    assert parse_tool_call(call("run_tests", {"node_ids": ["t.py::a"]})).arguments == {"node_ids": ["t.py::a"]}
    # the tag wins over an earlier fence
    p = parse_tool_call('```json\n{"name": "submit"}\n```\n' + call("list_dir"))
    assert p.name == "list_dir" and p.source == "tag"


TOOLS_LIST = "tools are: list_dir, read_file, grep, search_replace, run_tests, run_in_terminal, submit"


@pytest.mark.parametrize("text, kind, message", [
    ("", "no_tool_call", "no tool call found"),
    ("I think the bug is in clamp.", "no_tool_call", "<tool_call>"),
    ("[tool read_file ok]", "no_tool_call", "no tool call found"),
    ("<tool_call></tool_call>", "bad_json", "the <tool_call> block is empty"),
    ("<tool_call>{'name': 'read_file'}</tool_call>", "bad_json", "is not valid JSON: Expecting property name"),
    ('<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}</tool_call>', "bad_json", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "bad_json", "must be a JSON object"),
    ("<tool_call>null</tool_call>", "bad_json", "got null"),
    ('[{"name": "submit"}]', "bad_json", "got a list"),
    ("```json\n{oops}\n```", "bad_json", "the fenced block is not valid JSON"),
    ('<tool_call>{"name": "edit_file", "arguments": {"path": "a.py"}}</tool_call>', "unknown_tool",
     f'unknown tool "edit_file"; {TOOLS_LIST}'),
    ('<tool_call>{"arguments": {"path": "a.py"}}</tool_call>', "unknown_tool", 'has no "name"'),
    ('<tool_call>{"name": 7}</tool_call>', "unknown_tool", '"name" that is an integer'),
    ('<tool_call>{"name": ["read_file"]}</tool_call>', "unknown_tool", "a list, not a string"),
    (call("read_file"), "missing_arguments", 'read_file needs argument "path"'),
    (call("read_file", {}), "missing_arguments", 'read_file needs argument "path"'),
    (call("read_file", {"path": None}), "missing_arguments", 'read_file needs argument "path"'),
    (call("search_replace", {"path": "a.py"}), "missing_arguments", 'search_replace needs arguments "old", "new"'),
    ('{"name": "read_file", "path": "a.py"}', "missing_arguments", 'arguments go inside "arguments"'),
    (call("read_file", ["a.py"]), "bad_arguments", 'read_file: "arguments" must be a JSON object, got a list'),
    (call("read_file", '{"path": "a.py"}'), "bad_arguments", "must be a JSON object, got a string"),
    (call("read_file", {"path": 3}), "bad_arguments", 'read_file: "path" must be a string, got an integer (3)'),
    (call("read_file", {"path": "a", "start": "5"}), "bad_arguments", '"start" must be an integer, got a string'),
    (call("read_file", {"path": "a", "start": True}), "bad_arguments", '"start" must be an integer, got a boolean'),
    (call("read_file", {"path": "a", "start": 1.5}), "bad_arguments", "got a number"),
    (call("read_file", {"file": "a.py", "path": "a.py"}), "bad_arguments",
     'read_file got unexpected argument "file"; its arguments are: path, start?, end?'),
    (call("run_tests", {"node_ids": "tests"}), "bad_arguments", '"node_ids" must be a list of strings'),
    (call("run_tests", {"node_ids": [1]}), "bad_arguments", "must be a list of strings"),
    (call("submit", {"reason": "done"}), "bad_arguments", ('submit got unexpected argument "reason"; '
                                                         "its arguments are: none")),
])
def test_parse_errors(text, kind, message):
    p = parse_tool_call(text)
    assert isinstance(p, ParseError) and p.kind == kind and p.kind in ERROR_KINDS, p
    assert message in p.message, p.message


GARBAGE = [
    "", " ", "\n\n", "null", "0", "-1e999", "true", '"read_file"', "[]", "{}", "[[[[", "]]]]", "{{{{}}}}",
    "{" * 5000, "[" * 100_000 + "]" * 100_000, '{"a":' * 3000 + "1" + "}" * 3000,
    "<tool_call>", "</tool_call>", "<tool_call><tool_call></tool_call>", "<tool_call>{", "<tool_call>{\"name\"",
    "<tool_call>" * 50_000, "```" * 10_000, "```json", "```json\n", "``` {", '{"name": "read_file"' + "," * 1000,
    '{"name": null, "arguments": null}', '{"name": {"x": 1}}', '{"name": "", "arguments": {}}',
    '{"name": "read_file", "arguments": [1, 2]}', '{"name": "read_file", "arguments": 5}',
    '{"name": "read_file", "arguments": {"path": {"nested": [1, {"a": null}]}}}',
    '{"name": "x" }' * 1000, "x" * 1_000_000, "é漢字🙂\u0000\ud800" * 1000, '{"name": "ré漢🙂", "arguments": {}}',
    "<tool_call>\u0000</tool_call>", '{"name": "list_dir", "arguments": {"path": NaN}}', '{"name": 1e400}',
    '<tool_call>{"name": "search_replace", "arguments": {"path": "a", "old": "' + "\\" * 7 + '"}}</tool_call>',
    '{"' + "k" * 100_000 + '": 1}', '{"name": "' + "n" * 100_000 + '"}',
]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    atoms = ["<tool_call>", "</tool_call>", "```", "```json\n", "{", "}", "[", "]", '"', ":", ",", "\\", "\n", " ",
             '"name"', '"arguments"', '"read_file"', '"path"', '"submit"', "null", "1", "true", "é", "🙂", "x"]
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def test_parse_never_raises_on_garbage():
    for text in [*GARBAGE, *_random_texts(3000), None, 123, b"bytes", ["list"], {"name": "submit"}]:
        p = parse_tool_call(text)
        assert isinstance(p, (ParsedCall, ParseError)), repr(text)[:80]
        if isinstance(p, ParseError):
            assert p.kind in ERROR_KINDS and p.message
            json.dumps(p.raw_args)  # recordable
        else:
            assert p.name in TOOL_NAMES


# --------------------------------------------------------------------------- stepping an episode


def _pair(ep: SweEpisode, text: str) -> tuple[dict, dict]:
    a, t = ep.turns[-2:]
    assert a["role"] == "assistant" and a["text"] == text and a["tool_name"] is None
    assert t["role"] == "tool" and t["text"] is None and t["turn_idx"] == a["turn_idx"] + 1
    return a, t


def test_a_valid_call_per_tool_runs_and_is_recorded(instance, tmp_path):
    ep = episode(instance, tmp_path)
    script = [
        ("list_dir", {"path": "calc"}, "ops.py"),
        ("read_file", {"path": "calc/ops.py", "start": 5, "end": 7}, "if x > lo"),
        ("grep", {"pattern": r"def \w+", "path": "calc"}, "calc/ops.py:4:def clamp"),
        ("run_tests", {"node_ids": ["tests/test_ops.py::test_add"]}, "passed"),
        ("run_in_terminal", {"command": "python -c 'print(6*7)'"}, "42"),
        ("search_replace", {"path": "calc/ops.py", "old": "    if x > lo:\n", "new": "    if x < lo:\n"}, "edited"),
        ("submit", None, "submitted"),
    ]
    for name, args, expect in script:
        text = call(name, args, before=f"Now {name}.\n")
        res = step(ep, text)
        assert isinstance(res, StepResult) and res.ok and res.tool_name == name and res.error_kind is None, res
        assert expect in res.observation
        _, t = _pair(ep, text)
        assert t["tool_name"] == name and t["tool_ok"] is True and t["tool_output"] == res.observation
    assert res.done and ep.stop_reason == "submitted" and len(ep.turns) == 2 * len(script)
    assert json.loads(ep.turns[3]["tool_args"]) == {"path": "calc/ops.py", "start": 5, "end": 7}
    df = conform(pl.DataFrame(ep.turn_rows(), schema_overrides={"mean_logprob": pl.Float64}), TURN_COLUMNS, "turns")
    assert df.height == 14 and df["role"].to_list() == ["assistant", "tool"] * 7
    # over: a further message is answered but not recorded
    res = step(ep, call("list_dir"))
    assert not res.ok and res.done and res.error_kind == "episode_over" and res.tool_name is None
    assert len(ep.turns) == 14
    assert observation_message(res)["content"].startswith("[episode over]")


@pytest.mark.parametrize("text, kind, tool_name, tool_args, message", [
    ("Hmm, let me think about clamp.", "no_tool_call", INVALID_TOOL, None, "no tool call found"),
    ('<tool_call>{"name": "read_file", "arguments": {"path": "calc/ops.py"</tool_call>', "bad_json", INVALID_TOOL,
     '{"name": "read_file", "arguments": {"path": "calc/ops.py"', "not valid JSON"),
    (call("edit_file", {"path": "calc/ops.py"}), "unknown_tool", "edit_file", {"path": "calc/ops.py"},
     'unknown tool "edit_file"; tools are: list_dir, read_file'),
    ('<tool_call>{"name": 42, "arguments": {}}</tool_call>', "unknown_tool", INVALID_TOOL, {}, '"name" that is'),
    (call("read_file", {"start": 1}), "missing_arguments", INVALID_TOOL, {"start": 1},
     'read_file needs argument "path"'),
    (call("search_replace", {"path": "calc/ops.py", "old": 1, "new": "x"}), "bad_arguments", INVALID_TOOL,
     {"path": "calc/ops.py", "old": 1, "new": "x"}, 'search_replace: "old" must be a string'),
    (call("run_in_terminal", ["ls"]), "bad_arguments", INVALID_TOOL, ["ls"], '"arguments" must be a JSON object'),
    (call("run_in_terminal", {"cmd": "git log -p"}), "missing_arguments", INVALID_TOOL, {"cmd": "git log -p"},
     'run_in_terminal needs argument "command"; run_in_terminal got unexpected argument "cmd"'),
])
def test_malformed_calls_become_failed_tool_turns(instance, tmp_path, text, kind, tool_name, tool_args, message):
    ep = episode(instance, tmp_path)
    res = step(ep, text)
    assert not res.ok and not res.done and res.error_kind == kind and res.tool_name == tool_name
    assert message in res.observation
    _, t = _pair(ep, text)
    assert t["tool_name"] == tool_name and t["tool_ok"] is False and t["tool_output"] == res.observation
    assert (None if t["tool_args"] is None else json.loads(t["tool_args"])) == tool_args
    assert len(ep.turns) == 2 and not ep.done
    msg = observation_message(res)
    assert msg["role"] == "user" and msg["content"].startswith(f"[invalid tool call: {kind}]\n")
    assert "<tool_call>" in msg["content"]  # the format reminder
    # the episode goes on: the next good call runs
    res = step(ep, call("read_file", {"path": "calc/ops.py"}))
    assert res.ok and ep.turns[-1]["tool_name"] == "read_file" and len(ep.turns) == 4
    s = ep.summary()  # never trips on the failed turn's arguments (run_in_terminal ones included)
    assert s["n_tool_calls"] == 2 and s["n_terminal_calls"] == 0 and not s["used_git_history"]


def test_scripted_text_conversation_fixes_the_bug(instance, tmp_path):
    ep = episode(instance, tmp_path)
    messages = [{"role": "system", "content": tools_prompt()}, {"role": "user", "content": "clamp is broken"}]
    replies = [
        "The failing test is about clamp; let me read it.\n" + call("read_file", {"path": "calc/ops.py"}),
        # a raw newline inside the JSON string and a fenced fallback: both accepted
        ('```json\n{"name": "search_replace", "arguments": {"path": "calc/ops.py", "old": "    if x > lo:\n", '
        '"new": "    if x < lo:\\n"}}\n```'),
        call("run_tests"),
        call("submit"),
    ]
    verdicts = []
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        res = step(ep, reply)
        messages.append(observation_message(res))
        verdicts.append((res.tool_name, res.ok))
    assert verdicts == [("read_file", True), ("search_replace", True), ("run_tests", True), ("submit", True)]
    assert messages[3]["content"].startswith("[tool read_file ok]\n") and "if x > lo" in messages[3]["content"]
    assert messages[-1] == {"role": "user", "content": "[tool submit ok]\nsubmitted\n[episode over: submitted]"}
    verifier, reward = ep.score()
    assert verifier["correct"] and reward == 1.0
    s = ep.summary()
    assert s["n_turns"] == 8 and s["n_tool_calls"] == 4 and s["n_edits"] == 1 and s["self_tested"]
    assert s["search_before_edit"] and s["stop_reason"] == "submitted" and protocol_failures(ep.turns) == 0


def test_failed_tool_is_not_a_protocol_failure(instance, tmp_path):
    ep = episode(instance, tmp_path)
    res = step(ep, call("search_replace", {"path": "calc/ops.py", "old": "nope", "new": "x"}))
    assert not res.ok and res.error_kind is None and res.tool_name == "search_replace"
    assert observation_message(res)["content"].startswith("[tool search_replace failed]\nedit failed")
    res = step(ep, call("read_file", {"path": "calc/ops.py"}) + call("submit"))
    assert res.ok and res.ignored == 1 and not ep.done  # the second call did not run
    assert "1 more tool call(s)" in observation_message(res)["content"]
    assert ep.summary()["n_edit_failures"] == 1 and protocol_failures(ep.turns) == 0


def test_turn_cap_ends_an_episode_of_invalid_calls(instance, tmp_path):
    ep = episode(instance, tmp_path, turn_cap=6)
    results = [step(ep, "no call here") for _ in range(5)]
    assert [r.done for r in results] == [False, False, True, True, True]
    assert ep.done and ep.stop_reason == "turn_cap" and len(ep.turns) == 6  # 3 messages, each a pair
    assert results[2].stop_reason == "turn_cap" and results[3].error_kind == "episode_over"
    assert observation_message(results[2])["content"].endswith("[episode over: turn_cap]")
    # an odd cap never splits a pair: the message reaching it still gets its tool turn
    ep = episode(instance, tmp_path, turn_cap=3)
    step(ep, call("list_dir"))
    res = step(ep, call("read_file", {"path": "calc/ops.py"}))
    assert res.ok and res.done and ep.stop_reason == "turn_cap" and len(ep.turns) == 4
    assert ep.turns[-1]["tool_name"] == "read_file"
    # the token budget: a huge message still gets its (failed) tool turn, then the episode ends
    ep = episode(instance, tmp_path, token_budget=1000)
    res = step(ep, "{" + "x" * 20_000)
    assert res.done and res.error_kind == "bad_json" and ep.stop_reason == "token_budget" and len(ep.turns) == 2
    assert len(ep.turns[1]["tool_args"]) < 5000  # the raw call text is capped


def test_summary_counts_invalid_calls(instance, tmp_path):
    ep = episode(instance, tmp_path)
    texts = [
        call("read_file", {"path": "calc/ops.py"}),                       # 1 tool  read_file ok
        "I should edit the file.",                                       # 3 tool  invalid (no call)
        call("edit_file", {"path": "calc/ops.py"}),                      # 5 tool  edit_file (unknown)
        call("search_replace", {"path": "calc/ops.py", "old": "x"}),     # 7 tool  invalid (missing "new")
        call("run_tests", {"node_ids": "all"}),                          # 9 tool  invalid (bad node_ids)
        call("search_replace", {"path": "calc/ops.py", "old": "zzz", "new": "y"}),  # 11 edit failure
        "<tool_call>{bad</tool_call>",                                   # 13 tool invalid (bad JSON)
        "<tool_call>{bad</tool_call>",                                   # 15 tool invalid (bad JSON)
    ]
    for t in texts:
        step(ep, t)
    s = ep.summary()
    assert s["n_turns"] == 16 and s["n_tool_calls"] == 8
    assert protocol_failures(ep.turns) == 6
    assert [t["tool_name"] for t in ep.turns if t["role"] == "tool"] == [
        "read_file", INVALID_TOOL, "edit_file", INVALID_TOOL, INVALID_TOOL, "search_replace", INVALID_TOOL,
        INVALID_TOOL]
    # only calls that reached a tool count as edits, test runs and searches
    assert s["n_edits"] == 0 and s["n_edit_failures"] == 1 and s["first_edit_turn"] == 11
    assert s["n_test_runs"] == 0 and s["n_search_calls"] == 1 and s["search_before_edit"]
    assert s["max_same_tool_streak"] == 2  # the two bad-JSON calls in a row
    assert sum(t["tool_ok"] is False for t in ep.turns if t["role"] == "tool") == 7


def test_step_never_raises_on_garbage(instance, tmp_path):
    ep = episode(instance, tmp_path, turn_cap=100_000, token_budget=10**9)
    texts = [*GARBAGE, *_random_texts(300, seed=1), None, 123]
    for text in texts:
        res = step(ep, text)
        assert isinstance(res, StepResult) and not res.done
        msg = observation_message(res)
        assert msg["role"] == "user" and isinstance(msg["content"], str)
    assert len(ep.turns) == 2 * len(texts)
    assert all(t["role"] == "tool" for t in ep.turns[1::2])
    df = conform(pl.DataFrame(ep.turn_rows(), schema_overrides={"mean_logprob": pl.Float64}), TURN_COLUMNS, "turns")
    assert df.height == 2 * len(texts)
    ep.summary()


def test_record_invalid_call_guards(instance, tmp_path):
    ep = episode(instance, tmp_path)
    with pytest.raises(ValueError, match="is a tool"):
        ep.record_invalid_call("read_file", {}, "x")
    r = ep.record_invalid_call("", {1: object()}, "broken")  # unrecordable arguments are kept as a repr
    assert not r.ok and ep.turns[-1]["tool_name"] == INVALID_TOOL and "object" in json.loads(ep.turns[-1]["tool_args"])
