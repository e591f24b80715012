"""A small built-in project for offline SWE instances (tests, demos, the swe smoke preset).

    build_toy_instances(cache_root, n=6, seed=0) -> list[SweInstance]

The project (`toycalc`: a few numeric and string helpers with a pytest suite) is written to a
temporary directory and goes through the same pipeline as a real PyPI project
(`build.build_from_source`: baseline run, AST mutation sites, mutants kept when tests fail, gold
patch, two-commit template with the leaky history). Nothing is downloaded. The real instances come
from `evotrainer swe build` (PyPI sdists); these exist so that a fresh machine without them can still
run an SWE campaign end to end.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from .build import build_from_source
from .instance import SweInstance

PROJECT, VERSION = "toycalc", "1.0"

_FILES = {
    "toycalc/__init__.py": '"""Toy helpers."""\n',
    "toycalc/numbers.py": '''"""Numeric helpers."""


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def sign(x):
    """-1, 0 or 1."""
    if x > 0:
        return 1
    if x < 0:
        return -1
    return 0


def is_even(n):
    return n % 2 == 0


def mean(values):
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)


def digits(n):
    """Number of decimal digits of a non-negative integer."""
    count = 1
    while n >= 10:
        n = n // 10
        count = count + 1
    return count
''',
    "toycalc/text.py": '''"""String helpers."""


def shout(s):
    return s.upper() + "!"


def is_blank(s):
    return not s or s.isspace()


def truncate(s, width):
    """s cut to `width` characters, with an ellipsis when cut."""
    if len(s) <= width:
        return s
    return s[:width - 1] + "…"


def count_vowels(s):
    total = 0
    for ch in s.lower():
        if ch in "aeiou" and ch.isalpha():
            total = total + 1
    return total
''',
    "tests/test_numbers.py": '''from toycalc.numbers import clamp, digits, is_even, mean, sign


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(15, 0, 10) == 10


def test_clamp_mid():
    assert clamp(5, 0, 10) == 5


def test_sign():
    assert [sign(-3), sign(0), sign(7)] == [-1, 0, 1]


def test_is_even():
    assert is_even(4) and not is_even(7)


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_digits():
    assert [digits(0), digits(9), digits(10), digits(12345)] == [1, 1, 2, 5]
''',
    "tests/test_text.py": '''from toycalc.text import count_vowels, is_blank, shout, truncate


def test_shout():
    assert shout("hi") == "HI!"


def test_is_blank():
    assert is_blank("") and is_blank("  ") and not is_blank(" a ")


def test_truncate():
    assert truncate("hello", 10) == "hello"
    assert truncate("hello world", 6) == "hello…"


def test_count_vowels():
    assert count_vowels("Education") == 5
''',
}


def write_toy_project(dest: Path) -> Path:
    dest = Path(dest)
    for rel, text in _FILES.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return dest


def build_toy_instances(cache_root: Path, n: int = 6, seed: int = 0,
                        log: Callable[[str], object] = lambda _: None) -> list[SweInstance]:
    """Up to `n` instances of the toy project under cache_root/instances (same layout as real ones)."""
    with tempfile.TemporaryDirectory(prefix="evotrainer-toycalc-") as tmp:
        src = write_toy_project(Path(tmp) / f"{PROJECT}-{VERSION}")
        return build_from_source(src, PROJECT, VERSION, Path(cache_root), n, seed, log)
