"""Backtests: re-score FIXED stored train rollouts under a candidate harness (counterfactual).

For each version, its stored train rollouts (optionally a step range) are run through the same
harness functions training uses (`harness.apply_harness`: rewards -> trajectory filter -> group
filter replayed in step order from a fresh state -> advantages) twice: under the baseline (by
default the version's own harness) and under the candidate. The report compares the two:

- dgr: share of groups whose reward std < 0.001; reward_spread: mean within-group std;
- groups_rescued (dead before, alive after) / groups_killed (alive before, dead after);
- advantage_sign_flips: rows with |advantage| > tol under both whose sign differs;
- order_violations: pairs (a, b) in one group where a is more correct than b but gets strictly
  less reward under the candidate. "More correct": `correct` beats not correct, and among wrong
  rollouts a larger passed/total share (when the verifier reports one) beats a smaller one.
  Pairs between a correct and a fully wrong rollout (no partial credit) are the guard rail;
- correct_wrongly_filtered: correct rollouts that carry gradient before masking under the
  candidate, that the candidate's trajectory filter masks and the baseline did not. (A group
  filter drops groups for their low spread by design, so its effect on correct rollouts is
  reported as `correct_group_filtered` in `after`, not counted here.)
- effective data before/after: share of rollouts that are unmasked and have |advantage| > tol.

Verdict: with an intervention whose success criterion names a metric the backtest measures
(a key of `after`, e.g. "dgr", "reward_spread", "effective_data"; a "layer/" prefix is ignored),
the criterion decides supports / contradicts (relative_to_parent: after - before), except that a
guard rail (a correct rollout ranked below a wrong one, or more than `correct_filter_tolerance`
of the correct rollouts with signal wrongly masked) makes it contradicts. Otherwise inconclusive,
with reasons. Everything here is off-policy evidence, never a prediction of the next version.
"""
from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Sequence

import numpy as np
import polars as pl

from .errors import EvoTrainerError
from .harness import apply_harness
from .harness.advantages import ADV_TOL, compute_advantages, effective_data_fraction, group_stats
from .harness.filters import REASON_TOO_LONG, REASON_TRUNCATED
from .harness.rewards import VERIFIER_FIELDS, MissingVerifierData, RewardContext, VerifierView, get, needed_columns
from .schema import BacktestReport, HarnessSpec, Intervention

BASE_COLUMNS = ("rollout_uid", "version", "step", "item_id", "group_id", "correct", "reward", "verifier",
                "n_completion_tokens", "truncated")
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_ALIASES = {"dead_group_ratio": "dgr", "dead_groups": "dgr", "spread": "reward_spread",
            "effective_data_fraction": "effective_data", "effective_data_ratio": "effective_data"}
_ROW_REASONS = (REASON_TRUNCATED, REASON_TOO_LONG)
MAX_PAIR_CELLS = 4_000_000  # pair matrix cells per chunk in order-violation counting


class BacktestError(EvoTrainerError):
    """A backtest cannot run on the evidence asked for."""


def backtest_id(candidate: HarnessSpec, baseline: HarnessSpec | None, versions: Sequence[str],
                steps: tuple[int, int] | None, intervention_id: str | None = None,
                max_completion_length: int | None = None) -> str:
    """Content hash of what determines the report (the intervention and the budget only when given)."""
    blob = [candidate.model_dump(mode="json"), baseline.model_dump(mode="json") if baseline else None,
            list(versions), list(steps) if steps else None]
    if intervention_id:
        blob.append(intervention_id)
    if max_completion_length:
        blob.append(int(max_completion_length))
    raw = json.dumps(blob, sort_keys=True, separators=(",", ":"))
    return "bt-" + hashlib.sha256(raw.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- pure metrics


def correctness_level(frame: pl.DataFrame, view: VerifierView | None = None) -> np.ndarray:
    """1.0 for correct rows; for wrong rows passed/total in [0, 1) where the verifier reports it, else 0."""
    correct = frame["correct"].fill_null(False).to_numpy()
    level = np.where(correct, 1.0, 0.0)
    if view is not None and view.has("passed") and view.has("total"):
        p = view.get("passed").cast(pl.Float64).to_numpy()
        t = view.get("total").cast(pl.Float64).to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where((t > 0) & np.isfinite(p), np.clip(p / t, 0.0, 1.0), 0.0)
        share = np.nan_to_num(np.minimum(share, 0.999999))
        level = np.where(correct, 1.0, share)
    return level


def group_codes(group_ids: pl.Series) -> np.ndarray:
    return group_ids.cast(pl.String).cast(pl.Categorical).to_physical().to_numpy().astype(np.int64)


def order_violations(group_ids: pl.Series | np.ndarray, level: np.ndarray, reward: np.ndarray
                     ) -> tuple[int, int, np.ndarray]:
    """Pairs (a, b) in one group with level[a] > level[b] and reward[a] < reward[b].

    `group_ids`: the group of each row (a Series, or integer codes from `group_codes`).
    Returns (all such pairs, those with level[a] == 1 and level[b] == 0, per-row bool: the row is
    the more-correct member of some violating pair). Null/NaN rewards take part in no pair."""
    n = len(level)
    if n == 0:
        return 0, 0, np.zeros(0, dtype=bool)
    codes = group_codes(group_ids) if isinstance(group_ids, pl.Series) else np.asarray(group_ids, dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    c = codes[order]
    starts = np.r_[0, np.flatnonzero(c[1:] != c[:-1]) + 1]
    sizes = np.diff(np.r_[starts, n])
    gmax = int(sizes.max())
    pos = np.arange(n) - np.repeat(starts, sizes)
    gi = np.repeat(np.arange(len(starts)), sizes)
    L = np.full((len(starts), gmax), np.nan)
    R = np.full((len(starts), gmax), np.nan)
    L[gi, pos] = level[order]
    R[gi, pos] = np.asarray(reward, dtype=np.float64)[order]
    total = full = 0
    flag_sorted = np.zeros((len(starts), gmax), dtype=bool)
    chunk = max(1, MAX_PAIR_CELLS // (gmax * gmax))
    for s in range(0, len(starts), chunk):
        la, ra = L[s:s + chunk, :, None], R[s:s + chunk, :, None]
        lb, rb = L[s:s + chunk, None, :], R[s:s + chunk, None, :]
        bad = (la > lb) & (ra < rb)
        total += int(bad.sum())
        full += int((bad & (la == 1.0) & (lb == 0.0)).sum())
        flag_sorted[s:s + chunk] = bad.any(axis=2)
    flags = np.zeros(n, dtype=bool)
    flags[order] = flag_sorted[gi, pos]
    return total, full, flags


def _reward_summary(frame: pl.DataFrame, groups: pl.DataFrame) -> dict[str, float | None]:
    r = frame["reward"].fill_nan(None)
    scored = r.drop_nulls()
    out: dict[str, float | None] = {
        "dgr": float(groups["dead"].mean()) if groups.height else None,
        "reward_spread": float(groups["std"].mean()) if groups.height else None,
        "effective_data": effective_data_fraction(frame),
        "reward_mean": float(scored.mean()) if scored.len() else None,
        "reward_std": float(scored.std()) if scored.len() > 1 else None,
        "reward_p10": float(scored.quantile(0.1)) if scored.len() else None,
        "reward_p50": float(scored.quantile(0.5)) if scored.len() else None,
        "reward_p90": float(scored.quantile(0.9)) if scored.len() else None,
        "reward_top_value_share": None,
        "reward_distinct_values": float(scored.round(9).n_unique()) if scored.len() else 0.0,
        "unscorable": float(r.null_count()),
        "filtered_share": float(frame["filtered"].mean()) if frame.height else None,
    }
    if scored.len():
        counts = scored.round(9).value_counts(sort=True)
        out["reward_top_value_share"] = float(counts["count"][0] / scored.len())
    return out


def _criterion_key(metric: str, measured: dict) -> str | None:
    name = metric.strip().lower().split("/")[-1]
    name = _ALIASES.get(name, name)
    return name if name in measured and measured[name] is not None else None


# --------------------------------------------------------------------------- the backtest


def _load(store, version: str, steps, columns: list[str]) -> pl.DataFrame:
    lf = store.rollouts(version, split="train", steps=steps)
    have = lf.collect_schema().names()
    return lf.select([c for c in columns if c in have]).collect()


def _rescore(store, version: str, candidate: HarnessSpec, baseline: HarnessSpec | None, steps,
             max_completion_length: int | None):
    vspec = store.read_version(version)
    base = baseline or vspec.harness
    mcl = max_completion_length or vspec.train.max_completion_length
    columns = list(dict.fromkeys([*BASE_COLUMNS, *needed_columns(base.rewards), *needed_columns(candidate.rewards)]))
    df = _load(store, version, steps, columns)
    if df.height == 0:
        return None
    fields = {**{f: VERIFIER_FIELDS[f] for f in ("correct", "passed", "total")}}
    for spec in (*base.rewards, *candidate.rewards):
        fields.update(get(spec.name).fields)
    stored_reward = df["reward"] if "reward" in df.columns else None
    work = df.drop("reward") if stored_reward is not None else df
    view = VerifierView(work, fields)  # decoded once, shared by both harnesses
    ctx = RewardContext(max_completion_length=mcl, view=view)
    try:
        b, _ = apply_harness(base, work, ctx)
        a, _ = apply_harness(candidate, work, ctx)
    except MissingVerifierData as exc:
        raise exc.located(f"backtest of version {version}") from exc
    a = compute_advantages(a, candidate.scale_rewards, out_col="advantage_raw", zero_filtered=False)
    level = correctness_level(work, view)
    match = None
    if stored_reward is not None and stored_reward.null_count() < stored_reward.len():
        diff = (b["reward"].fill_nan(None) - stored_reward.cast(pl.Float64).fill_nan(None)).abs()
        match = float((diff.fill_null(np.inf) <= 1e-6).mean())
    return b, a, level, match, base


def _data_selection_drop(store, candidate: HarnessSpec, baseline: HarnessSpec | None,
                         versions: Sequence[str]) -> tuple[set[str], str | None]:
    """Item ids a candidate's data selection would remove (decided from stored evidence, with the
    same `select_items` training uses); empty when the data selection does not change."""
    from .envs.base import Item
    from .harness.data import DataSelectionError, select_items

    base = baseline or store.read_version(versions[0]).harness
    spec = candidate.data_selection
    if spec == base.data_selection:
        return set(), None
    source = spec.source_version or versions[0]
    rollouts = store.rollouts(source, split="train", columns=["item_id", "correct"])
    ids = rollouts.select(pl.col("item_id").unique()).collect()["item_id"].sort().to_list()
    items = [Item(item_id=i, question="", answer="") for i in ids]
    try:
        kept, summary = select_items(spec, items, rollouts, seed=0)
    except DataSelectionError as exc:
        # The candidate would leave nothing to train on: every seen item is dropped (the verdict says so).
        return set(ids), f"data selection leaves no training items: {exc}"
    dropped = set(ids) - {i.item_id for i in kept}
    return dropped, (f"data selection removes {len(dropped)} of {len(ids)} items seen in {source} ({summary}); "
                     "their groups leave the after-view")


def run_backtest(
    store, candidate: HarnessSpec, *, versions: Sequence[str], steps: tuple[int, int] | None = None,
    baseline: HarnessSpec | None = None, intervention: Intervention | None = None,
    max_completion_length: int | None = None, correct_filter_tolerance: float = 0.05,
) -> BacktestReport:
    """Re-score the stored train rollouts of `versions` under `baseline` (default: each version's own
    harness) and `candidate`; see the module docstring for every metric. The caller stores the
    report with `store.write_backtest`."""
    versions = list(versions)
    if not versions:
        raise BacktestError("a backtest needs at least one version")
    parts_b, parts_a, levels, matches, notes = [], [], [], [], []
    empty = []
    for v in versions:
        res = _rescore(store, v, candidate, baseline, steps, max_completion_length)
        if res is None:
            empty.append(v)
            continue
        b, a, level, match, base = res
        parts_b.append(b)
        parts_a.append(a)
        levels.append(level)
        if match is not None:
            matches.append((match, b.height))
        if steps and steps[0] > 1 and "std_ema" in (base.group_filter.kind, candidate.group_filter.kind):
            notes.append(f"{v}: the std_ema filter replay starts from a fresh state at step {steps[0]}")
    if empty:
        rng = f" in steps {steps[0]}..{steps[1]}" if steps else ""
        raise BacktestError(f"no stored train rollouts for version(s) {', '.join(empty)}{rng}; "
                            "backtest versions that have trained (see `evotrainer status`)")
    b = pl.concat(parts_b, how="diagonal_relaxed")
    a = pl.concat(parts_a, how="diagonal_relaxed")
    level = np.concatenate(levels)

    dropped_items, data_note = _data_selection_drop(store, candidate, baseline, versions)
    if data_note:
        notes.append(data_note)
    # A data change removes whole items from training: their groups leave the "after" view.
    a_kept = a.filter(~pl.col("item_id").is_in(sorted(dropped_items))) if dropped_items else a
    empties_data = a_kept.height == 0
    if empties_data:
        a_kept = a  # nothing would be left to train on; keep the metrics defined, the verdict says why
    gb, ga = group_stats(b), group_stats(a_kept)
    before, after = _reward_summary(b, gb), _reward_summary(a_kept, ga)
    dead = gb.select("group_id", pl.col("dead").alias("dead_b")).join(
        ga.select("group_id", pl.col("dead").alias("dead_a")), on="group_id", how="left", maintain_order="left")
    rescued_mask = (dead["dead_b"] & ~dead["dead_a"]).fill_null(False)
    groups_rescued = int(rescued_mask.sum())
    groups_killed = int((~dead["dead_b"] & dead["dead_a"]).fill_null(False).sum())

    adv_b, adv_a = b["advantage"].to_numpy(), a["advantage"].to_numpy()
    both = (np.abs(adv_b) > ADV_TOL) & (np.abs(adv_a) > ADV_TOL)
    sign_flips = int((both & (np.sign(adv_b) != np.sign(adv_a))).sum())

    gids = group_codes(a["group_id"])
    ov_b, full_b, _ = order_violations(gids, level, b["reward"].fill_nan(None).fill_null(np.nan).to_numpy())
    ov_a, full_a, ov_rows = order_violations(gids, level, a["reward"].fill_nan(None).fill_null(np.nan).to_numpy())
    before["order_violations"], after["order_violations"] = float(ov_b), float(ov_a)
    before["order_violations_correct_vs_wrong"], after["order_violations_correct_vs_wrong"] = float(full_b), float(full_a)

    correct = a["correct"].fill_null(False).to_numpy()
    row_masked_a = a["filter_reason"].is_in(_ROW_REASONS).fill_null(False).to_numpy()
    masked_b = b["filtered"].fill_null(False).to_numpy()
    group_masked_a = a["filtered"].fill_null(False).to_numpy() & ~row_masked_a
    signal_a = np.abs(a["advantage_raw"].to_numpy()) > ADV_TOL
    wrongly = correct & signal_a & row_masked_a & ~masked_b
    n_correct_signal = int((correct & signal_a).sum())
    correct_wrongly_filtered = int(wrongly.sum())
    after["correct_wrongly_filtered_share"] = (correct_wrongly_filtered / n_correct_signal) if n_correct_signal else 0.0
    after["correct_group_filtered"] = float((correct & group_masked_a & signal_a).sum())
    if matches:
        before["stored_reward_match"] = sum(m * n for m, n in matches) / sum(n for _, n in matches)

    # Reasons and verdict.
    reasons: list[str] = []
    n_dead_b = int(gb["dead"].sum())
    reasons.append(
        f"DGR {before['dgr']:.1%} -> {after['dgr']:.1%}; {groups_rescued} of {n_dead_b} dead groups rescued, "
        f"{groups_killed} killed; reward spread {before['reward_spread']:.4f} -> {after['reward_spread']:.4f}; "
        f"effective data {before['effective_data']:.1%} -> {after['effective_data']:.1%}")
    if before.get("stored_reward_match") is not None and before["stored_reward_match"] < 0.999:
        reasons.append(f"the baseline re-scoring reproduces only {before['stored_reward_match']:.1%} of the stored "
                       "rewards: the baseline harness is not the one that trained these rollouts")
    reasons.extend(notes)
    guards: list[str] = []
    if full_a > 0:
        guards.append(f"guard rail: {full_a} pairs where a correct rollout gets less reward than a wrong one in its "
                      f"group ({ov_a} order violations in all, {ov_b} under the baseline)")
    if n_correct_signal and after["correct_wrongly_filtered_share"] > correct_filter_tolerance:
        guards.append(f"guard rail: the candidate masks {correct_wrongly_filtered} of {n_correct_signal} correct "
                      f"rollouts with signal ({after['correct_wrongly_filtered_share']:.1%} > "
                      f"{correct_filter_tolerance:.0%} tolerated)")
    if empties_data:
        guards.append("guard rail: the candidate's data selection would leave no training items at all")
    verdict = "inconclusive"
    if intervention is None:
        reasons.append("inconclusive: no intervention given, so there is no success criterion to test")
        reasons.extend(guards)
    else:
        crit = intervention.success_criterion
        key = _criterion_key(crit.metric, after)
        if key is None:
            reasons.append(f"inconclusive: the success criterion's metric {crit.metric!r} is not measured by a backtest "
                           f"(measured: {', '.join(sorted(k for k, v in after.items() if v is not None))})")
            reasons.extend(guards)
        else:
            val_b, val_a = before.get(key), after[key]
            if crit.relative_to_parent:
                if val_b is None:
                    value = None
                else:
                    value = val_a - val_b
            else:
                value = val_a
            if value is None:
                reasons.append(f"inconclusive: {key} has no baseline value to compare with")
                reasons.extend(guards)
            else:
                ok = _OPS[crit.op](value, crit.threshold)
                desc = f"criterion {crit.text()}: {key} {'delta ' if crit.relative_to_parent else ''}= {value:+.4g}"
                if guards:
                    verdict = "contradicts"
                    reasons.extend(guards)
                    reasons.append(desc + (" (met, but a guard rail failed)" if ok else " (not met)"))
                else:
                    verdict = "supports" if ok else "contradicts"
                    reasons.append(desc + (" (met)" if ok else " (not met)"))

    uids = a["rollout_uid"]
    examples: list[str] = uids.filter(pl.Series(ov_rows)).head(5).to_list()
    examples += uids.filter(pl.Series(wrongly)).head(5).to_list()
    if groups_rescued:
        rescued_groups = dead.filter(rescued_mask)["group_id"].head(3)
        examples += a.filter(pl.col("group_id").is_in(rescued_groups.implode()))["rollout_uid"].head(5).to_list()
    bid = backtest_id(candidate, baseline, versions, steps, intervention.intervention_id if intervention else None,
                      max_completion_length)
    return BacktestReport(
        backtest_id=bid, intervention_id=intervention.intervention_id if intervention else None,
        versions=tuple(versions), steps=steps, n_rollouts=a.height, n_groups=ga.height,
        before=before, after=after, groups_rescued=groups_rescued, groups_killed=groups_killed,
        advantage_sign_flips=sign_flips, order_violations=ov_a, correct_wrongly_filtered=correct_wrongly_filtered,
        effective_data_before=before["effective_data"], effective_data_after=after["effective_data"],
        verdict=verdict, reasons=tuple(reasons), example_rollouts=tuple(dict.fromkeys(examples)),
    )
