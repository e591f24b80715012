"""Store throughput: append 1M synthetic rollouts, read one version filtered by step range.

Baseline: the naive store many RL scripts start with, one JSON file per rollout (written with
json.dump, read back by listing, opening and parsing every file, then filtering).

    .venv/bin/python benchmarks/store_bench.py [--rows 1000000] [--rows-per-step 1024] [--naive-rows 20000]

Prints rows/s for both and the ratios. Timings exclude building the synthetic frames.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evotrainer.testing import synthetic_rollouts, temp_store


def build_frames(campaign: str, rows: int, rows_per_step: int, group_size: int = 16) -> list[pl.DataFrame]:
    n_groups = rows_per_step // group_size
    template = synthetic_rollouts(campaign, "v000", "train", 1, n_groups, group_size, text_len=300,
                                  random_text=True)
    frames = []
    steps = -(-rows // rows_per_step)
    for step in range(1, steps + 1):
        prefix = f"{campaign}/v000/train/{step:06d}/"
        frames.append(template.with_columns(
            pl.lit(step, dtype=pl.Int32).alias("step"),
            (pl.lit(prefix) + pl.col("rollout_uid").str.split("/").list.slice(-2, 2).list.join("/")).alias("rollout_uid"),
            (pl.lit(f"v000/train/{step:06d}/") + pl.col("group_id").str.split("/").list.last()).alias("group_id"),
        ))
    return frames


def bench_store(root: Path, rows: int, rows_per_step: int) -> dict:
    store = temp_store(root, name="bench")
    frames = build_frames("bench", rows, rows_per_step)
    total = sum(f.height for f in frames)
    t0 = time.perf_counter()
    for f in frames:
        store.append_rollouts("v000", "train", int(f["step"][0]), f)
    append_s = time.perf_counter() - t0
    n_steps = len(frames)
    lo, hi = n_steps // 4, n_steps // 4 + max(1, n_steps // 10)
    t0 = time.perf_counter()
    sub = store.rollouts("v000", "train", steps=(lo, hi)).collect()
    read_range_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    agg = (store.rollouts("v000", "train", columns=["step", "reward", "correct"])
           .group_by("step").agg(pl.col("reward").mean(), pl.col("correct").mean()).collect())
    read_all_agg_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = store.rollouts("v000", "train").filter(pl.col("step").is_between(lo, hi)).collect()
    read_filter_expr_s = time.perf_counter() - t0
    assert sub.height == full.height == (hi - lo + 1) * rows_per_step and agg.height == n_steps
    disk = sum(p.stat().st_size for p in root.rglob("*.parquet"))
    return dict(rows=total, steps=n_steps, append_s=append_s, append_rows_s=total / append_s,
                range=(lo, hi), range_rows=sub.height, read_range_s=read_range_s,
                read_filter_expr_s=read_filter_expr_s, read_all_agg_s=read_all_agg_s, disk_mb=disk / 2**20)


def bench_naive(root: Path, rows: int, rows_per_step: int) -> dict:
    frames = build_frames("bench", rows, rows_per_step)
    records = [r for f in frames for r in f.to_dicts()]
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for r in records:
        with open(root / f"{r['rollout_uid'].replace('/', '_')}.json", "w") as fh:
            json.dump(r, fh)
    append_s = time.perf_counter() - t0
    n_steps = len(frames)
    lo, hi = n_steps // 4, n_steps // 4 + max(1, n_steps // 10)
    t0 = time.perf_counter()
    out = []
    for name in os.listdir(root):
        with open(root / name) as fh:
            r = json.load(fh)
        if lo <= r["step"] <= hi:
            out.append(r)
    read_s = time.perf_counter() - t0
    return dict(rows=len(records), append_s=append_s, append_rows_s=len(records) / append_s,
                read_s=read_s, read_rows_s=len(records) / read_s, range_rows=len(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rows-per-step", type=int, default=1024)
    ap.add_argument("--naive-rows", type=int, default=20_000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="evobench-"))
    try:
        s = bench_store(tmp / "store", args.rows, args.rows_per_step)
        print(f"EvoTrainer store: appended {s['rows']:,} rollouts in {s['steps']} step partitions "
              f"in {s['append_s']:.2f}s = {s['append_rows_s']:,.0f} rows/s ({s['disk_mb']:.0f} MB on disk)")
        print(f"  read one version filtered to steps {s['range'][0]}-{s['range'][1]} "
              f"({s['range_rows']:,} of {s['rows']:,} rows, all columns): {s['read_range_s']:.3f}s")
        print(f"  same through a lazy filter expression on the whole version: {s['read_filter_expr_s']:.3f}s")
        print(f"  per-step mean reward over all {s['rows']:,} rows (3 columns): {s['read_all_agg_s']:.3f}s")
        shutil.rmtree(tmp / "store")
        n = bench_naive(tmp / "naive", args.naive_rows, args.rows_per_step)
        print(f"naive baseline (one JSON file per rollout, {n['rows']:,} rows): append {n['append_rows_s']:,.0f} rows/s; "
              f"filtered read scans {n['read_rows_s']:,.0f} rows/s")
        naive_read_1m = s["rows"] / n["read_rows_s"]
        print(f"ratios: append {s['append_rows_s'] / n['append_rows_s']:.1f}x faster; filtered read of "
              f"{s['rows']:,} rows {naive_read_1m / s['read_range_s']:.0f}x faster "
              f"(naive extrapolated: {naive_read_1m:.1f}s vs {s['read_range_s']:.3f}s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
