"""A small built-in project for offline SWE instances (tests, demos, the swe smoke preset).

    build_toy_instances(cache_root, n=6, seed=0) -> list[SweInstance]
    build_clamp_instance(dir) -> (SweInstance, instance dir)   # one hand-written bug, for unit tests

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

from .build import base_test_command, build_from_source
from .instance import SweInstance, commit_all, git, save_instance

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


# ---------------------------------------------------------------- the smallest instance, written by hand

CLAMP_ORIGINAL = '''"""Tiny numeric helpers."""


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def add(a, b):
    return a + b
'''
CLAMP_BUGGY = CLAMP_ORIGINAL.replace("    if x < lo:\n", "    if x > lo:\n")
CLAMP_TESTS = '''from calc.ops import add, clamp


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_mid():
    assert clamp(5, 0, 10) == 5


def test_add():
    assert add(2, 3) == 5
'''


def build_clamp_instance(dir: Path, instance_id: str = "calc-000000000001") -> tuple[SweInstance, Path]:
    """One instance with a known bug (`<` flipped to `>` in clamp), in the layout build.py writes
    (commit 1 the original code, commit 2 the bug) at `dir`: fast, and every field is known to tests."""
    d = Path(dir)
    repo = d / "repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(CLAMP_ORIGINAL)
    (repo / "tests" / "test_ops.py").write_text(CLAMP_TESTS)
    git(["init", "-q", "."], repo)
    commit_all(repo, "initial import")
    (repo / "calc" / "ops.py").write_text(CLAMP_BUGGY)
    commit_all(repo, "refactor calc.ops")
    inst = SweInstance(instance_id=instance_id, project="calc", version="0.1",
                       problem_statement="tests/test_ops.py::test_clamp_low fails: clamp(-5, 0, 10) != 0",
                       fail_to_pass=("tests/test_ops.py::test_clamp_low", "tests/test_ops.py::test_clamp_mid"),
                       pass_to_pass=("tests/test_ops.py::test_add",),
                       gold_patch=git(["diff", "HEAD", "HEAD~1"], repo).stdout, mutated_file="calc/ops.py",
                       mutation="Compare: '<' -> '>' at line 6 in func clamp",
                       test_command=(*base_test_command(), "tests"), seed=0)
    save_instance(inst, d)
    return inst, d
