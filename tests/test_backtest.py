"""Backtests: counterfactual re-scoring of stored rollouts under a candidate harness.

`python tests/test_backtest.py` (or `pytest -m slow tests/test_backtest.py`) times the pipeline
on 1M rows against a naive row-by-row Python loop.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import polars as pl
import pytest

from evotrainer.backtest import BacktestError, backtest_id, order_violations, run_backtest
from evotrainer.controller import next_version_spec
from evotrainer.harness.rewards import MissingVerifierData
from evotrainer.schema import (
    GroupFilterSpec,
    HarnessSpec,
    Hypothesis,
    Intervention,
    RewardChange,
    RewardComponentSpec,
    SuccessCriterion,
    TrajectoryFilterSpec,
)
from evotrainer.testing import synthetic_rollouts

C = RewardComponentSpec
CR_ONLY = HarnessSpec(rewards=(C(name="correctness"),))


def fill(store, version_index: int, n_steps=6, n_groups=10, group_size=4, p_correct=0.2, mutate=None):
    spec = next_version_spec(store, version_index)
    store.write_version(spec)
    for step in range(1, n_steps + 1):
        df = synthetic_rollouts(store.campaign.name, spec.version, "train", step, n_groups, group_size,
                                seed=version_index, p_correct=p_correct)
        if mutate:
            df = mutate(df)
        store.append_rollouts(spec.version, "train", step, df)
    return spec.version


LENGTH = C(name="length", weight=0.01)


def intervention(metric="dgr", op="<", threshold=-0.05, relative=True, component=LENGTH):
    return Intervention(
        intervention_id="iv-test", parent="v000", change=RewardChange(op="add", component=component),
        hypothesis=Hypothesis(**{"if": "we add a length component", "then": "fewer groups are dead",
                                 "because": "length varies within a group"}),
        target_metric=metric, success_criterion=SuccessCriterion(metric=metric, op=op, threshold=threshold,
                                                                 relative_to_parent=relative),
        rollback_plan="remove the component", author="test")


def test_continuous_length_component_rescues_dead_groups(store):
    v0, v1 = fill(store, 0), fill(store, 1)
    cand = HarnessSpec(rewards=(C(name="correctness"), C(name="length", weight=0.01)))
    rep = run_backtest(store, cand, versions=[v0, v1], baseline=CR_ONLY, intervention=intervention())
    assert rep.n_rollouts == 2 * 6 * 10 * 4 and rep.n_groups == 120
    # baseline (binary CR): every all-wrong or all-right group is dead; distinct lengths revive them
    rows = store.rollouts([v0, v1], split="train").collect()
    stds = rows.group_by("group_id").agg(pl.col("correct").cast(pl.Float64).std())
    n_dead = int((stds["correct"] < 1e-3).sum())
    assert n_dead > 10 and rep.before["dgr"] == pytest.approx(n_dead / 120)
    assert rep.groups_rescued == n_dead and rep.after["dgr"] == 0.0 and rep.groups_killed == 0
    assert rep.after["reward_spread"] > rep.before["reward_spread"]
    assert rep.effective_data_after > rep.effective_data_before
    assert rep.order_violations == 0 and rep.correct_wrongly_filtered == 0
    assert rep.verdict == "supports" and any("criterion" in r for r in rep.reasons)
    assert rep.before["reward_top_value_share"] > 0.5 and rep.after["reward_distinct_values"] > 10
    assert any(u.startswith(store.campaign.name + "/") for u in rep.example_rollouts)
    assert "Counterfactual" in rep.counterfactual_note
    # the baseline re-scoring is checked against the stored rewards (synthetic rows: CR + 0.1 format)
    assert rep.before["stored_reward_match"] < 0.9 and any("not the one that trained" in r for r in rep.reasons)
    path = store.write_backtest(rep)
    assert path.exists() and store.backtests()[0].backtest_id == rep.backtest_id


def test_own_harness_is_the_default_baseline(store):
    v0 = fill(store, 0, p_correct=0.5)
    rep = run_backtest(store, store.read_version(v0).harness, versions=[v0])
    common = set(rep.before) & set(rep.after)
    assert len(common) > 10 and all(rep.before[k] == rep.after[k] for k in common)
    assert rep.before["stored_reward_match"] == 1.0  # re-scored rewards equal the stored ones
    assert rep.advantage_sign_flips == 0 and rep.groups_rescued == rep.groups_killed == 0
    assert rep.verdict == "inconclusive" and any("no intervention" in r for r in rep.reasons)


def test_large_negative_length_weight_inverts_correctness_order(store):
    v0 = fill(store, 0, p_correct=0.5)
    counts = {}
    for w in (-0.01, -0.5, -3.0):
        cand = HarnessSpec(rewards=(C(name="correctness"), C(name="length", weight=w)))
        rep = run_backtest(store, cand, versions=[v0], baseline=CR_ONLY, intervention=intervention())
        counts[w] = rep.order_violations
        # brute force: pairs in a group, a correct and b wrong, a's reward < b's reward
        rows = store.rollouts(v0, split="train").collect()
        r = rows["correct"].cast(pl.Float64) + w * rows["n_completion_tokens"] / 12  # smoke max_completion_length 12
        brute = 0
        for _, g in rows.with_columns(r=r).group_by("group_id"):
            for a, b in itertools.permutations(g.iter_rows(named=True), 2):
                brute += a["correct"] and not b["correct"] and a["r"] < b["r"]
        assert rep.order_violations == brute
        if rep.order_violations:
            assert rep.verdict == "contradicts" and any("guard rail" in x for x in rep.reasons)
    assert counts[-0.01] == 0 and 0 < counts[-0.5] < counts[-3.0]


def test_verdicts_by_criterion(store):
    v0 = fill(store, 0)
    cand = HarnessSpec(rewards=(C(name="correctness"), C(name="length", weight=0.01)))
    rep = run_backtest(store, cand, versions=[v0], baseline=CR_ONLY,
                       intervention=intervention(metric="signal/effective_data", op=">", threshold=0.5))
    assert rep.verdict == "contradicts"  # the gain is real but smaller than 0.5
    rep = run_backtest(store, cand, versions=[v0], baseline=CR_ONLY,
                       intervention=intervention(metric="dgr", op="<=", threshold=0.0, relative=False))
    assert rep.verdict == "supports"
    rep = run_backtest(store, cand, versions=[v0], baseline=CR_ONLY, intervention=intervention(metric="avg_at_k"))
    assert rep.verdict == "inconclusive" and any("not measured by a backtest" in r for r in rep.reasons)


def test_trajectory_filter_flags_correct_rollouts_it_masks(store):
    v0 = fill(store, 0, p_correct=0.5)
    cand = CR_ONLY.model_copy(update={"trajectory_filter": TrajectoryFilterSpec(drop_truncated=True)})
    rep = run_backtest(store, cand, versions=[v0], baseline=CR_ONLY,
                       intervention=intervention(metric="effective_data", op=">", threshold=-1.0))
    rows = store.rollouts(v0, split="train").collect()
    live = rows.with_columns(s=pl.col("correct").cast(pl.Float64).std().over("group_id")).filter(pl.col("s") > 0)
    expect = live.filter(pl.col("correct") & pl.col("truncated")).height
    assert expect > 0 and rep.correct_wrongly_filtered == expect
    assert rep.after["filtered_share"] == pytest.approx(rows["truncated"].mean())
    share = rep.after["correct_wrongly_filtered_share"]
    assert share > 0.05 and rep.verdict == "contradicts" and any("masks" in r for r in rep.reasons)
    lenient = run_backtest(store, cand, versions=[v0], baseline=CR_ONLY, correct_filter_tolerance=0.5,
                           intervention=intervention(metric="effective_data", op=">", threshold=-1.0))
    assert lenient.verdict == "supports"


def test_group_filter_candidate_and_backtest_id(store):
    v0 = fill(store, 0, n_steps=12, p_correct=0.5)
    cand = HarnessSpec(group_filter=GroupFilterSpec(kind="std_ema", warmup_groups=10))
    rep = run_backtest(store, cand, versions=[v0])
    assert rep.after["filtered_share"] > 0 and rep.effective_data_after < rep.effective_data_before
    assert rep.correct_wrongly_filtered == 0  # a group filter is not a row mask
    again = run_backtest(store, cand, versions=[v0])
    assert again.backtest_id == rep.backtest_id == backtest_id(cand, None, [v0], None)
    assert run_backtest(store, cand, versions=[v0], steps=(3, 12)).backtest_id != rep.backtest_id
    assert run_backtest(store, cand, versions=[v0], steps=(3, 12)).n_rollouts == 10 * 10 * 4


def test_errors_no_rollouts_and_missing_verifier_data(store):
    v0 = fill(store, 0)
    store.write_version(next_version_spec(store, 1))
    with pytest.raises(BacktestError, match="no stored train rollouts for version.*v001"):
        run_backtest(store, CR_ONLY, versions=[v0, "v001"])
    with pytest.raises(BacktestError, match="in steps 50..60"):
        run_backtest(store, CR_ONLY, versions=[v0], steps=(50, 60))

    def strip_correct(df):  # a verifier that never recorded `correct`
        return df.with_columns(verifier=pl.col("verifier").map_elements(
            lambda s: json.dumps({k: v for k, v in json.loads(s).items() if k != "correct"}), return_dtype=pl.String))

    v2 = fill(store, 2, mutate=strip_correct)
    with pytest.raises(MissingVerifierData) as exc:
        run_backtest(store, CR_ONLY, versions=[v0, v2])
    assert exc.value.field == "correct" and "v002" in str(exc.value) and "'correctness'" in str(exc.value)
    # a component that only reads format_ok works on that version
    rep = run_backtest(store, HarnessSpec(rewards=(C(name="format"),)), versions=[v2],
                       baseline=HarnessSpec(rewards=(C(name="format"),)))
    assert rep.n_rollouts == 240


def test_order_violations_brute_force():
    rng = np.random.default_rng(3)
    n = 400
    groups = pl.Series(rng.integers(0, 37, n).astype(str))
    level = rng.choice([0.0, 0.25, 0.5, 1.0], n)
    reward = rng.choice([0.0, 0.5, 1.0, np.nan], n)
    total, full, flags = order_violations(groups, level, reward)
    bt = bf = 0
    flag_ref = np.zeros(n, dtype=bool)
    g = groups.to_numpy()
    for i in range(n):
        for j in range(n):
            if g[i] == g[j] and level[i] > level[j] and reward[i] < reward[j]:
                bt += 1
                bf += level[i] == 1.0 and level[j] == 0.0
                flag_ref[i] = True
    assert (total, full) == (bt, bf) and bt > 0
    assert (flags == flag_ref).all()
