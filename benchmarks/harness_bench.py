"""Harness throughput on 1M stored rollouts: the full health report, and a reward-reweight +
StdGroupFilter backtest, each against a row-by-row Python baseline (measured on a sample and
extrapolated; the baseline is charged no file reads).

    .venv/bin/python benchmarks/harness_bench.py [--rows 1000000] [--baseline-rows 20000]

Targets (issue 3): health report <= 2 s, backtest <= 3 s on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evotrainer.backtest import run_backtest
from evotrainer.controller import next_version_spec
from evotrainer.schema import GroupFilterSpec, HarnessSpec
from evotrainer.schema import RewardComponentSpec as C


def _million(n_steps=500, n_groups=250, G=8, seed=0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = n_steps * n_groups * G
    step = np.repeat(np.arange(1, n_steps + 1), n_groups * G).astype(np.int32)
    g = np.tile(np.repeat(np.arange(n_groups), G), n_steps)
    p = rng.beta(0.5, 0.5, n_steps * n_groups).repeat(G)
    correct = rng.random(n) < p
    fmt = rng.random(n) < 0.7
    ntok = rng.integers(5, 512, n).astype(np.int32)
    tf = {True: "true", False: "false"}
    df = pl.DataFrame({"step": step, "g": g, "correct": correct, "fmt": fmt, "n_completion_tokens": ntok,
                       "truncated": ntok >= 500})
    b = lambda c: pl.when(c).then(pl.lit(tf[True])).otherwise(pl.lit(tf[False]))
    return df.with_columns(
        group_id=pl.concat_str([pl.lit("v000/train/"), pl.col("step").cast(pl.String).str.zfill(6), pl.lit("/"),
                                pl.col("g").cast(pl.String).str.zfill(4)]),
        verifier=pl.concat_str([pl.lit('{"correct": '), b(pl.col("correct")), pl.lit(', "extraction": "boxed", '
                                '"format_ok": '), b(pl.col("fmt")), pl.lit(', "gold": "12", "pred": "12"}')]),
    ).drop("g", "fmt")


def _naive(rows: list[dict], harness: HarnessSpec, max_len: int) -> tuple[list[float], list[float]]:
    """Row-by-row Python: json.loads per row, components, per-group stats, the EMA filter, advantages."""
    weights = {c.name: c.weight for c in harness.rewards}
    rewards, groups = [], {}
    for i, row in enumerate(rows):
        v = json.loads(row["verifier"])
        r = weights.get("correctness", 0) * (1.0 if v["correct"] else 0.0)
        if "format" in weights and "format_ok" in v:
            r += weights["format"] * (1.0 if v["format_ok"] else 0.0)
        if "length" in weights:
            r += weights["length"] * row["n_completion_tokens"] / max_len
        rewards.append(r)
        groups.setdefault((row["step"], row["group_id"]), []).append(i)
    spec = harness.group_filter
    z = statistics.NormalDist().inv_cdf(spec.keep_ratio)
    mu = var = 0.0
    n_seen = 0
    adv = [0.0] * len(rows)
    for (_, _), idx in sorted(groups.items()):
        rs = [rewards[i] for i in idx]
        m, s = statistics.fmean(rs), statistics.stdev(rs)
        keep = s >= spec.zero_std_eps
        if keep and spec.kind == "std_ema":
            if n_seen >= 20 and s < mu - z * math.sqrt(var):
                keep = False
            d = s - mu
            mu, var = (s, 0.0) if n_seen == 0 else (mu + spec.ema_decay * d, (1 - spec.ema_decay) * (var + spec.ema_decay * d * d))
            n_seen += 1
        for i in idx:
            adv[i] = (rewards[i] - m) / (s + 1e-4) if keep else 0.0
    return rewards, adv


def benchmark(store_root=None) -> dict[str, float]:
    from evotrainer.harness import apply_harness
    from evotrainer.harness.rewards import VERIFIER_FIELDS, RewardContext, VerifierView

    base = HarnessSpec(group_filter=GroupFilterSpec(kind="zero_std"))
    cand = HarnessSpec(rewards=base.rewards + (C(name="length", weight=-0.05),),
                       group_filter=GroupFilterSpec(kind="std_ema"))
    df = _million()
    out: dict[str, float] = {"rows": df.height}
    t0 = time.perf_counter()
    view = VerifierView(df, {f: VERIFIER_FIELDS[f] for f in ("correct", "format_ok")})
    ctx = RewardContext(max_completion_length=512, view=view)
    t1 = time.perf_counter()
    for h in (base, cand):
        apply_harness(h, df, ctx)
    t2 = time.perf_counter()
    out["decode_s"], out["score_filter_adv_both_s"], out["core_total_s"] = t1 - t0, t2 - t1, t2 - t0
    sample = df.head(20_000).to_dicts()
    t = time.perf_counter()
    for h in (base, cand):
        _naive(sample, h, 512)
    naive_20k = time.perf_counter() - t
    out["naive_20k_s"] = naive_20k
    out["naive_1m_extrapolated_s"] = naive_20k * df.height / 20_000
    out["speedup_core"] = out["naive_1m_extrapolated_s"] / out["core_total_s"]
    if store_root is not None:
        from evotrainer.testing import temp_store

        store = temp_store(store_root)
        store.write_version(next_version_spec(store, 0))
        full = df.with_columns(
            rollout_uid=pl.concat_str([pl.lit("test/"), pl.col("group_id"), pl.lit("/"),
                                       (pl.int_range(pl.len()) % 8).cast(pl.String).str.zfill(3)]),
            campaign=pl.lit("test"), version=pl.lit("v000"), split=pl.lit("train"), item_id=pl.lit("m-1"),
            sample_idx=(pl.int_range(pl.len()) % 8).cast(pl.Int32), prompt=pl.lit("p"), completion=pl.lit("c"),
            n_prompt_tokens=pl.lit(20, pl.Int32), stop_reason=pl.lit("eos"), reward=pl.lit(0.0),
            advantage=pl.lit(0.0), filtered=pl.lit(False), filter_reason=pl.lit(None, pl.String),
            mean_logprob=pl.lit(-0.5), n_turns=pl.lit(1, pl.Int32), n_tool_calls=pl.lit(0, pl.Int32))
        for (s,), part in full.group_by("step", maintain_order=True):
            store.append_rollouts("v000", "train", int(s), part)
        t = time.perf_counter()
        rep = run_backtest(store, cand, versions=["v000"], baseline=base, max_completion_length=512)
        out["backtest_1m_s"] = time.perf_counter() - t
        out["speedup_backtest"] = out["naive_1m_extrapolated_s"] / out["backtest_1m_s"]
        assert rep.n_rollouts == df.height
    return out




def backtest_bench(root: Path, rows: int, baseline_rows: int, repeat: int) -> None:
    from evotrainer.testing import temp_store

    base = HarnessSpec(group_filter=GroupFilterSpec(kind="zero_std"))
    cand = HarnessSpec(rewards=base.rewards + (C(name="length", weight=-0.05),),
                       group_filter=GroupFilterSpec(kind="std_ema"))
    n_steps = max(1, rows // 2000)
    df = _million(n_steps=n_steps)
    store = temp_store(root)
    store.write_version(next_version_spec(store, 0))
    full = df.with_columns(
        rollout_uid=pl.concat_str([pl.lit("test/"), pl.col("group_id"), pl.lit("/"),
                                   (pl.int_range(pl.len()) % 8).cast(pl.String).str.zfill(3)]),
        campaign=pl.lit("test"), version=pl.lit("v000"), split=pl.lit("train"),
        item_id=pl.concat_str([pl.lit("m-"), pl.col("group_id").str.slice(-4)]),
        sample_idx=(pl.int_range(pl.len()) % 8).cast(pl.Int32), prompt=pl.lit("p"), completion=pl.lit("c"),
        n_prompt_tokens=pl.lit(20, pl.Int32), stop_reason=pl.lit("eos"), reward=pl.lit(0.0),
        advantage=pl.lit(0.0), filtered=pl.lit(False), filter_reason=pl.lit(None, pl.String),
        mean_logprob=pl.lit(-0.5), n_turns=pl.lit(1, pl.Int32), n_tool_calls=pl.lit(0, pl.Int32))
    for (s,), part in full.group_by("step", maintain_order=True):
        store.append_rollouts("v000", "train", int(s), part)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        rep = run_backtest(store, cand, versions=["v000"], baseline=base, max_completion_length=512)
        times.append(time.perf_counter() - t)
    sample = df.head(baseline_rows).to_dicts()
    t = time.perf_counter()
    for h in (base, cand):
        _naive(sample, h, 512)
    naive = (time.perf_counter() - t) * df.height / len(sample)
    print(f"backtest (reward reweight + StdGroupFilter, baseline and candidate) over {rep.n_rollouts:,} stored "
          f"rollouts: best {min(times):.2f}s, median {statistics.median(times):.2f}s of {repeat}")
    print(f"  row-by-row Python baseline (json.loads, components, groups, EMA filter, advantages): "
          f"~{naive:.1f}s extrapolated from {len(sample):,} rows, no file reads -> ratio {naive / min(times):.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--baseline-rows", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from evotrainer.diagnostics import bench as diag_bench

    diag_bench.main(["--rows", str(args.rows), "--baseline-rows", str(args.baseline_rows),
                     "--repeat", str(args.repeat)])
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        backtest_bench(tmp / "camp", args.rows, args.baseline_rows, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
