"""Timing: the full health report over a store of N rollouts, and a row-by-row Python baseline.

    .venv/bin/python -m evotrainer.diagnostics.bench [--rows 1000000] [--versions 1] [--baseline-rows 20000]

The store holds `--rows` rollouts in total (split over `--versions` versions, the last diagnosed with the
others as trend evidence). The baseline computes the core version-level metrics the way a script would:
a Python loop over row dicts (the rows already in memory, so it is charged no I/O); its time on a
sample is extrapolated linearly to the full size.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import polars as pl


def python_baseline(rows: list[dict], text: bool = True) -> dict[str, float]:
    """Core metrics of the LAST version in `rows` (train split), one Python loop over the rows.

    text=False skips the completion-text metric (the report reads text only for a ~64k-row sample).
    """
    version = max(r["version"] for r in rows)
    groups: dict[str, list[float]] = defaultdict(list)
    n = trunc = fmt_n = fmt_bad = rep_n = rep_bad = 0
    lengths: list[float] = []
    lp: list[float] = []
    for r in rows:
        if r["version"] != version or r["split"] != "train":
            continue
        n += 1
        groups[r["group_id"]].append(r["reward"])
        trunc += bool(r["truncated"])
        lengths.append(float(r["n_completion_tokens"]))
        if r["mean_logprob"] is not None:
            lp.append(r["mean_logprob"])
        v = json.loads(r["verifier"]) if r["verifier"] else {}
        if "format_ok" in v:
            fmt_n += 1
            fmt_bad += not v["format_ok"]
        words = r["completion"].split() if text else ()
        if len(words) >= 8:
            rep_n += 1
            rep_bad += len(set(itertools.pairwise(words))) / (len(words) - 1) < 0.5
    stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in groups.values()]
    lengths.sort()

    def q(p: float) -> float:  # linear interpolation, as polars' "linear"
        x = p * (len(lengths) - 1)
        lo = math.floor(x)
        hi = min(lo + 1, len(lengths) - 1)
        return lengths[lo] + (lengths[hi] - lengths[lo]) * (x - lo)

    return {
        "dead_groups/dgr": sum(s < 1e-3 for s in stds) / len(stds),
        "reward_spread/spread": sum(stds) / len(stds),
        "truncation/rate": trunc / n,
        "length/p50": q(0.5),
        "length/p90": q(0.9),
        "format/violation_rate": fmt_bad / fmt_n if fmt_n else float("nan"),
        "repetition/repetitive_rate": rep_bad / rep_n if rep_n else float("nan"),
        "logprob/mean_logprob": sum(lp) / len(lp),
    }


def build_store(root: Path, rows: int, versions: int, rows_per_step: int = 4096, group_size: int = 16):
    """A store of `rows` rollouts with planted pathologies; per step a planted template is re-stamped."""
    from ..testing import planted_rollouts, temp_store

    store = temp_store(root, name="bench")
    from ..controller import next_version_spec

    per_version = rows // versions
    for vi in range(versions):
        v = f"v{vi:03d}"
        store.write_version(next_version_spec(store, vi))
        template = planted_rollouts("bench", v, steps=[1], n_groups=rows_per_step // group_size, group_size=group_size,
                                    seed=vi, dead_groups=0.3, truncation=0.1, format_fail=0.1, repetition=0.1,
                                    mean_length=80)
        for step in range(1, -(-per_version // rows_per_step) + 1):
            pre = f"{v}/train/{step:06d}/"
            part = template.with_columns(
                pl.lit(step, dtype=pl.Int32).alias("step"),
                (pl.lit("bench/" + pre) + pl.col("rollout_uid").str.split("/").list.slice(-2, 2).list.join("/"))
                .alias("rollout_uid"),
                (pl.lit(pre) + pl.col("group_id").str.split("/").list.last()).alias("group_id"),
                pl.col("mean_logprob") * (1 - 0.5 * step / per_version * rows_per_step),
            )
            store.append_rollouts(v, "train", step, part)
            if step % 50 == 0:
                store.append_metrics(v, step, {"loss": 0.01, "grad_norm": 1.0, "entropy": 1.0}, source="trl")
    return store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--versions", type=int, default=1)
    ap.add_argument("--baseline-rows", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=str, default=None, help="build (or reuse) the store here and keep it")
    args = ap.parse_args(argv)
    from ..store import Store
    from .report import health_report_for

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="diag-bench-"))
    try:
        if Store.exists(tmp / "camp"):
            store = Store.open(tmp / "camp")
        else:
            t0 = time.perf_counter()
            store = build_store(tmp / "camp", args.rows, args.versions)
            print(f"built store: {time.perf_counter() - t0:.1f}s")
        n_rows = store.rollouts().select(pl.len()).collect().item()
        last = store.versions()[-1]
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rep = health_report_for(store, last)
            times.append(time.perf_counter() - t0)
        print(f"health report over {n_rows:,} stored rollouts ({len(store.versions())} versions, diagnosing {last}): "
              f"best {min(times):.2f}s, median {statistics.median(times):.2f}s of {args.repeat}; "
              f"{len(rep.metrics)} metrics, {len(rep.findings)} findings")
        for f in rep.alerts:
            print(f"  {f.severity}: {f.diagnostic}: {f.message[:110]}")
        sample = store.rollouts(last).head(args.baseline_rows).collect().to_dicts()
        n_last = store.rollouts(last).select(pl.len()).collect().item()
        for text in (True, False):
            t0 = time.perf_counter()
            base = python_baseline(sample, text=text)
            tb = time.perf_counter() - t0
            est = tb * n_last / len(sample)
            print(f"python row-by-row baseline ({'with' if text else 'without'} the text metric): {tb:.2f}s for "
                  f"{len(sample):,} rows -> ~{est:.1f}s for the version's {n_last:,} rows (extrapolated, "
                  f"{len(base)} of the report's {len(rep.metrics)} metrics, no file reads); "
                  f"ratio ~{est / min(times):.0f}x")
        del base
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
