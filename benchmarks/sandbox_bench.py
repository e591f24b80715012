"""Sandbox overhead: sandboxed test runs per second, a trivial program, and SWE episode resets.

Baseline: plain `subprocess.run` of the same argv in the same folder with the same minimal
environment (PATH, LANG, HOME), i.e. no cgroup, namespaces, Landlock, rlimits or launcher.

    .venv/bin/python benchmarks/sandbox_bench.py [--n 10] [--trivial-n 20] [--reset-n 20] [--workers 2]

Measures:
  (a) a tiny package's pytest suite (6 fast tests) run --n times through
      `evotrainer.envs.sandbox.run_command`, sequentially and from --workers threads in parallel,
      against plain subprocess the same two ways: runs/s and the overhead ratio sandbox/plain
      (blocks in the order plain, sandbox, sandbox, plain, so a steady load drift cancels);
  (b) `python -c pass` through run_command, and `pass` through run_python (its own temp work dir,
      `python -I main.py`), against plain subprocess: ms per run and the ratio;
  (c) SWE episode reset on a tiny local instance (built like tests/test_swe_env.py's):
      `SweEpisode(...)` construction (materialize) with clear_git_log=False and =True, and
      `episode.score()` (fresh materialize + overlay + the hidden tests in the sandbox): ms each,
      mean over --reset-n repetitions.
The defaults finish in well under 2 minutes on a 2-core machine. No assertions; a run that does not
pass is reported on its line.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evotrainer.envs.sandbox import run_command, run_python
from evotrainer.envs.swe.env import SweEpisode
from evotrainer.envs.swe.instance import SweInstance
from evotrainer.envs.swe.toy import build_clamp_instance

# ---------------------------------------------------------------- (a) a tiny pytest suite

PKG = '''def clamp(x, lo, hi):
    return lo if x < lo else hi if x > hi else x


def total(xs):
    return sum(xs)
'''
SUITE = '''import pytest

from minipkg.core import clamp, total


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_mid():
    assert clamp(5, 0, 10) == 5


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_total():
    assert total([1, 2, 3]) == 6


@pytest.mark.parametrize("xs", [[], [0]])
def test_total_zero(xs):
    assert total(xs) == 0
'''
PYTEST_ARGV = [sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=.", "tests"]


def make_suite(d: Path) -> Path:
    (d / "minipkg").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "minipkg" / "__init__.py").write_text("")
    (d / "minipkg" / "core.py").write_text(PKG)
    (d / "tests" / "test_core.py").write_text(SUITE)
    return d


def plain_env(work: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(work),
            "TMPDIR": str(work)}


def run_plain(argv: list[str], work: Path) -> bool:
    r = subprocess.run(argv, cwd=work, env=plain_env(work), capture_output=True, text=True, timeout=120, check=False)
    return r.returncode == 0


def run_sandboxed(argv: list[str], work: Path) -> bool:
    return run_command(argv, workdir=work, timeout_s=120).status == "pass"


def timed(fn, argv: list[str], works: list[Path], n: int, workers: int) -> tuple[float, int]:
    """(wall seconds, failures) for n runs, round-robin over `works` (one folder per worker)."""
    t0 = time.perf_counter()
    if workers <= 1:
        oks = [fn(argv, works[0]) for _ in range(n)]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            oks = list(pool.map(lambda i: fn(argv, works[i % workers]), range(n)))
    return time.perf_counter() - t0, oks.count(False)


def abba(argv: list[str], works: list[Path], n: int, workers: int) -> tuple[float, int, float, int]:
    """(plain s, plain failures, sandbox s, sandbox failures) for n runs each, measured in the order plain,
    sandbox, sandbox, plain (n/2 runs per block) so that a steady drift in machine load cancels out."""
    a, b = n // 2, n - n // 2
    p1, pf1 = timed(run_plain, argv, works, a, workers)
    s1, sf1 = timed(run_sandboxed, argv, works, a, workers)
    s2, sf2 = timed(run_sandboxed, argv, works, b, workers)
    p2, pf2 = timed(run_plain, argv, works, b, workers)
    return p1 + p2, pf1 + pf2, s1 + s2, sf1 + sf2


def bench_suite(root: Path, n: int, workers: int) -> None:
    works = [make_suite(root / f"suite{i}") for i in range(max(1, workers))]
    probe = run_command(PYTEST_ARGV, workdir=works[0], timeout_s=120)  # warm caches; show what isolation applies
    print(f"sandbox isolation here: {', '.join(probe.isolation)}")
    if probe.warnings:
        print(f"  not applied: {len(probe.warnings)} warning(s), e.g. {probe.warnings[0][:100]}")
    run_plain(PYTEST_ARGV, works[0])
    print(f"(a) pytest suite of 6 tests, {n} runs per line:")
    for label, w in (("sequential", 1), (f"{workers} threads", workers)):
        ps, pf, ss, sf = abba(PYTEST_ARGV, works, n, w)
        note = "" if not (pf or sf) else f"  [NOT PASSING: plain {pf}, sandbox {sf} of {n}]"
        print(f"  {label:11} plain subprocess {n / ps:6.2f} runs/s ({ps / n * 1000:6.0f} ms/run); "
              f"sandbox run_command {n / ss:6.2f} runs/s ({ss / n * 1000:6.0f} ms/run); "
              f"overhead sandbox/plain {ss / ps:.2f}x{note}")


# ---------------------------------------------------------------- (b) a trivial program


def bench_trivial(root: Path, n: int) -> None:
    work = root / "trivial"
    work.mkdir()
    argv = [sys.executable, "-c", "pass"]
    run_plain(argv, work), run_sandboxed(argv, work), run_python("pass")  # warm-up
    ps, pf, ss, sf = abba(argv, [work], n, 1)
    t0 = time.perf_counter()
    rf = sum(run_python("pass").status != "pass" for _ in range(n))
    rs = time.perf_counter() - t0
    bad = "" if not (pf or sf or rf) else f"  [NOT PASSING: plain {pf}, run_command {sf}, run_python {rf} of {n}]"
    print(f"(b) `python -c pass`, {n} runs sequentially: plain subprocess {ps / n * 1000:.1f} ms/run; "
          f"sandbox run_command {ss / n * 1000:.1f} ms/run ({ss / ps:.2f}x plain); "
          f"run_python('pass') {rs / n * 1000:.1f} ms/run ({rs / ps:.2f}x plain){bad}")


# ---------------------------------------------------------------- (c) SWE episode reset

def build_instance(root: Path) -> tuple[SweInstance, Path]:
    return build_clamp_instance(root / "inst")


def bench_reset(root: Path, n: int) -> None:
    inst, d = build_instance(root / "swe")
    eps = root / "episodes"
    eps.mkdir()
    k = iter(range(1_000_000))
    times: dict[str, list[float]] = {"keep": [], "clear": [], "score": []}
    scored_ok = 0
    for _ in range(n):
        for key, clear in (("keep", False), ("clear", True)):
            t0 = time.perf_counter()
            ep = SweEpisode(inst, d, eps / f"ep{next(k)}", clear_git_log=clear)
            times[key].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        verifier, _ = ep.score()  # the buggy, untouched repo: F2P fail, P2P pass
        times["score"].append(time.perf_counter() - t0)
        scored_ok += verifier["tests_ran"]
        shutil.rmtree(eps, ignore_errors=True)
        eps.mkdir()

    def ms(xs: list[float]) -> str:
        return f"{statistics.mean(xs) * 1000:6.1f} ms (median {statistics.median(xs) * 1000:.1f})"

    print(f"(c) SWE episode reset on a tiny instance, mean over {n}:")
    print(f"  SweEpisode(..., clear_git_log=False)  materialize (copy with history)     {ms(times['keep'])}")
    print(f"  SweEpisode(..., clear_git_log=True)   copy + git init + commit             {ms(times['clear'])}")
    print(f"  episode.score()                       fresh copy + hidden tests in sandbox {ms(times['score'])}"
          + ("" if scored_ok == n else f"  [hidden tests did not run {n - scored_ok} of {n} times]"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10, help="pytest-suite runs per line of (a)")
    ap.add_argument("--trivial-n", type=int, default=20, help="runs per line of (b)")
    ap.add_argument("--reset-n", type=int, default=20, help="repetitions of (c)")
    ap.add_argument("--workers", type=int, default=2, help="threads of the parallel lines of (a)")
    args = ap.parse_args(argv)
    print(f"{os.cpu_count()} CPU cores, Python {sys.version.split()[0]}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evotrainer-sandbox-bench-") as tmp:
        root = Path(tmp)
        bench_suite(root, args.n, args.workers)
        bench_trivial(root, args.trivial_n)
        bench_reset(root, args.reset_n)
    print(f"total {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
