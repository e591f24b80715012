"""Harness math: reward components, TRL-identical advantages, the StdGroupFilter, data selection."""
from __future__ import annotations

import json
import math
import statistics

import numpy as np
import polars as pl
import pytest

from evotrainer.envs.base import Item
from evotrainer.harness import apply_harness
from evotrainer.harness import rewards as R
from evotrainer.harness.advantages import (
    compute_advantages,
    effective_data_fraction,
    group_advantages,
    group_stats,
    group_std,
)
from evotrainer.harness.data import DataSelectionError, select_from_store, select_items
from evotrainer.harness.filters import (
    FilterState,
    apply_group_filter,
    apply_trajectory_filter,
    decide_groups,
    replay_group_filter,
    warmup_groups,
)
from evotrainer.schema import DataSelectionSpec, GroupFilterSpec, HarnessSpec, RewardComponentSpec, TrajectoryFilterSpec
from evotrainer.testing import synthetic_rollouts

C = RewardComponentSpec


def rows(verifiers, n_tokens=None, truncated=None):
    n = len(verifiers)
    return pl.DataFrame({
        "verifier": [v if isinstance(v, str) or v is None else json.dumps(v) for v in verifiers],
        "completion": ["x"] * n,
        "n_completion_tokens": n_tokens if n_tokens is not None else [10] * n,
        "truncated": truncated if truncated is not None else [False] * n,
    }, schema_overrides={"verifier": pl.String})


def component(name, frame, params=None, max_len=None):
    return R.get(name)(frame, params or {}, R.RewardContext(max_completion_length=max_len)).to_list()


# --------------------------------------------------------------------------- reward components


def test_correctness_and_format():
    f = rows([{"correct": True, "format_ok": True}, {"correct": False, "format_ok": False}, {"correct": False}])
    assert component("correctness", f) == [1.0, 0.0, 0.0]
    assert component("format", f) == [1.0, 0.0, None]  # no format_ok field -> not applicable


def test_correctness_tiers_math_and_code():
    f = rows([
        {"correct": True, "format_ok": True},  # 1.0
        {"correct": False, "format_ok": True},  # math: formatted but wrong -> partial
        {"correct": False, "format_ok": False},  # 0
        {"correct": False, "passed": 2, "total": 5},  # code: partial credit
        {"correct": False, "passed": 0, "total": 5, "format_ok": True},  # code with total: passed rule only
        {"correct": False, "passed": 5.0, "total": 5},  # not 0<passed<total -> zero
        {"correct": True, "passed": 5, "total": 5},
    ])
    assert component("correctness_tiers", f) == [1.0, 0.1, 0.0, 0.1, 0.0, 0.0, 1.0]
    assert component("correctness_tiers", f, {"partial": 0.3, "zero": -0.5})[:3] == [1.0, 0.3, -0.5]


def test_overlong_dapo_soft_penalty():
    # max_len 100, cache 20: 0 up to 80, linear to -1 at 100, -1 beyond and when truncated.
    f = rows([{}] * 6, n_tokens=[50, 80, 90, 100, 120, 10], truncated=[False] * 5 + [True])
    got = component("overlong", f, {"cache_tokens": 20}, max_len=100)
    assert got == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0, -1.0])
    assert component("overlong", f, {"cache_tokens": 20, "max_len": 200})[:3] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="max_completion_length"):
        component("overlong", f)


def test_length_and_judge():
    f = rows([{"judge": 0.5}, {"judge": 1.7}, {}], n_tokens=[0, 32, 64])
    assert component("length", f, max_len=64) == pytest.approx([0.0, 0.5, 1.0])
    assert component("length", f, {"scale": 2.0, "norm_tokens": 32}) == pytest.approx([0.0, 2.0, 4.0])
    assert component("judge", f) == [0.5, 1.0, None]  # clipped to [0, 1]; null when the judge did not score


def test_score_frame_weighted_nansum_and_all_null():
    f = rows([{"correct": True, "format_ok": True}, {"correct": False}, {"correct": True}])
    comps = (C(name="correctness", weight=1.0), C(name="format", weight=0.1), C(name="judge", weight=0.5))
    out = R.score_frame(comps, f)
    assert out["r.format"].to_list() == [1.0, None, None]
    assert out["reward"].to_list() == pytest.approx([1.1, 0.0, 1.0])
    # every component null -> unscorable (TRL: NaN, excluded from the baseline)
    out = R.score_frame((C(name="format"), C(name="judge")), rows([{"correct": True}, {"format_ok": False}]))
    assert out["reward"].to_list() == [None, 0.0]


def test_score_matches_score_frame_and_legacy_component_call():
    total, values = R.score(HarnessSpec().rewards, {"correct": True, "format_ok": False}, "text")
    assert total == 1.0 and values == {"correctness": 1.0, "format": 0.0}
    total, values = R.score((C(name="length", weight=-1.0),), {}, "t", n_completion_tokens=16, max_completion_length=64)
    assert total == pytest.approx(-0.25) and values == {"length": pytest.approx(0.25)}
    # transitional: get(name)(verifier_dict, completion) -> value
    assert R.get("correctness")({"correct": True}, "x") == 1.0
    assert R.get("format")({"correct": True}, "x") is None


def test_errors_unknown_component_missing_field_bad_params_bad_json():
    with pytest.raises(KeyError, match="known: .*correctness"):
        R.score_frame((C(name="nope"),), rows([{}]))
    with pytest.raises(R.MissingVerifierData) as exc:
        R.score_frame((C(name="correctness"),), rows([{"correct": True}, {"format_ok": True}, None]))
    assert exc.value.field == "correct" and exc.value.component == "correctness" and exc.value.n_missing == 2
    assert "'correct'" in str(exc.value) and "'correctness'" in str(exc.value)
    with pytest.raises(ValueError, match="no parameter"):
        R.score_frame((C(name="length", params={"scal": 1.0}),), rows([{}]))
    with pytest.raises(R.VerifierDataError, match="not JSON"):
        R.score_frame((C(name="correctness"),), rows(["{not json", '{"correct": true}']))
    with pytest.raises(R.VerifierDataError, match="not JSON"):
        R.score_frame((C(name="correctness"),), rows(['{"correct": "yes"}']))


def test_chunked_decode_equals_plain(monkeypatch):
    rng = np.random.default_rng(0)
    vs = [json.dumps({"correct": bool(a), "format_ok": bool(b)}) if a < 0.9 else "{}"
          for a, b in zip(rng.random(1000), rng.random(1000) < 0.5)]
    f = rows(vs)
    plain = R.score_frame((C(name="format", weight=0.1),), f)
    monkeypatch.setattr(R, "_DECODE_SLICE", 7)
    view = R.VerifierView(f, {"format_ok": pl.Boolean()})
    assert view.get("format_ok").to_list() == [json.loads(v).get("format_ok") for v in vs]
    chunked = R.score_frame((C(name="format", weight=0.1),), f)
    assert chunked["r.format"].to_list() == plain["r.format"].to_list()


# --------------------------------------------------------------------------- advantages (TRL 1.16 arithmetic)


def trl_reference(rewards: np.ndarray, groups: np.ndarray, scale: str) -> np.ndarray:
    """Per-group numpy transcription of TRL's sum_then_normalize branch (nanmean, nanstd N-1, eps 1e-4)."""
    def nanstd(x):
        x = x[~np.isnan(x)]
        if x.size < 2:
            return np.nan
        return float(np.sqrt(((x - x.mean()) ** 2).sum() / (x.size - 1)))

    adv = np.zeros_like(rewards)
    batch_std = nanstd(rewards)
    for g in np.unique(groups):
        m = groups == g
        r = rewards[m]
        mean = np.nanmean(r) if (~np.isnan(r)).any() else np.nan
        a = r - mean
        if scale == "group":
            a = a / (nanstd(r) + 1e-4)
        elif scale == "batch":
            a = a / (batch_std + 1e-4)
        adv[m] = np.nan_to_num(a, nan=0.0)
    return adv


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_trl_reference(scale):
    rng = np.random.default_rng(1)
    for trial in range(20):
        sizes = rng.integers(1, 9, rng.integers(1, 12))
        groups = np.repeat(np.arange(sizes.size), sizes)
        r = rng.choice([0.0, 0.1, 1.0, 1.1], groups.size) + (rng.random(groups.size) if trial % 2 else 0)
        r[rng.random(r.size) < 0.15] = np.nan  # unscorable rows
        ref = trl_reference(r, groups, scale)
        np.testing.assert_allclose(group_advantages(r, [f"g{g}" for g in groups], scale), ref, atol=1e-9)
        df = pl.DataFrame({"group_id": groups, "reward": r}).with_columns(pl.col("reward").fill_nan(None))
        got = compute_advantages(df, scale)["advantage"].to_numpy()
        np.testing.assert_allclose(got, ref, atol=1e-9)
        assert (got[np.isnan(r)] == 0).all()


def test_batch_scale_is_per_step_and_filtered_rows_get_zero():
    rng = np.random.default_rng(2)
    df = pl.DataFrame({"step": np.repeat([1, 2], 8), "group_id": np.repeat(np.arange(4), 4),
                       "reward": rng.random(16) * np.repeat([1.0, 10.0], 8)})
    got = compute_advantages(df, "batch")["advantage"].to_numpy()
    ref = np.r_[trl_reference(df["reward"].to_numpy()[:8], np.repeat([0, 1], 4), "batch"),
                trl_reference(df["reward"].to_numpy()[8:], np.repeat([2, 3], 4), "batch")]
    np.testing.assert_allclose(got, ref, atol=1e-12)
    masked = df.with_columns(filtered=pl.Series([True, False] * 8))
    out = compute_advantages(masked, "group")
    unmasked = compute_advantages(df, "group")
    assert (out.filter("filtered")["advantage"] == 0).all()
    # masking does not change the others' baseline
    np.testing.assert_allclose(out.filter(~pl.col("filtered"))["advantage"].to_numpy(),
                               unmasked.filter(~masked["filtered"])["advantage"].to_numpy())


def test_synthetic_stored_advantages_are_reproduced_and_group_stats():
    df = synthetic_rollouts("c", "v000", "train", 3, 20, 4, seed=5)
    out, _ = apply_harness(HarnessSpec(), df)
    np.testing.assert_allclose(out["reward"].to_numpy(), df["reward"].to_numpy())
    np.testing.assert_allclose(out["advantage"].to_numpy(), df["advantage"].to_numpy(), atol=1e-9)
    stats = group_stats(out)
    assert stats.height == 20 and stats["n"].to_list() == [4] * 20
    g0 = out.filter(pl.col("group_id") == stats["group_id"][0])
    assert stats["std"][0] == pytest.approx(statistics.stdev(g0["reward"].to_list()))
    assert stats["all_correct"][0] == g0["correct"].all() and stats["none_correct"][0] == (~g0["correct"]).all()
    assert stats["dead"].to_list() == (stats["std"] < 1e-3).to_list()
    stds = group_std(df["reward"].to_list(), df["group_id"].to_list())
    assert stds[stats["group_id"][0]] == pytest.approx(stats["std"][0])


# --------------------------------------------------------------------------- StdGroupFilter


def reference_std_filter(spec: GroupFilterSpec, batches: list[list[float]]):
    """Slow, literal pure-Python StdGroupFilter (see filters.py docstring for the semantics)."""
    z = statistics.NormalDist().inv_cdf(spec.keep_ratio)
    W = spec.warmup_groups if spec.warmup_groups is not None else max(20, math.ceil(1 / spec.ema_decay))
    d, eps = spec.ema_decay, spec.zero_std_eps
    mu, var, n = 0.0, 0.0, 0
    decisions = []
    for stds in batches:
        thr = mu - z * math.sqrt(var) if n >= 1 else None
        reasons, idx = [], n
        for s in stds:
            if not (s >= eps) or s == 0:
                reasons.append("zero_std")
                continue
            if idx >= W and thr is not None and s < thr:
                reasons.append("below_ema_threshold")
            else:
                reasons.append(None)
            idx += 1
        need = math.ceil(spec.min_keep * len(stds) - 1e-9) - sum(r is None for r in reasons)
        below = sorted((i for i, r in enumerate(reasons) if r == "below_ema_threshold"), key=lambda i: (-stds[i], i))
        for i in below[:max(need, 0)]:
            reasons[i] = None
        for s in stds:
            if not (s >= eps) or s == 0:
                continue
            if n == 0:
                mu, var = s, 0.0
            else:
                delta = s - mu
                mu += d * delta
                var = (1 - d) * (var + d * delta * delta)
            n += 1
        decisions.append(reasons)
    return decisions, (mu, var, n)


def groups_frame(batches: list[list[float]]) -> pl.DataFrame:
    rows_ = [(step, f"v000/train/{step:06d}/{g:04d}", s) for step, stds in enumerate(batches, 1) for g, s in enumerate(stds)]
    return pl.DataFrame(rows_, schema=["step", "group_id", "std"], orient="row")


def random_batches(rng, n_steps, lo=2, hi=12, p_dead=0.3):
    out = []
    for _ in range(n_steps):
        k = int(rng.integers(lo, hi))
        s = rng.gamma(2.0, 0.15, k)
        s[rng.random(k) < p_dead] = 0.0
        s[rng.random(k) < 0.05] = 5e-4  # below eps but not 0
        out.append(s.tolist())
    return out


SPECS = [
    GroupFilterSpec(kind="std_ema"),
    GroupFilterSpec(kind="std_ema", ema_decay=0.3, keep_ratio=0.5, min_keep=0.2, warmup_groups=3),
    GroupFilterSpec(kind="std_ema", ema_decay=0.05, keep_ratio=0.75, min_keep=0.0, warmup_groups=0),
    GroupFilterSpec(kind="std_ema", ema_decay=1.0, keep_ratio=0.6, min_keep=0.9, warmup_groups=1, zero_std_eps=0.0),
]


@pytest.mark.parametrize("spec", SPECS)
def test_std_ema_matches_reference_over_many_batches(spec):
    rng = np.random.default_rng(int(spec.content_hash(), 16) % 2**32)
    batches = random_batches(rng, 300)
    ref, (mu, var, n) = reference_std_filter(spec, batches)
    decisions, state = decide_groups(spec, groups_frame(batches))
    flat = [r for b in ref for r in b]
    assert decisions["filter_reason"].to_list() == flat
    assert decisions["keep"].to_list() == [r is None for r in flat]
    assert state.n_seen == n
    assert state.ema_mean == pytest.approx(mu, rel=1e-9, abs=1e-12)
    assert state.ema_var == pytest.approx(var, rel=1e-6, abs=1e-12)
    assert sum(r == "below_ema_threshold" for r in flat) > 0 or spec.min_keep >= 0.9


def test_step_by_step_equals_replay_and_resume_state():
    spec = GroupFilterSpec(kind="std_ema", warmup_groups=5)
    rng = np.random.default_rng(7)
    frames = []
    for step in range(1, 41):
        df = synthetic_rollouts("c", "v000", "train", step, int(rng.integers(3, 9)), 4, seed=step, p_correct=0.4)
        frames.append(df.with_columns(reward=pl.col("reward") + rng.random(df.height) * 0.3 * (rng.random() < 0.7)))
    state = FilterState()
    stepwise = []
    for df in frames:
        out, state = apply_group_filter(spec, df, state)
        stepwise.append(out)
    replay, state2 = replay_group_filter(spec, pl.concat(frames), return_state=True)
    assert pl.concat(stepwise)["filter_reason"].to_list() == replay["filter_reason"].to_list()
    assert state2.n_seen == state.n_seen
    assert state2.ema_mean == pytest.approx(state.ema_mean, rel=1e-9)
    assert state2.ema_var == pytest.approx(state.ema_var, rel=1e-6)
    assert (replay.filter("filtered")["filter_reason"].is_in(["zero_std", "below_ema_threshold"])).all()
    # resume: the state rebuilt from the first 20 stored steps continues exactly like the uninterrupted run
    _, mid = replay_group_filter(spec, pl.concat(frames[:20]), return_state=True)
    rest = replay_group_filter(spec, pl.concat(frames[20:]), mid)
    assert rest["filter_reason"].to_list() == replay.filter(pl.col("step") > 20)["filter_reason"].to_list()
    with pytest.raises(ValueError, match="one step"):
        apply_group_filter(spec, pl.concat(frames[:2]))


def test_warmup_min_keep_and_zero_std_always_dropped():
    spec = GroupFilterSpec(kind="std_ema", ema_decay=0.1, keep_ratio=0.9, min_keep=0.5)
    assert warmup_groups(spec) == 20 and warmup_groups(GroupFilterSpec(ema_decay=0.01)) == 100
    # warm-up: 20 live groups with wildly varying std are all kept; std=0 is dropped even then
    warm = [[1.0, 0.01, 0.0, 1.0, 0.01] for _ in range(5)]  # 4 live per step -> 20 live groups
    d, state = decide_groups(spec, groups_frame(warm))
    assert d.filter(pl.col("std") > 0)["keep"].all() and not d.filter(pl.col("std") == 0)["keep"].any()
    assert state.n_seen == 20
    thr = state.threshold(spec)
    assert thr == pytest.approx(state.ema_mean - 1.2815515655446004 * math.sqrt(state.ema_var))
    # a batch where the threshold drops most groups: min_keep puts back the highest-std ones, never std=0
    state = FilterState(ema_mean=1.0, ema_var=0.0001, n_seen=100)
    batch = groups_frame([[0.3, 0.0, 0.5, 0.0, 0.4, 0.2, 0.1, 0.0]])
    d, new = decide_groups(spec, batch, state)
    # all five live groups are below the threshold (~0.987); ceil(0.5 * 8) = 4 are put back by std
    assert d["keep"].to_list() == [True, False, True, False, True, True, False, False]
    assert d["filter_reason"].to_list() == [None, "zero_std", None, "zero_std", None, None,
                                            "below_ema_threshold", "zero_std"]
    assert new.n_seen == 105
    d, _ = decide_groups(spec, groups_frame([[0.3, 0.0, 0.0, 0.0]]), state)
    assert d["keep"].to_list() == [True, False, False, False]  # 2 wanted, only one live: zero-std stays dropped
    # ties are broken by group order
    d, _ = decide_groups(spec, groups_frame([[0.2, 0.2, 0.2, 0.2]]), state)
    assert d["keep"].to_list() == [True, True, False, False]


def test_zero_std_and_none_filters_and_trajectory_filter():
    df = pl.DataFrame({"step": [1] * 8, "group_id": ["a"] * 4 + ["b"] * 4,
                       "reward": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0],
                       "n_completion_tokens": [5, 50, 5, 5, 5, 70, 5, 5],
                       "truncated": [False, False, True, False, True, False, False, False]})
    out, st = apply_group_filter(GroupFilterSpec(kind="zero_std"), df)
    assert out["filter_reason"].to_list() == ["zero_std"] * 4 + [None] * 4 and st == FilterState()
    out, _ = apply_group_filter(GroupFilterSpec(kind="none"), df)
    assert not out["filtered"].any()
    tf = apply_trajectory_filter(TrajectoryFilterSpec(drop_truncated=True, max_completion_tokens=40), df)
    assert tf["filter_reason"].to_list() == [None, "too_long", "truncated", None, "truncated", "too_long", None, None]
    out, _ = apply_group_filter(GroupFilterSpec(kind="zero_std"), tf)  # row reasons survive the group filter
    assert out["filter_reason"].to_list()[:4] == ["zero_std", "too_long", "truncated", "zero_std"]
    adv = compute_advantages(out, "group")
    assert adv.filter("filtered")["advantage"].to_list() == [0.0] * 6
    assert effective_data_fraction(adv) == pytest.approx(2 / 8)  # the two unmasked rows of group b


def test_apply_harness_for_one_training_batch_with_state():
    h = HarnessSpec(group_filter=GroupFilterSpec(kind="std_ema", warmup_groups=2),
                    trajectory_filter=TrajectoryFilterSpec(drop_truncated=True))
    state = FilterState()
    for step in (1, 2, 3):
        batch = synthetic_rollouts("c", "v000", "train", step, 4, 8, seed=step)
        out, state = apply_harness(h, batch, R.RewardContext(max_completion_length=64), state)
        assert set(out.columns) >= {"r.correctness", "r.format", "reward", "filtered", "filter_reason", "advantage"}
        assert (out.filter("truncated")["filter_reason"] == "truncated").all()
        assert (out.filter("filtered")["advantage"] == 0).all()
    assert state.n_seen > 0


# --------------------------------------------------------------------------- data selection


def items(n):
    return [Item(item_id=f"i{k}", question="q", answer="1") for k in range(n)]


def evidence(rates: dict[str, list[bool]]) -> pl.DataFrame:
    return pl.DataFrame([(i, c) for i, cs in rates.items() for c in cs], schema=["item_id", "correct"], orient="row")


def test_data_selection_drops_curriculum_subsample():
    its = items(6)
    ev = evidence({"i0": [True, True], "i1": [False, False, False], "i2": [True, False], "i3": [True],
                   "i4": [True, True, True, False]})  # i5 unseen; i3 has one sample only
    kept, summary = select_items(DataSelectionSpec(drop_saturated=True, drop_unsolved=True), its, ev.lazy())
    assert [i.item_id for i in kept] == ["i2", "i3", "i4", "i5"]
    assert summary["dropped_saturated"] == 1 and summary["dropped_unsolved"] == 1 and summary["n_out"] == 4
    kept, _ = select_items(DataSelectionSpec(curriculum="easy_first"), its, ev)
    assert [i.item_id for i in kept] == ["i0", "i3", "i4", "i2", "i1", "i5"]  # stable, unseen last
    spec = DataSelectionSpec(subsample=3)
    a, s = select_items(spec, its, None, seed=1)
    b, _ = select_items(spec, its, None, seed=1)
    assert a == b and len(a) == 3 and s["dropped_subsample"] == 3
    assert [i.item_id for i in a] == sorted(i.item_id for i in a)  # keeps the original order


def test_data_selection_errors():
    ev = evidence({"i0": [True, True], "i1": [True, True]})
    with pytest.raises(DataSelectionError, match="no training items"):
        select_items(DataSelectionSpec(drop_saturated=True), items(2), ev)
    with pytest.raises(DataSelectionError, match="has none"):
        select_items(DataSelectionSpec(drop_unsolved=True), items(2), evidence({}).cast({"item_id": pl.String,
                                                                                         "correct": pl.Boolean}))
    with pytest.raises(DataSelectionError, match="rollouts"):
        select_items(DataSelectionSpec(curriculum="easy_first"), items(2), None)


def test_select_from_store(store):
    from evotrainer.controller import next_version_spec

    store.write_version(next_version_spec(store, 0))
    df = synthetic_rollouts(store.campaign.name, "v000", "train", 1, 6, 4, seed=3, p_correct=0.5)
    store.append_rollouts("v000", "train", 1, df)
    its = [Item(item_id=i, question="q", answer="1") for i in df["item_id"].unique(maintain_order=True)]
    rates = df.group_by("item_id").agg(pl.col("correct").mean())
    kept, summary = select_from_store(store, DataSelectionSpec(drop_saturated=True, drop_unsolved=True), its,
                                      parent="v000")
    expect = set(rates.filter((pl.col("correct") > 0) & (pl.col("correct") < 1))["item_id"])
    assert {i.item_id for i in kept} == expect and summary["source_version"] == "v000"
    with pytest.raises(DataSelectionError, match="no parent"):
        select_from_store(store, DataSelectionSpec(drop_saturated=True), its, parent=None)
