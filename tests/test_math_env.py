"""Behaviour tests for the math domain (generator, split, verifier, JSONL loader)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from evotrainer.envs.base import Item, ensure_disjoint
from evotrainer.envs.math import (
    DEFAULT_SYSTEM_PROMPT,
    MathDomain,
    extract_answer,
    generate_items,
    load_jsonl,
    make_item_id,
    split_of,
    verify_completion,
)

ALL = (0, 1, 2, 3, 4)


def _item(answer: str) -> Item:
    return Item(item_id="t-1", question="q?", answer=answer)


# ------------------------------------------------------------------ generator


def test_deterministic_given_seed_tiers_n():
    d = MathDomain(tiers=ALL)
    assert d.train_items(60, 3) == d.train_items(60, 3)
    assert d.val_items(20, 3) == MathDomain(tiers=ALL).val_items(20, 3)
    assert [i.item_id for i in d.train_items(60, 3)] != [i.item_id for i in d.train_items(60, 4)]


def test_deterministic_across_processes():
    code = (
        "from evotrainer.envs.math import MathDomain;"
        "print(','.join(i.item_id for i in MathDomain(tiers=(0,1,2,3,4)).train_items(25, 7)))"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": str(h), "PATH": "", "PYTHONPATH": ":".join(sys.path)}).stdout
        for h in (1, 2)
    }
    assert len(outs) == 1
    here = ",".join(i.item_id for i in MathDomain(tiers=ALL).train_items(25, 7))
    assert outs == {here + "\n"}


def test_exact_n_distinct_and_ids_are_content_hashes():
    items = MathDomain(tiers=ALL).train_items(300, 0)
    assert len(items) == 300
    assert len({i.item_id for i in items}) == 300
    assert len({i.question for i in items}) == 300
    for it in items[:50]:
        assert it.item_id == make_item_id(it.tier, it.question, it.answer)
        assert it.item_id.startswith("m-") and len(it.item_id) == 14
        assert split_of(it.item_id) == "train"
        assert it.source == "generated"


@pytest.mark.parametrize("seed_a,seed_b", [(0, 0), (0, 1), (5, 99), (123, 7)])
@pytest.mark.parametrize("n_train,n_val", [(10, 5), (200, 50), (1000, 100)])
def test_train_val_disjoint(seed_a, seed_b, n_train, n_val):
    d = MathDomain(tiers=ALL)
    train, val = d.train_items(n_train, seed_a), d.val_items(n_val, seed_b)
    ensure_disjoint(train, val)
    assert not ({i.question for i in train} & {i.question for i in val})
    assert all(split_of(i.item_id) == "val" for i in val)
    assert all(split_of(i.item_id) == "train" for i in train)


def test_tier0_space_fully_partitioned():
    d = MathDomain()
    train, val = d.train_items(93, 0), d.val_items(7, 0)
    questions = {i.question for i in train} | {i.question for i in val}
    assert questions == {f"What is {a} + {b}?" for a in range(10) for b in range(10)}


def test_tiers_present_and_balanced():
    items = MathDomain(tiers=ALL).train_items(250, 1)
    counts = Counter(i.tier for i in items)
    assert set(counts) == set(ALL)
    assert all(c == 50 for c in counts.values())
    only = MathDomain(tiers=(3,)).val_items(30, 1)
    assert {i.tier for i in only} == {3}


def test_small_tier_surplus_goes_to_other_tiers():
    items = MathDomain(tiers=(0, 1)).train_items(400, 0)
    counts = Counter(i.tier for i in items)
    assert counts[0] == 93 and counts[1] == 307


def test_tier_content_and_answers_are_right():
    items = MathDomain(tiers=ALL).train_items(500, 2)
    for it in items:
        assert int(it.answer) >= 0
        if it.tier == 0:
            a, b = it.question.removeprefix("What is ").removesuffix("?").split(" + ")
            assert len(a) == len(b) == 1 and int(a) + int(b) == int(it.answer)
        elif it.tier in (1, 2):
            expr = it.question.removeprefix("What is ").removesuffix("?").replace("×", "*")
            assert eval(expr) == int(it.answer)
            if it.tier == 1:
                assert all(len(tok) == 2 for tok in expr.split() if tok.isdigit())
        else:
            assert it.question.endswith("?") and len(it.question.split()) > 12
            assert it.meta["ops"] >= (2 if it.tier == 3 else 3)


def test_too_many_items_raises_clear_error():
    with pytest.raises(ValueError, match="only 7 distinct val items"):
        MathDomain().val_items(8, 0)
    with pytest.raises(ValueError, match="only 93 distinct train"):
        MathDomain().train_items(94, 0)
    assert len(MathDomain().val_items(7, 0)) == 7


def test_bad_configuration():
    with pytest.raises(ValueError, match="unknown tier"):
        MathDomain(tiers=(0, 9))
    with pytest.raises(ValueError, match="at least one tier"):
        MathDomain(tiers=())
    with pytest.raises(ValueError):
        generate_items(-1, 0)
    assert generate_items(0, 0) == []


def test_messages():
    d = MathDomain(system_prompt="SYS")
    it = d.train_items(1, 0)[0]
    assert d.messages(it) == [{"role": "system", "content": "SYS"}, {"role": "user", "content": it.question}]
    default = MathDomain().messages(it)
    assert default[0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert "\\boxed{}" in DEFAULT_SYSTEM_PROMPT and "brief" in DEFAULT_SYSTEM_PROMPT.lower()
    assert MathDomain.name == "math"


# ------------------------------------------------------------------ verifier


def test_boxed_answer_correct_and_format_ok():
    r = MathDomain().verify(_item("8"), "3 + 5 = 8, so the answer is \\boxed{8}.")
    assert r == {"pred": "8", "gold": "8", "correct": True, "format_ok": True, "extraction": "boxed"}
    json.dumps(r)


def test_boxed_preferred_over_later_numbers_and_last_boxed_wins():
    r = verify_completion("8", "\\boxed{8} (I checked 3 times, 12 steps)")
    assert r["correct"] and r["pred"] == "8" and r["extraction"] == "boxed"
    r = verify_completion("8", "first \\boxed{7}, no wait: \\boxed{8}")
    assert r["correct"] and r["pred"] == "8"
    r = verify_completion("8", "\\boxed{8} ... \\boxed{9}")
    assert not r["correct"] and r["pred"] == "9"


def test_last_number_fallback():
    r = verify_completion("12", "Ann has 5, then 7 more, so 12 apples.")
    assert r == {"pred": "12", "gold": "12", "correct": True, "format_ok": False, "extraction": "last_number"}
    r = verify_completion("12", "12 is tempting but the total is 13")
    assert r["pred"] == "13" and not r["correct"] and not r["format_ok"]
    assert verify_completion("2", "5-3=2")["pred"] == "2"


def test_wrong_answers():
    for comp in ("\\boxed{9}", "\\boxed{-8}", "\\boxed{80}", "\\boxed{8.01}", "the answer is 7", "\\boxed{x}"):
        r = verify_completion("8", comp)
        assert r["correct"] is False, comp


@pytest.mark.parametrize(
    "gold,completion",
    [
        ("8", "\\boxed{8.0}"),
        ("8", "\\boxed{8.}"),
        ("8.0", "\\boxed{8}"),
        ("1200", "\\boxed{1,200}"),
        ("1200", "\\boxed{1{,}200}"),
        ("1,200", "\\boxed{1200}"),
        ("1200", "so it costs $1,200."),
        ("-3", "\\boxed{-3}"),
        ("-3", "x = -3"),
        ("-3", "x = \u22123"),
        ("0.5", "\\boxed{.5}"),
        ("8", "\\boxed{\\$8}"),
        ("8", "\\boxed{8 \\text{ apples}}"),
        ("8", "\\boxed{\\frac{16}{2}}"),
        ("1234567", "total: 1,234,567"),
    ],
)
def test_tricky_numbers_match(gold, completion):
    assert verify_completion(gold, completion)["correct"] is True


@pytest.mark.parametrize(
    "gold,completion",
    [("3", "x = -3"), ("-3", "\\boxed{3}"), ("1200", "\\boxed{1,20}"), ("12", "\\boxed{1.2}"), ("120", "1,200")],
)
def test_tricky_numbers_mismatch(gold, completion):
    assert verify_completion(gold, completion)["correct"] is False


def test_format_flags():
    assert verify_completion("8", "\\boxed{8}")["format_ok"] is True
    assert verify_completion("8", "\\boxed {8}")["format_ok"] is True
    assert verify_completion("8", "8")["format_ok"] is False
    assert verify_completion("8", "\\boxed{}")["extraction"] == "none"
    unbalanced = verify_completion("8", "\\boxed{8")
    assert unbalanced["format_ok"] is False and unbalanced["extraction"] == "last_number"
    # an unbalanced trailing \boxed falls back to the previous balanced one
    r = verify_completion("8", "\\boxed{8} and then \\boxed{9")
    assert r["extraction"] == "boxed" and r["pred"] == "8"
    assert verify_completion("8", "\\boxed{\\frac{1}{2}}")["pred"] == "\\frac{1}{2}"


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "   \n\t ",
        "no numbers here",
        "}}}{{{\\boxed{",
        "\\boxed{{{{{",
        "\\boxed",
        "\\boxed{\\}",
        "$$$\\frac{",
        "答案是八 😀 \u0000 \udcff",
        "\\boxed{9^{9^{9^{9}}}}",
        "\\boxed{10!!!}",
        "\\boxed{" + "(" * 500 + "}",
        "\\boxed{" + "9" * 5000 + "}",
        "x" * 2_000_000,
        "\\boxed{" * 10_000,
    ],
)
def test_garbage_never_raises(completion):
    r = verify_completion("8", completion)
    assert set(r) == {"pred", "gold", "correct", "format_ok", "extraction"}
    assert r["correct"] is False
    assert r["extraction"] in ("boxed", "last_number", "none")
    json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")


def test_non_string_completion_never_raises():
    assert verify_completion("8", None)["extraction"] == "none"  # type: ignore[arg-type]


def test_extract_answer():
    assert extract_answer("a \\boxed{1} b \\boxed{ 2 } c 3") == ("2", "boxed")
    assert extract_answer("a 1 b 22") == ("22", "last_number")
    assert extract_answer("nothing") == (None, "none")
    assert extract_answer("\\boxed{\\{1,2\\}}") == ("\\{1,2\\}", "boxed")


def test_verify_works_in_threads():
    cases = [("8", "\\boxed{\\frac{16}{2}}", True), ("8", "\\boxed{2^3}", True),
             ("8", "\\boxed{9^{9^{9}}}", False), ("1200", "\\boxed{1,200}", True), ("5", "\\boxed{\\sqrt{25}}", True),
             ("8", "\\boxed{7}", False)] * 5
    errors: list[BaseException] = []
    results: list[bool] = []

    def run_in_thread():
        try:
            with ThreadPoolExecutor(4) as ex:
                results.extend(ex.map(lambda c: verify_completion(c[0], c[1])["correct"], cases))
        except BaseException as e:  # pragma: no cover - surfaced below
            errors.append(e)

    t = threading.Thread(target=run_in_thread)
    t.start()
    t.join(60)
    assert not t.is_alive() and not errors
    assert results == [c[2] for c in cases]


def test_domain_verify_round_trip_on_generated_items():
    d = MathDomain(tiers=ALL)
    for it in d.val_items(50, 0):
        assert d.verify(it, f"Reasoning... \\boxed{{{it.answer}}}")["correct"]
        assert not d.verify(it, f"\\boxed{{{int(it.answer) + 1}}}")["correct"]


# ------------------------------------------------------------------ JSONL loader


def _write(tmp_path, lines, name="set.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_load_jsonl_gsm8k(tmp_path):
    p = _write(tmp_path, [
        json.dumps({"question": "Q1?", "answer": "Some steps <<2*3=6>>6\n#### 1,200"}),
        "",
        json.dumps({"question": "Q2?", "answer": "#### -4"}),
        json.dumps({"question": "Q3?", "answer": 42}),
    ], name="gsm8k_test.jsonl")
    items = load_jsonl(p)
    assert [i.answer for i in items] == ["1200", "-4", "42"]
    assert [i.question for i in items] == ["Q1?", "Q2?", "Q3?"]
    assert all(i.source == "gsm8k_test" for i in items)
    assert items[0].meta["solution"].startswith("Some steps")
    assert items[0].meta["line"] == 1 and items[1].meta["line"] == 3
    assert len({i.item_id for i in items}) == 3
    assert load_jsonl(p) == items  # stable ids
    assert MathDomain().verify(items[0], "\\boxed{1,200}")["correct"]


def test_load_jsonl_custom_keys_ids_source(tmp_path):
    p = _write(tmp_path, [json.dumps({"problem": "P?", "solution": "7", "uid": "a1"}),
                          json.dumps({"problem": "R?", "solution": "8", "uid": "a2"})])
    items = load_jsonl(p, question_key="problem", answer_key="solution", id_key="uid", source="mine")
    assert [(i.item_id, i.question, i.answer, i.source) for i in items] == [
        ("a1", "P?", "7", "mine"), ("a2", "R?", "8", "mine")]


def test_load_jsonl_dedupes_identical_content(tmp_path):
    line = json.dumps({"question": "Q?", "answer": "#### 3"})
    assert len(load_jsonl(_write(tmp_path, [line, line]))) == 1


@pytest.mark.parametrize(
    "lines,kwargs,pattern",
    [
        (['{"question": "Q", "answer": "1"}', "{not json"], {}, r"set\.jsonl:2: invalid JSON"),
        (['{"question": "Q"}'], {}, r"set\.jsonl:1: missing key 'answer'"),
        (['{"answer": "1"}'], {}, r"set\.jsonl:1: missing key 'question'"),
        (['{"question": "Q", "answer": "1"}'], {"id_key": "id"}, r"set\.jsonl:1: missing key 'id'"),
        (["[1, 2]"], {}, r"set\.jsonl:1: expected a JSON object"),
        (['{"question": "Q", "answer": "#### "}'], {}, r"set\.jsonl:1: empty answer"),
        (['{"question": "A", "answer": "1", "id": "x"}', '{"question": "B", "answer": "2", "id": "x"}'],
         {"id_key": "id"}, r"set\.jsonl:2: duplicate id 'x'"),
    ],
)
def test_load_jsonl_errors(tmp_path, lines, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern) as ei:
        load_jsonl(_write(tmp_path, lines), **kwargs)
    assert "\n" not in str(ei.value)


def test_core_import_pulls_no_heavy_deps():
    code = ("import sys, evotrainer.envs.math as m; m.verify_completion('8', '\\\\boxed{8}');"
            "bad = [k for k in sys.modules if k.split('.')[0] in ('torch', 'transformers', 'trl')];"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "", "PYTHONPATH": ":".join(sys.path)}).stdout
    assert out.strip() == "[]"
