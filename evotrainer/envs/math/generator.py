"""Seeded procedural arithmetic problems in difficulty tiers, split train/val by content hash.

Tiers:
  0  one-digit sums                       "What is 3 + 5?"
  1  two-digit addition / subtraction     "What is 47 - 19?"
  2  multiplication / mixed small ops     "What is (3 + 4) × 6?"
  3  two-step word problems
  4  multi-step word problems (3+ operations)

An item's split is a pure function of its id (``int(item_id[2:], 16) % 10 == 0`` -> val), so train
and held-out sets can never overlap, whatever seeds or sizes are asked for.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from typing import Literal

from evotrainer.envs.base import Item, distinct_in_split, split_by_hash
from evotrainer.envs.base import check_tiers as _check_tiers

Split = Literal["train", "val"]
TIERS: tuple[int, ...] = (0, 1, 2, 3, 4)
VAL_MODULUS = 10  # 1 in 10 items (by hash) is held out

# (question, answer, meta)
Problem = tuple[str, int, dict]


def make_item_id(tier: int, question: str, answer: str) -> str:
    """Short stable content hash: "m-" + 12 hex chars of sha256(tier, question, answer)."""
    h = hashlib.sha256(f"{tier}\x1f{question}\x1f{answer}".encode()).hexdigest()
    return "m-" + h[:12]


def split_of(item_id: str) -> Split:
    """Which split an item id belongs to; depends on the id alone."""
    return split_by_hash(item_id, VAL_MODULUS)  # type: ignore[return-value]


def _item(tier: int, problem: Problem) -> Item:
    question, answer, meta = problem
    ans = str(answer)
    return Item(
        item_id=make_item_id(tier, question, ans),
        question=question,
        answer=ans,
        tier=tier,
        source="generated",
        meta=dict(meta),
    )


# ---------------------------------------------------------------- small tiers: enumerated spaces


def _tier0() -> Iterator[Problem]:
    for a in range(10):
        for b in range(10):
            yield f"What is {a} + {b}?", a + b, {"kind": "add1", "ops": 1}


def _tier1() -> Iterator[Problem]:
    for a in range(10, 100):
        for b in range(10, 100):
            yield f"What is {a} + {b}?", a + b, {"kind": "add2", "ops": 1}
            if a >= b:
                yield f"What is {a} - {b}?", a - b, {"kind": "sub2", "ops": 1}


def _tier2() -> Iterator[Problem]:
    for a in range(2, 13):
        for b in range(2, 13):
            yield f"What is {a} × {b}?", a * b, {"kind": "mul", "ops": 1}
    for a in range(2, 10):
        for b in range(2, 10):
            for c in range(1, 21):
                yield f"What is {a} × {b} + {c}?", a * b + c, {"kind": "mul_add", "ops": 2}
                yield f"What is {c} + {a} × {b}?", c + a * b, {"kind": "add_mul", "ops": 2}
                if c < a * b:
                    yield f"What is {a} × {b} - {c}?", a * b - c, {"kind": "mul_sub", "ops": 2}
                if c <= 12:
                    yield f"What is ({a} + {c}) × {b}?", (a + c) * b, {"kind": "paren_mul", "ops": 2}


# ---------------------------------------------------------------- word problems: sampled

_NAMES = (
    ("Ann", "She"), ("Ben", "He"), ("Carla", "She"), ("Dev", "He"), ("Elena", "She"),
    ("Farid", "He"), ("Grace", "She"), ("Hiro", "He"), ("Ines", "She"), ("Jamal", "He"),
    ("Kofi", "He"), ("Lena", "She"), ("Marco", "He"), ("Nadia", "She"), ("Omar", "He"),
    ("Priya", "She"), ("Quinn", "He"), ("Rosa", "She"), ("Sam", "He"), ("Tara", "She"),
)
_THINGS = (
    "apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards",
    "oranges", "stamps", "beads", "candies", "balloons", "coins", "eggs", "flowers",
)


def _who(rng: random.Random) -> tuple[str, str]:
    return rng.choice(_NAMES)


def _two_people(rng: random.Random) -> tuple[tuple[str, str], tuple[str, str]]:
    p, q = rng.sample(_NAMES, 2)
    return p, q


def _t3_buy_bags(rng: random.Random) -> Problem:
    (n, pr), t = _who(rng), rng.choice(_THINGS)
    a, b, c = rng.randint(2, 40), rng.randint(2, 9), rng.randint(2, 12)
    q = (f"{n} has {a} {t}. {pr} buys {b} bags with {c} {t} in each bag. "
         f"How many {t} does {n} have now?")
    return q, a + b * c, {"kind": "buy_bags", "ops": 2}


def _t3_give_friends(rng: random.Random) -> Problem:
    (n, _), t = _who(rng), rng.choice(_THINGS)
    b, c = rng.randint(2, 9), rng.randint(2, 8)
    a = rng.randint(b * c, b * c + 40)
    q = (f"{n} has {a} {t} and gives {b} {t} to each of {c} friends. "
         f"How many {t} does {n} have left?")
    return q, a - b * c, {"kind": "give_friends", "ops": 2}


def _t3_share(rng: random.Random) -> Problem:
    (n, pr), t = _who(rng), rng.choice(_THINGS)
    c, each = rng.randint(2, 9), rng.randint(2, 12)
    total = c * each
    a = rng.randint(1, total - 1)
    q = (f"{n} has {a} {t} and finds {total - a} more. {pr} shares all of them equally "
         f"among {c} friends. How many {t} does each friend get?")
    return q, each, {"kind": "share", "ops": 2}


def _t3_boxes_eat(rng: random.Random) -> Problem:
    (n, _), t = _who(rng), rng.choice(_THINGS)
    a, b = rng.randint(3, 15), rng.randint(2, 9)
    c = rng.randint(1, a * b - 1)
    q = (f"A box holds {a} {t}. {n} fills {b} boxes and then gives away {c} {t}. "
         f"How many {t} are left in the boxes?")
    return q, a * b - c, {"kind": "boxes", "ops": 2}


def _t3_wage(rng: random.Random) -> Problem:
    (n, pr) = _who(rng)
    a, b = rng.randint(5, 25), rng.randint(2, 10)
    c = rng.randint(1, a * b - 1)
    q = (f"{n} earns {a} dollars per hour and works {b} hours. {pr} then spends {c} dollars. "
         f"How many dollars does {n} have left?")
    return q, a * b - c, {"kind": "wage", "ops": 2}


def _t4_buy_give(rng: random.Random) -> Problem:
    (n, pr), t = _who(rng), rng.choice(_THINGS)
    a, b, c = rng.randint(2, 30), rng.randint(2, 9), rng.randint(2, 12)
    d = rng.randint(1, a + b * c - 1)
    q = (f"{n} has {a} {t}. {pr} buys {b} packs of {c} {t}, then gives {d} {t} to a friend. "
         f"How many {t} does {n} have now?")
    return q, a + b * c - d, {"kind": "buy_give", "ops": 3}


def _t4_two_packs(rng: random.Random) -> Problem:
    (n, pr), t = _who(rng), rng.choice(_THINGS)
    b, c, d, e = rng.randint(2, 8), rng.randint(2, 12), rng.randint(2, 8), rng.randint(2, 12)
    f = rng.randint(1, b * c + d * e - 1)
    q = (f"{n} buys {b} packs of {c} {t} and {d} packs of {e} {t}. {pr} uses {f} of them "
         f"for a project. How many {t} are left?")
    return q, b * c + d * e - f, {"kind": "two_packs", "ops": 4}


def _t4_times_split(rng: random.Random) -> Problem:
    ((n, _), (m, _)), t = _two_people(rng), rng.choice(_THINGS)
    groups, per = rng.randint(2, 8), rng.randint(2, 15)
    k = rng.randint(2, 5)
    rest = groups * per
    a_min = rest // (k + 1) + 1  # guarantees (k + 1) * a > rest, i.e. something is given away
    a = rng.randint(a_min, a_min + 12)
    c = (k + 1) * a - rest
    q = (f"{n} has {a} {t} and {m} has {k} times as many. Together they give away {c} {t} "
         f"and split the rest equally into {groups} groups. How many {t} are in each group?")
    return q, per, {"kind": "times_split", "ops": 4}


def _t4_shop(rng: random.Random) -> Problem:
    (n, pr) = _who(rng)
    t = rng.choice(_THINGS)
    p, qn = rng.randint(2, 9), rng.randint(2, 8)
    s, r = rng.randint(1, 5), rng.randint(2, 6)
    cost = p * qn + s * r
    bill = rng.choice([x for x in (20, 50, 100, 200) if x >= cost])  # cost <= 102
    q = (f"At a shop, {t} cost {p} dollars each and bags cost {s} dollars each. {n} buys "
         f"{qn} {t} and {r} bags and pays with a {bill}-dollar bill. How much change, in dollars, "
         f"does {pr.lower()} get?")
    return q, bill - cost, {"kind": "shop_change", "ops": 4}


_SAMPLERS: dict[int, tuple[Callable[[random.Random], Problem], ...]] = {
    3: (_t3_buy_bags, _t3_give_friends, _t3_share, _t3_boxes_eat, _t3_wage),
    4: (_t4_buy_give, _t4_two_packs, _t4_times_split, _t4_shop),
}
_ENUMERATED: dict[int, Callable[[], Iterable[Problem]]] = {0: _tier0, 1: _tier1, 2: _tier2}


@cache
def _pool(tier: int, split: Split) -> tuple[Item, ...]:
    """All distinct items of an enumerated tier that fall in `split` (canonical order)."""
    return distinct_in_split((_item(tier, prob) for prob in _ENUMERATED[tier]()), split, split_of)


def check_tiers(tiers: Sequence[int]) -> tuple[int, ...]:
    return _check_tiers(tiers, TIERS, "math")


def _quotas(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def _allocate(n: int, ts: tuple[int, ...], split: Split) -> list[int]:
    """Even split of n over tiers; a small (enumerated) tier that runs out passes its surplus on."""
    cap = [len(_pool(t, split)) if t in _ENUMERATED else None for t in ts]
    total_cap = None if any(c is None for c in cap) else sum(cap)
    if total_cap is not None and n > total_cap:
        raise ValueError(
            f"math tiers {list(ts)} have only {total_cap} distinct {split} items; asked for {n} "
            f"(add tiers or ask for fewer items)"
        )
    quota = [0] * len(ts)
    open_ = list(range(len(ts)))
    left = n
    while left and open_:
        share = _quotas(left, len(open_))
        left = 0
        still = []
        for i, s_ in zip(open_, share):
            room = s_ if cap[i] is None else min(s_, cap[i] - quota[i])
            quota[i] += room
            left += s_ - room
            if cap[i] is None or quota[i] < cap[i]:
                still.append(i)
        open_ = still
    return quota


def _tier_items(tier: int, quota: int, split: Split, seed: int, taken_q: set[str]) -> list[Item]:
    rng = random.Random(f"evotrainer.math:{seed}:{split}:{tier}")
    if quota == 0:
        return []
    if tier in _ENUMERATED:
        pool = [it for it in _pool(tier, split) if it.question not in taken_q]
        if quota > len(pool):
            raise ValueError(
                f"math tier {tier} has only {len(pool)} distinct {split} items; asked for {quota} "
                f"(add tiers or ask for fewer items)"
            )
        return rng.sample(pool, quota)
    samplers = _SAMPLERS[tier]
    out: list[Item] = []
    seen: set[str] = set()
    misses, max_misses = 0, 2000 + 20 * quota
    while len(out) < quota:
        it = _item(tier, rng.choice(samplers)(rng))
        if split_of(it.item_id) != split or it.item_id in seen or it.question in taken_q:
            misses += 1
            if misses > max_misses:
                raise ValueError(
                    f"math tier {tier}: could only generate {len(out)} distinct {split} items "
                    f"of {quota} asked for"
                )
            continue
        misses = 0
        seen.add(it.item_id)
        out.append(it)
    return out


def generate_items(n: int, seed: int, tiers: Sequence[int] = (0,), split: Split = "train") -> list[Item]:
    """Exactly `n` distinct items of `split`, spread evenly over `tiers`, deterministic in (seed, tiers, n).

    Raises ValueError when the tiers cannot provide `n` distinct items of that split.
    """
    if split not in ("train", "val"):
        raise ValueError(f"math: split must be 'train' or 'val', not {split!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"math: n must be a non-negative int, not {n!r}")
    ts = check_tiers(tiers)
    items: list[Item] = []
    taken_q: set[str] = set()
    for tier, quota in zip(ts, _allocate(n, ts, split)):
        got = _tier_items(tier, quota, split, seed, taken_q)
        taken_q.update(it.question for it in got)
        items.extend(got)
    random.Random(f"evotrainer.math:{seed}:{split}:order:{ts}").shuffle(items)
    return items
