"""Seeded function-writing tasks with tests, split train/val by content hash.

Each template enumerates a small parameter space (a digit base, a threshold, a shift, a
function name...). One parameter choice gives one item: a natural-language spec with the exact
signature, and 6-8 test cases whose inputs are drawn from an rng seeded by the item's own
parameters (so the same question always has the same tests) and whose expected outputs come from
a reference implementation here. Tests are stored JSON-able in ``meta["tests"]`` as
``{"args": [...], "expected": ...}``.

Tiers (template difficulty):
  0  one loop / one filter            digit sums, list filters, counting a character, repeats
  1  a little more bookkeeping        sums of powers, Caesar shift, clamping, every k-th element
  2  several rules / state            FizzBuzz variants, run-length encoding, k-th largest, running
                                      max/min/sum, palindromes ignoring punctuation

An item's split is a pure function of its id (``int(hex, 16) % 10 == 0`` -> val), exactly as in
the math domain, so train and held-out sets never overlap whatever seed or size is asked for.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from evotrainer.envs.base import Item, distinct_in_split, split_by_hash
from evotrainer.envs.base import check_tiers as _check_tiers

Split = Literal["train", "val"]
TIERS: tuple[int, ...] = (0, 1, 2)
VAL_MODULUS = 10  # 1 in 10 items (by hash) is held out
N_CASES = 7

_WORDS = ("apple", "be", "cat", "delta", "echo", "fig", "go", "harbor", "ink", "jazz", "kite",
          "lemonade", "moon", "no", "orbit", "pi", "quiet", "river", "sun", "tree", "umbrella")


def make_item_id(question: str, tests: list[dict[str, Any]]) -> str:
    """"cg-" + 12 hex chars of sha256(question, canonical JSON of the tests)."""
    blob = question + "\x1f" + json.dumps(tests, sort_keys=True, separators=(",", ":"))
    return "cg-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def split_of(item_id: str) -> Split:
    """Which split an item id belongs to; depends on the id alone."""
    return split_by_hash(item_id, VAL_MODULUS)  # type: ignore[return-value]


@dataclass(frozen=True)
class Spec:
    """One parameterised task: what the prompt says, the reference solution, the inputs."""

    kind: str
    tier: int
    fname: str
    params: str  # the signature's parameter list, e.g. "nums"
    desc: str  # completes "... that <desc>."
    ref: Callable[..., Any]
    inputs: Callable[[random.Random], list[list[Any]]]  # fixed edge cases + random ones


def _ints(rng: random.Random, k: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(k)]


def _lists(rng: random.Random, edge: list[list[Any]], lo: int = -20, hi: int = 40) -> list[list[Any]]:
    out = [list(e) for e in edge]
    while len(out) < N_CASES:
        out.append([_ints(rng, rng.randint(1, 9), lo, hi)])
    return out


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 7)))


def _strings(rng: random.Random, edge: list[str], alphabet: str = "abcdeio") -> list[list[Any]]:
    out = [[e] for e in edge]
    while len(out) < N_CASES:
        out.append(["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))])
    return out


# ---------------------------------------------------------------- tier 0


def _digit_sum() -> Iterator[Spec]:
    for base in range(2, 11):
        for fname in ("digit_sum", "sum_digits", "add_digits"):
            what = "decimal digits" if base == 10 else f"digits in base {base}"

            def ref(n: int, b: int = base) -> int:
                s = 0
                while n:
                    n, r = divmod(n, b)
                    s += r
                return s

            yield Spec("digit_sum", 0, fname, "n",
                       f"returns the sum of the {what} of the non-negative integer `n`", ref,
                       lambda rng: [[0], [7], [1000]]
                       + [[v] for v in _ints(rng, N_CASES - 3, 1, 10**6)])


def _keep_multiples() -> Iterator[Spec]:
    for k in range(2, 10):
        for keep in (True, False):
            for fname in ("keep_multiples", "filter_multiples") if keep else ("drop_multiples", "remove_multiples"):
                ref = (lambda nums, k=k: [x for x in nums if x % k == 0]) if keep else (
                    lambda nums, k=k: [x for x in nums if x % k != 0])
                how = "are" if keep else "are not"
                yield Spec("keep_multiples", 0, fname, "nums",
                           f"returns a new list of the integers in the list `nums` that {how} divisible "
                           f"by {k}, in their original order", ref,
                           lambda rng, k=k: _lists(rng, [[[]], [[0, k, k + 1]]]))


_CMP = {">": ("greater than", lambda a, b: a > b), ">=": ("greater than or equal to", lambda a, b: a >= b),
        "<": ("less than", lambda a, b: a < b), "<=": ("less than or equal to", lambda a, b: a <= b)}


def _keep_compare() -> Iterator[Spec]:
    for t in range(-5, 16):
        for words, f in _CMP.values():
            for fname in ("filter_values", "select_values"):
                yield Spec("keep_compare", 0, fname, "nums",
                           f"returns a new list of the numbers in the list `nums` that are {words} {t}, "
                           f"in their original order",
                           lambda nums, t=t, f=f: [x for x in nums if f(x, t)],
                           lambda rng, t=t: _lists(rng, [[[]], [[t - 1, t, t + 1]]]))


def _count_char() -> Iterator[Spec]:
    for c in "abcdeinorst":
        for fname in ("count_char", "count_letter", "occurrences"):
            yield Spec("count_char", 0, fname, "s",
                       f"returns how many times the lowercase letter '{c}' occurs in the string `s` "
                       f"(uppercase '{c.upper()}' does not count)",
                       lambda s, c=c: s.count(c),
                       lambda rng, c=c: _strings(rng, ["", c + c.upper() + c], alphabet="abcdeinorstABC"))


def _repeat_chars() -> Iterator[Spec]:
    for k in range(2, 6):
        for sep, sep_words in (("", ""), ("-", " and puts a '-' between consecutive groups")):
            for fname in ("repeat_chars", "stretch", "echo_letters"):
                yield Spec("repeat_chars", 0, fname, "s",
                           f"returns a string in which every character of the string `s` is repeated "
                           f"{k} times{sep_words} (for an empty `s`, an empty string)",
                           lambda s, k=k, sep=sep: sep.join(ch * k for ch in s),
                           lambda rng: _strings(rng, ["", "x"]))


# ---------------------------------------------------------------- tier 1


def _sum_powers() -> Iterator[Spec]:
    for p in range(1, 5):
        for start in (0, 1, 2):
            for fname in ("sum_powers", "power_sum"):
                yield Spec("sum_powers", 1, fname, "n",
                           f"returns the sum of i**{p} for every integer i from {start} to `n` inclusive "
                           f"(0 when `n` < {start})",
                           lambda n, p=p, start=start: sum(i**p for i in range(start, n + 1)),
                           lambda rng, start=start: [[start - 1], [start], [start + 1]]
                           + [[v] for v in _ints(rng, N_CASES - 3, 3, 60)])


def _caesar() -> Iterator[Spec]:
    for k in range(1, 26):
        for fname in ("caesar", "shift_letters"):
            def ref(s: str, k: int = k) -> str:
                return "".join(chr((ord(ch) - 97 + k) % 26 + 97) if "a" <= ch <= "z" else ch for ch in s)

            yield Spec("caesar", 1, fname, "s",
                       f"shifts every lowercase letter a-z in the string `s` forward by {k} places in the "
                       f"alphabet, wrapping around from 'z' to 'a', leaves every other character unchanged, "
                       f"and returns the result", ref,
                       lambda rng: [[""], ["xyz"], ["Hello, world!"]]
                       + [[_sentence(rng)] for _ in range(N_CASES - 3)])


def _clamp() -> Iterator[Spec]:
    for lo in range(-5, 6):
        for width in (3, 5, 8, 12):
            hi = lo + width
            for fname in ("clamp_all", "clip_values"):
                yield Spec("clamp", 1, fname, "nums",
                           f"returns a new list where each number x of the list `nums` is replaced by {lo} "
                           f"if x < {lo}, by {hi} if x > {hi}, and kept otherwise",
                           lambda nums, lo=lo, hi=hi: [min(max(x, lo), hi) for x in nums],
                           lambda rng, lo=lo, hi=hi: _lists(rng, [[[]], [[lo - 1, lo, hi, hi + 1]]]))


def _count_long_words() -> Iterator[Spec]:
    for k in range(2, 9):
        for strict, words in ((True, "more than"), (False, "at least")):
            for fname in ("count_long_words", "long_word_count"):
                yield Spec("count_long_words", 1, fname, "sentence",
                           f"returns how many words of the string `sentence` (words are separated by single "
                           f"spaces) have {words} {k} letters",
                           lambda sentence, k=k, strict=strict: sum(
                               1 for w in sentence.split() if (len(w) > k if strict else len(w) >= k)),
                           lambda rng: [[""]] + [[_sentence(rng)] for _ in range(N_CASES - 1)])


def _every_kth() -> Iterator[Spec]:
    for k in range(2, 6):
        for start in range(k):
            for fname in ("every_kth", "take_every"):
                yield Spec("every_kth", 1, fname, "items",
                           f"returns a new list of the elements of the list `items` at indexes {start}, "
                           f"{start + k}, {start + 2 * k}, ... (every {k}th element starting at index {start})",
                           lambda items, k=k, start=start: list(items[start::k]),
                           lambda rng: _lists(rng, [[[]], [[5]]]))


# ---------------------------------------------------------------- tier 2


def _fizzbuzz() -> Iterator[Spec]:
    for a in range(2, 7):
        for b in range(a + 1, 10):
            if b % a == 0:
                continue
            for wa, wb in (("Fizz", "Buzz"), ("Ping", "Pong"), ("Foo", "Bar")):
                def ref(n: int, a: int = a, b: int = b, wa: str = wa, wb: str = wb) -> list[str]:
                    return [(wa if i % a == 0 else "") + (wb if i % b == 0 else "") or str(i)
                            for i in range(1, n + 1)]

                yield Spec("fizzbuzz", 2, (wa + "_" + wb).lower(), "n",
                           f"returns a list of strings for the integers 1 to `n` inclusive: '{wa}{wb}' for "
                           f"numbers divisible by both {a} and {b}, '{wa}' for those divisible only by {a}, "
                           f"'{wb}' for those divisible only by {b}, and the number itself as a string "
                           f"otherwise (an empty list when `n` < 1)", ref,
                           lambda rng, a=a, b=b: [[0], [a * b]] + [[v] for v in _ints(rng, N_CASES - 2, 1, 40)])


def _rle() -> Iterator[Spec]:
    for count_first in (True, False):
        for fname in ("run_length", "rle_encode", "compress"):
            def ref(s: str, count_first: bool = count_first) -> str:
                out, i = [], 0
                while i < len(s):
                    j = i
                    while j < len(s) and s[j] == s[i]:
                        j += 1
                    out.append(f"{j - i}{s[i]}" if count_first else f"{s[i]}{j - i}")
                    i = j
                return "".join(out)

            ex = "'3a2b1c'" if count_first else "'a3b2c1'"
            yield Spec("rle", 2, fname, "s",
                       f"run-length encodes the string of letters `s`: each maximal run of one repeated "
                       f"letter becomes {'its length followed by the letter' if count_first else 'the letter followed by its length'}, "
                       f"e.g. 'aaabbc' -> {ex} (an empty string for an empty `s`)", ref,
                       lambda rng: _strings(rng, ["", "z"], alphabet="aab"))


def _kth_largest() -> Iterator[Spec]:
    for k in range(1, 5):
        for fname in ("kth_largest", "nth_biggest", "rank_value"):
            ordinal = {1: "largest", 2: "second largest", 3: "third largest", 4: "fourth largest"}[k]

            def ref(nums: list[int], k: int = k) -> int | None:
                d = sorted(set(nums), reverse=True)
                return d[k - 1] if len(d) >= k else None

            yield Spec("kth_largest", 2, fname, "nums",
                       f"returns the {ordinal} distinct value in the list of integers `nums` (equal values "
                       f"count once), or None when there are fewer than {k} distinct values", ref,
                       lambda rng, k=k: _lists(rng, [[[]], [[3] * (k + 1)]], lo=-9, hi=9))


def _running() -> Iterator[Spec]:
    modes = {"sum": ("the sum", lambda acc, x: acc + x), "max": ("the maximum", max), "min": ("the minimum", min)}
    for mode, (words, f) in modes.items():
        for fname in (f"running_{mode}", f"prefix_{mode}", f"cumulative_{mode}"):
            def ref(nums: list[int], f: Callable[[int, int], int] = f) -> list[int]:
                out: list[int] = []
                for x in nums:
                    out.append(x if not out else f(out[-1], x))
                return out

            yield Spec("running", 2, fname, "nums",
                       f"returns a list whose i-th element is {words} of the first i+1 elements of the "
                       f"list `nums` (an empty list for an empty `nums`)", ref,
                       lambda rng: _lists(rng, [[[]], [[4]]]))


def _palindrome() -> Iterator[Spec]:
    for fname in ("is_palindrome", "palindromic", "reads_same_backwards"):
        for ignore_case in (True, False):
            def ref(s: str, ignore_case: bool = ignore_case) -> bool:
                t = [c.lower() if ignore_case else c for c in s if c.isalnum()]
                return t == t[::-1]

            case = "ignoring upper/lower case" if ignore_case else "where upper and lower case letters differ"
            yield Spec("palindrome", 2, fname, "s",
                       f"returns True if the string `s` reads the same forwards and backwards when only its "
                       f"letters and digits are considered ({case}), else False", ref,
                       lambda rng: [[""], ["Aba"], ["a, b; A"], ["No lemon, no melon"], ["race car"],
                                    ["ab1ba"], ["abc"]])


_TEMPLATES: tuple[Callable[[], Iterator[Spec]], ...] = (
    _digit_sum, _keep_multiples, _keep_compare, _count_char, _repeat_chars,
    _sum_powers, _caesar, _clamp, _count_long_words, _every_kth,
    _fizzbuzz, _rle, _kth_largest, _running, _palindrome,
)


def _fmt_call(fname: str, args: list[Any]) -> str:
    return f"{fname}({', '.join(repr(a) for a in args)})"


def _item_of(spec: Spec) -> Item:
    sig = f"def {spec.fname}({spec.params}):"
    rng = random.Random(f"evotrainer.code:{spec.kind}:{spec.fname}:{spec.desc}")
    tests: list[dict[str, Any]] = []
    for args in spec.inputs(rng):
        tests.append({"args": args, "expected": spec.ref(*json.loads(json.dumps(args)))})
    tests = json.loads(json.dumps(tests))  # JSON-canonical (tuples -> lists)
    ex = next((t for t in tests if t["args"] not in ([[]], [""], [0])), tests[0])
    question = (
        f"Write a Python function `{sig[4:-1]}` that {spec.desc}.\n\n"
        f"For example, `{_fmt_call(spec.fname, ex['args'])}` should return `{ex['expected']!r}`.\n\n"
        f"Start your function with:\n{sig}"
    )
    return Item(
        item_id=make_item_id(question, tests),
        question=question,
        answer="",
        tier=spec.tier,
        source="generated",
        meta={"kind": spec.kind, "entry_point": spec.fname, "prompt": sig + "\n", "tests": tests},
    )


@cache
def _pool(tier: int, split: Split) -> tuple[Item, ...]:
    """All distinct items of one tier that fall in `split` (canonical order)."""
    def tier_items():
        for template in _TEMPLATES:
            for spec in template():
                if spec.tier != tier:
                    break  # a template's specs share one tier
                yield _item_of(spec)

    return distinct_in_split(tier_items(), split, split_of)


def check_tiers(tiers: Sequence[int]) -> tuple[int, ...]:
    return _check_tiers(tiers, TIERS, "code")


def pool_size(tiers: Sequence[int], split: Split) -> int:
    return sum(len(_pool(t, split)) for t in check_tiers(tiers))


def generate_items(n: int, seed: int, tiers: Sequence[int] = TIERS, split: Split = "train") -> list[Item]:
    """Exactly `n` distinct items of `split` from `tiers`, deterministic in (n, seed, tiers, split).

    Items are spread as evenly over the tiers as their pools allow (a tier that runs out passes its
    share on). Raises ValueError when the tiers hold fewer than `n` items of that split.
    """
    if split not in ("train", "val"):
        raise ValueError(f"code: split must be 'train' or 'val', not {split!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"code: n must be a non-negative int, not {n!r}")
    ts = check_tiers(tiers)
    pools = {t: _pool(t, split) for t in ts}
    total = sum(len(p) for p in pools.values())
    if n > total:
        raise ValueError(f"code tiers {list(ts)} have only {total} distinct {split} items; asked for {n}")
    quota = dict.fromkeys(ts, 0)
    left, open_ = n, [t for t in ts if pools[t]]
    while left:
        share = [left // len(open_) + (1 if i < left % len(open_) else 0) for i in range(len(open_))]
        left, still = 0, []
        for t, s in zip(open_, share):
            room = min(s, len(pools[t]) - quota[t])
            quota[t] += room
            left += s - room
            if quota[t] < len(pools[t]):
                still.append(t)
        open_ = still
    items: list[Item] = []
    for t in ts:
        rng = random.Random(f"evotrainer.code:{seed}:{split}:{t}")
        items.extend(rng.sample(pools[t], quota[t]))
    random.Random(f"evotrainer.code:{seed}:{split}:order:{ts}").shuffle(items)
    return items
