"""Behaviour diagnostics for multi-turn tool-using (SWE) rollouts, from rollout-level columns.

Evidence carries rollouts, not turns, so these read the behaviour summary columns that
`envs.swe.env.SweEpisode.summary()` writes into each rollout row (see ROLLOUT_BEHAVIOUR_COLUMNS):
n_turns, n_tool_calls, n_edits, n_edit_failures, n_test_runs, n_terminal_calls, n_search_calls,
self_tested, search_before_edit, used_git_history, max_same_tool_streak, first_edit_turn, edited_files,
edit_coverage.

A row is a behaviour row when `n_edits` is not null; a diagnostic whose columns are absent (single-turn
domains: n_turns = 1 and no n_edits) reports only {"applicable": 0.0} and no findings. The rows read are
the version's training rollouts, or its held-out rollouts when it has no training ones.

  tool_calls           tool calls per rollout, terminal/search/test shares (metrics only)
  edit_failures  R6    failed edits / edit attempts > 15% -> warning (edit format conventions)
  self_test            share of rollouts that ran tests after their last edit < 50% -> warning
  search_before_edit   share of editing rollouts that searched/read before the first edit (metrics)
  turns                turns mean/median/max: mean < 5 critical "abandonment", > 50 warning "echo trap"
  tool_streak          longest run of one tool: mean over rollouts > 10 -> warning (echo trap)
  git_history (validity)  Git% = share of rollouts that ran `git log`/`git show`; above 5% while those
                       rollouts are more often correct than the baseline (the version's rollouts without git,
                       else the previous version's correct rate, else 0) -> critical, veto: the score is
                       invalid (the fix was read from git history); above 5% without a gain -> warning
  R5_laziness    R5    vs the previous version: terminal calls per rollout -30% AND self-test rate
                       -15pp AND no correctness gain -> warning (add a behaviour-quality signal)
  edit_coverage        mean edit_coverage (share of the gold files, {mutated_file}, that the rollout's successful
                       edits touched) over the rollouts with >= 1 successful edit < 60% -> warning (localisation;
                       search-before-edit reward). Rollouts without a successful edit are left out: abandonment
                       (turns) and edit-format failures (R6) have their own diagnostics
  solution_diversity   per GRPO group (>= 2 rollouts): 1 - mean pairwise Jaccard of the edited-file sets (two
                       empty sets: Jaccard 1, identical); the metric is the mean over the version's groups. The
                       warning (< 15%) reads the groups with >= 1 incorrect rollout and >= 1 edit: a group whose
                       samples all solve makes the same (correct) edit by design, which is no exploration problem
                       (with one-file bugs its diversity is always 0), and an all-abandon group is `turns`' finding
  tool_mix             shares of the tool types edit (n_edits + n_edit_failures) / test (n_test_runs) / search
                       (n_search_calls) / terminal (n_terminal_calls) over their sum (a terminal pytest run counts
                       as test and terminal), their Shannon entropy in bits (max 2), and the edit ratio = edit
                       calls / tool calls, pooled over the rollouts with >= 1 tool call; edit ratio < 15% ->
                       warning "action timidity" (not judged on fewer than 4 such rollouts)
  R2_turns       R2    (multi-turn echo trap) failed rollouts' mean turns > 1.5x the overall mean, or mean turns
                       rising over 3 consecutive evaluation points (held-out evals across the versions, else
                       per-version training means; the same mechanism and thresholds as rules.R2_echo_trap,
                       >= 10% overall) -> warning (context management / turn cap, SweEnvSpec.turn_cap)
"""
from __future__ import annotations

import itertools
import json
import math

import polars as pl

from .builtins import _pct
from .registry import DiagnosticResult, Evidence, fnum, register
from .rules import rising_run

NAMES = ("tool_calls", "edit_failures", "self_test", "search_before_edit", "turns", "tool_streak", "git_history",
         "R5_laziness", "edit_coverage", "solution_diversity", "tool_mix", "R2_turns")
SPLIT_ORDER = ("train", "val")


def _has(ev: Evidence, cols: tuple[str, ...]) -> bool:
    names = set(ev.schema().names())
    return "n_edits" in names and all(c in names for c in cols)


def _rows(ev: Evidence, cols: tuple[str, ...], version: str | None = None) -> pl.DataFrame:
    """The version's behaviour rows (train, else val) with `cols` (+ rollout_uid, step, correct)."""
    v = version or ev.version
    want = list(dict.fromkeys(["rollout_uid", "step", "split", "correct", "n_edits", *cols]))
    df = (ev.rollouts.filter((pl.col("version") == v) & pl.col("n_edits").is_not_null())
          .select(want).collect())
    for split in SPLIT_ORDER:
        part = df.filter(pl.col("split") == split)
        if part.height:
            return part
    return df.clear()


def _skip() -> DiagnosticResult:
    return DiagnosticResult(metrics={"applicable": 0.0})


def _steps(df: pl.DataFrame) -> tuple[int, int] | None:
    return (int(df["step"].min()), int(df["step"].max())) if df.height else None


def _uids(ev: Evidence, df: pl.DataFrame) -> tuple[str, ...]:
    return ev.examples(df)


def _mean(df: pl.DataFrame, expr: pl.Expr) -> float | None:
    return fnum(df.select(expr.cast(pl.Float64).mean()).item()) if df.height else None


@register("tool_calls", dimension="behaviour",
          description="tool calls per rollout and the terminal / search / test shares of tool calls")
def tool_calls(ev: Evidence) -> DiagnosticResult:
    cols = ("n_tool_calls", "n_terminal_calls", "n_search_calls", "n_test_runs")
    if not _has(ev, cols):
        return _skip()
    df = _rows(ev, cols)
    tot = df["n_tool_calls"].sum() if df.height else 0
    share = (lambda c: fnum(df[c].sum() / tot) if tot else None)
    return DiagnosticResult(metrics={
        "applicable": 1.0, "n_rollouts": float(df.height), "tool_calls_mean": _mean(df, pl.col("n_tool_calls")),
        "terminal_share": share("n_terminal_calls"), "search_share": share("n_search_calls"),
        "test_share": share("n_test_runs"), "edit_share": fnum(df["n_edits"].sum() / tot) if tot else None})


@register("edit_failures", dimension="behaviour", rule="R6", thresholds={"warning": 0.15},
          description="R6: failed edits / edit attempts (search_replace without a unique exact match) > 15%")
def edit_failures(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("n_edit_failures",)):
        return _skip()
    df = _rows(ev, ("n_edit_failures",))
    fails, ok = int(df["n_edit_failures"].sum() or 0), int(df["n_edits"].sum() or 0)
    rate = fails / (fails + ok) if fails + ok else None
    res = DiagnosticResult(metrics={"applicable": 1.0, "edit_failure_rate": rate, "edit_attempts": float(fails + ok)})
    th = ev.th("edit_failures.warning")
    if rate is not None and rate > th:
        res.findings.append(ev.finding(
            "edit_failures", "R6_edit_failures", "warning",
            f"R6 edit failures: {_pct(rate)} of {fails + ok} edit attempts failed (> {_pct(th)}): the search text "
            "did not match exactly once. Intervention: edit format conventions (show exact-match rules and "
            "line-numbered reads in the prompt)",
            steps=_steps(df), metric="edit_failure_rate", value=rate, threshold=th, rule="R6",
            rollout_uids=_uids(ev, df.filter(pl.col("n_edit_failures") > 0))))
    return res


@register("self_test", dimension="behaviour", thresholds={"warning": 0.5},
          description="share of rollouts that ran tests after their last edit (< 50% warning)")
def self_test(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("self_tested",)):
        return _skip()
    df = _rows(ev, ("self_tested",))
    rate = _mean(df, pl.col("self_tested"))
    res = DiagnosticResult(metrics={"applicable": 1.0, "self_test_rate": rate,
                                    "self_test_rate_editing": _mean(df.filter(pl.col("n_edits") > 0),
                                                                    pl.col("self_tested"))})
    th = ev.th("self_test.warning")
    if rate is not None and rate < th:
        res.findings.append(ev.finding(
            "self_test", "low_self_test", "warning",
            f"only {_pct(rate)} of rollouts ran the tests after their last edit (< {_pct(th)}): the policy "
            "submits unverified fixes (consider an edit-then-test reward term, ETT)",
            steps=_steps(df), metric="self_test_rate", value=rate, threshold=th,
            rollout_uids=_uids(ev, df.filter(~pl.col("self_tested")))))
    return res


@register("search_before_edit", dimension="behaviour",
          description="share of editing rollouts that listed/read/grepped before the first edit")
def search_before_edit(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("search_before_edit",)):
        return _skip()
    df = _rows(ev, ("search_before_edit", "first_edit_turn")).filter(pl.col("first_edit_turn").is_not_null())
    return DiagnosticResult(metrics={"applicable": 1.0,
                                     "search_before_edit_rate": _mean(df, pl.col("search_before_edit")),
                                     "first_edit_turn_mean": _mean(df, pl.col("first_edit_turn"))})


@register("turns", dimension="efficiency", thresholds={"abandonment_critical": 5.0, "echo_warning": 50.0},
          description="turns per rollout: mean < 5 critical (abandonment), mean > 50 warning (echo trap)")
def turns(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("n_turns",)):
        return _skip()
    df = _rows(ev, ("n_turns",))
    if not df.height:
        return DiagnosticResult(metrics={"applicable": 1.0, "turns_mean": None})
    t = df["n_turns"].cast(pl.Float64)
    mean, med, mx = fnum(t.mean()), fnum(t.median()), fnum(t.max())
    failed = df.filter(~pl.col("correct"))["n_turns"].cast(pl.Float64)
    res = DiagnosticResult(metrics={"applicable": 1.0, "turns_mean": mean, "turns_median": med, "turns_max": mx,
                                    "failed_turns_mean": fnum(failed.mean()) if failed.len() else None},
                           per_step={"turns_mean": {int(s): fnum(v) for s, v in df.group_by("step").agg(
                               pl.col("n_turns").cast(pl.Float64).mean()).sort("step").iter_rows()}})
    lo, hi = ev.th("turns.abandonment_critical"), ev.th("turns.echo_warning")
    if mean is not None and mean < lo:
        res.findings.append(ev.finding(
            "turns", "abandonment", "critical",
            f"abandonment: rollouts take {mean:.1f} turns on average (< {lo:g}; median {med:g}, max {mx:g}): the "
            "policy gives up early (consider a trajectory filter masking ≤3-turn no-edit rollouts; never an "
            "efficiency reward)", steps=_steps(df), metric="turns_mean", value=mean, threshold=lo,
            rollout_uids=_uids(ev, df.sort("n_turns"))))
    elif mean is not None and mean > hi:
        res.findings.append(ev.finding(
            "turns", "echo_trap", "warning",
            f"echo trap: rollouts take {mean:.1f} turns on average (> {hi:g}; max {mx:g}): long loops of repeated "
            "calls (consider context management or a turn cap)", steps=_steps(df), metric="turns_mean", value=mean,
            threshold=hi, rollout_uids=_uids(ev, df.sort("n_turns", descending=True))))
    return res


@register("tool_streak", dimension="behaviour", thresholds={"warning": 10.0},
          description="longest run of consecutive calls of one tool; mean over rollouts > 10 warning")
def tool_streak(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("max_same_tool_streak",)):
        return _skip()
    df = _rows(ev, ("max_same_tool_streak",))
    mean = _mean(df, pl.col("max_same_tool_streak"))
    mx = fnum(df["max_same_tool_streak"].max()) if df.height else None
    res = DiagnosticResult(metrics={"applicable": 1.0, "max_streak_mean": mean, "max_streak_max": mx})
    th = ev.th("tool_streak.warning")
    if mean is not None and mean > th:
        res.findings.append(ev.finding(
            "tool_streak", "repeated_tool_calls", "warning",
            f"rollouts repeat one tool up to {mean:.1f} times in a row on average (> {th:g}; max {mx:g}): an echo "
            "trap of identical calls", steps=_steps(df), metric="max_streak_mean", value=mean, threshold=th,
            rollout_uids=_uids(ev, df.sort("max_same_tool_streak", descending=True))))
    return res


@register("git_history", dimension="behaviour", validity=True, thresholds={"git_share": 0.05, "margin": 0.0},
          description="Git%: share of rollouts running git log/show; > 5% with correctness above the baseline "
                      "is a critical validity finding (veto): the fix was read from the history")
def git_history(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("used_git_history",)):
        return _skip()
    df = _rows(ev, ("used_git_history",))
    share = _mean(df, pl.col("used_git_history"))
    users, others = df.filter(pl.col("used_git_history")), df.filter(~pl.col("used_git_history"))
    acc_users = _mean(users, pl.col("correct"))
    if others.height:
        baseline, base_from = _mean(others, pl.col("correct")), "rollouts of this version that did not read git"
    elif ev.previous is not None and _has(ev, ("used_git_history",)):
        prev = _rows(ev, ("used_git_history",), ev.previous)
        baseline, base_from = _mean(prev, pl.col("correct")), f"version {ev.previous}"
    else:
        baseline, base_from = None, None
    res = DiagnosticResult(metrics={"applicable": 1.0, "git_share": share, "correct_with_git": acc_users,
                                    "correct_baseline": baseline})
    th, margin = ev.th("git_history.git_share"), ev.th("git_history.margin")
    if share is None or share <= th:
        return res
    base = baseline if baseline is not None else 0.0
    gain = acc_users is not None and acc_users > base + margin
    if gain:
        res.findings.append(ev.finding(
            "git_history", "git_history_leak", "critical",
            f"the score is invalid: {_pct(share)} of rollouts read the git history (git log/show; > {_pct(th)}) and "
            f"those are {_pct(acc_users)} correct vs {_pct(base)} baseline ({base_from or 'none: 0'}): the fix was "
            "read from git history, not found. Intervention: environment change clear_git_log=True (one commit of "
            "the buggy state), then re-measure", steps=_steps(df), metric="git_share", value=share, threshold=th,
            veto=True, rollout_uids=_uids(ev, users)))
    else:
        res.findings.append(ev.finding(
            "git_history", "git_history_read", "warning",
            f"{_pct(share)} of rollouts read the git history (git log/show; > {_pct(th)}) without a correctness gain "
            f"({_pct(acc_users)} vs {_pct(base)}): a leak channel is open; consider clear_git_log=True",
            steps=_steps(df), metric="git_share", value=share, threshold=th, rollout_uids=_uids(ev, users)))
    return res


@register("R5_laziness", dimension="behaviour", rule="R5",
          thresholds={"terminal_drop": 0.30, "self_test_drop": 0.15},
          description="R5: vs the previous version, terminal calls per rollout -30%, self-test rate -15pp and no "
                      "correctness gain")
def r5(ev: Evidence) -> DiagnosticResult:
    cols = ("n_terminal_calls", "self_tested")
    if not _has(ev, cols):
        return _skip()
    res = DiagnosticResult(metrics={"applicable": 1.0})
    if ev.previous is None:
        return res
    cur, prev = _rows(ev, cols), _rows(ev, cols, ev.previous)
    if not cur.height or not prev.height:
        return res
    t0, t1 = _mean(prev, pl.col("n_terminal_calls")), _mean(cur, pl.col("n_terminal_calls"))
    s0, s1 = _mean(prev, pl.col("self_tested")), _mean(cur, pl.col("self_tested"))
    c0, c1 = _mean(prev, pl.col("correct")), _mean(cur, pl.col("correct"))
    tdrop = (t0 - t1) / t0 if t0 else None
    sdrop = s0 - s1
    fired = (tdrop is not None and tdrop >= ev.th("R5_laziness.terminal_drop")
             and sdrop >= ev.th("R5_laziness.self_test_drop") and c1 <= c0)
    res.metrics.update(terminal_drop=tdrop, self_test_drop=sdrop, correct_change=c1 - c0, fired=float(fired))
    if fired:
        res.findings.append(ev.finding(
            "R5_laziness", "R5_laziness", "warning",
            f"R5 laziness: vs {ev.previous}, terminal calls per rollout fell {_pct(tdrop)} ({t0:.2f} -> {t1:.2f}), "
            f"the self-test rate fell {100 * sdrop:.1f}pp ({_pct(s0)} -> {_pct(s1)}) and correctness did not rise "
            f"({_pct(c0)} -> {_pct(c1)}). Intervention: a behaviour-quality signal (search-before-edit, "
            "edit-then-test reward terms)", versions=(ev.previous, ev.version), metric="terminal_drop", value=tdrop,
            threshold=ev.th("R5_laziness.terminal_drop"), rule="R5",
            rollout_uids=_uids(ev, cur.filter(~pl.col("self_tested")))))
    return res


@register("edit_coverage", dimension="behaviour", thresholds={"warning": 0.6},
          description="mean share of the gold files (the instance's mutated_file) that a rollout's successful edits "
                      "touched, over the rollouts with an edit (< 60% warning: localisation)")
def edit_coverage(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("edit_coverage",)):
        return _skip()
    df = _rows(ev, ("edit_coverage",)).filter((pl.col("n_edits") > 0) & pl.col("edit_coverage").is_not_null())
    cov = _mean(df, pl.col("edit_coverage"))
    res = DiagnosticResult(
        metrics={"applicable": 1.0, "edit_coverage": cov, "full_coverage_rate": _mean(df, pl.col("edit_coverage") >= 1.0),
                 "n_editing": float(df.height)},
        per_step={"edit_coverage": {int(s): fnum(v) for s, v in df.group_by("step").agg(
            pl.col("edit_coverage").mean()).sort("step").iter_rows()}})
    th = ev.th("edit_coverage.warning")
    if cov is not None and cov < th:
        res.findings.append(ev.finding(
            "edit_coverage", "low_edit_coverage", "warning",
            f"edits miss the files the fix needs: the {df.height} rollouts that edited touched {_pct(cov)} of the "
            f"gold files on average (< {_pct(th)}): a localisation problem, the policy edits before finding the "
            "bug. Intervention: a search-before-edit reward term (SBE: a search/read before the first edit)",
            steps=_steps(df), metric="edit_coverage", value=cov, threshold=th,
            rollout_uids=_uids(ev, df.filter(pl.col("edit_coverage") < 1.0).sort("edit_coverage"))))
    return res


def _jaccard(a: frozenset, b: frozenset) -> float:
    return 1.0 if not a and not b else len(a & b) / len(a | b)


def _diversity(counts: dict[str, int]) -> float:
    """1 - mean pairwise Jaccard of a group's edited-file sets, given {edited_files JSON: rollouts} (n >= 2)."""
    sets = [(frozenset(json.loads(k)), c) for k, c in counts.items()]
    n = sum(c for _, c in sets)
    same = sum(c * (c - 1) / 2 for _, c in sets)  # identical sets (sorted JSON): Jaccard 1
    cross = sum(ca * cb * _jaccard(a, b) for (a, ca), (b, cb) in itertools.combinations(sets, 2))
    return 1.0 - (same + cross) / (n * (n - 1) / 2)


@register("solution_diversity", dimension="behaviour", thresholds={"warning": 0.15},
          description="1 - mean pairwise Jaccard of edited-file sets within a group; < 15% over the unsolved groups "
                      "with an edit is a warning (the samples make the same edit)")
def solution_diversity(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("edited_files",)):
        return _skip()
    df = _rows(ev, ("group_id", "edited_files")).with_columns(pl.col("edited_files").fill_null("[]"))
    per_set = df.group_by("group_id", "edited_files").agg(c=pl.len())
    groups = (df.group_by("group_id")
              .agg(step=pl.col("step").first(), n=pl.len(), unsolved=(~pl.col("correct")).any(),
                   edited=(pl.col("n_edits") > 0).any())
              .filter(pl.col("n") >= 2)
              .join(per_set.group_by("group_id").agg(pl.col("edited_files"), pl.col("c")), on="group_id")
              .sort("group_id"))
    div = [_diversity(dict(zip(f, c))) for f, c in zip(groups["edited_files"].to_list(), groups["c"].to_list())]
    groups = groups.with_columns(pl.Series("diversity", div, dtype=pl.Float64))
    alerting = groups.filter(pl.col("unsolved") & pl.col("edited"))
    d_all, d_alert = _mean(groups, pl.col("diversity")), _mean(alerting, pl.col("diversity"))
    res = DiagnosticResult(
        metrics={"applicable": 1.0, "solution_diversity": d_all, "n_groups": float(groups.height),
                 "solution_diversity_unsolved": d_alert, "n_groups_unsolved": float(alerting.height)},
        per_step={"solution_diversity": {int(s): fnum(v) for s, v in groups.group_by("step").agg(
            pl.col("diversity").mean()).sort("step").iter_rows()}})
    th = ev.th("solution_diversity.warning")
    if d_alert is not None and d_alert < th:
        same = alerting.filter(pl.col("diversity") < th).select("group_id")
        res.findings.append(ev.finding(
            "solution_diversity", "low_solution_diversity", "warning",
            f"the group's samples make the same edit: over the {alerting.height} groups not fully solved, solution "
            f"diversity (1 - mean pairwise Jaccard of edited-file sets) is {_pct(d_alert)} (< {_pct(th)}): little "
            "exploration, so a group that fails fails the same way. Intervention: raise the sampling temperature "
            "(or an exploration bonus)", steps=_steps(df), metric="solution_diversity_unsolved", value=d_alert,
            threshold=th, rollout_uids=_uids(ev, df.join(same, on="group_id", how="semi").sort("group_id"))))
    return res


_TOOL_TYPES = {"edit": pl.col("n_edits") + pl.col("n_edit_failures"), "test": pl.col("n_test_runs"),
               "search": pl.col("n_search_calls"), "terminal": pl.col("n_terminal_calls")}


@register("tool_mix", dimension="behaviour", thresholds={"edit_ratio_warning": 0.15, "min_rollouts": 4},
          description="edit / test / search / terminal shares and their entropy (bits); edit calls / tool calls "
                      "< 15% is a warning (action timidity)")
def tool_mix(ev: Evidence) -> DiagnosticResult:
    cols = ("n_tool_calls", "n_edit_failures", "n_test_runs", "n_search_calls", "n_terminal_calls")
    if not _has(ev, cols):
        return _skip()
    df = _rows(ev, cols).filter(pl.col("n_tool_calls") > 0)
    counts = df.select([e.cast(pl.Int64).sum().alias(k) for k, e in _TOOL_TYPES.items()]).row(0, named=True)
    tot, calls = sum(counts.values()), int(df["n_tool_calls"].sum() or 0)
    shares = {k: v / tot for k, v in counts.items()} if tot else {}
    entropy = -sum(p * math.log2(p) for p in shares.values() if p > 0) if tot else None
    ratio = counts["edit"] / calls if calls else None
    res = DiagnosticResult(metrics={
        "applicable": 1.0, "n_rollouts": float(df.height), **{f"share_{k}": shares.get(k) for k in _TOOL_TYPES},
        "tool_entropy_bits": fnum(entropy), "edit_ratio": ratio})
    th, min_n = ev.th("tool_mix.edit_ratio_warning"), ev.th("tool_mix.min_rollouts")
    if calls and not tot and df.height >= min_n:
        # Every call was malformed (no call, bad JSON, unknown tool): not timidity but a protocol failure.
        res.findings.append(ev.finding(
            "tool_mix", "no_valid_tool_calls", "warning",
            f"none of {calls} tool calls in {df.height} rollouts was a valid call of a tool (no call, bad JSON, "
            "unknown tool or bad arguments): the policy does not follow the tool-call format, so no episode can "
            "succeed. Teach the format first (a system prompt with an example, a format reward, or SFT on "
            "scripted trajectories) before tuning the RL harness",
            steps=_steps(df), metric="valid_tool_calls", value=0.0, threshold=1.0,
            rollout_uids=_uids(ev, df)))
    elif ratio is not None and ratio < th and df.height >= min_n:
        res.findings.append(ev.finding(
            "tool_mix", "action_timidity", "warning",
            f"action timidity: only {_pct(ratio)} of {calls} tool calls are edits (< {_pct(th)}; tool mix "
            + ", ".join(f"{k} {_pct(v)}" for k, v in shares.items())
            + (f", entropy {entropy:.2f} bits" if entropy is not None else "") + "): the policy "
            "searches and tests but rarely changes the code. Read its trajectories; reward acting (the partial "
            "tier for a changed source, SweEnvSpec.partial_needs_change) or prompt for an edit once the bug is found",
            steps=_steps(df), metric="edit_ratio", value=ratio, threshold=th,
            rollout_uids=_uids(ev, df.with_columns(r=_TOOL_TYPES["edit"] / pl.col("n_tool_calls")).sort("r"))))
    return res


@register("R2_turns", dimension="efficiency", rule="R2",
          thresholds={"consecutive": 3, "min_rise": 0.10, "failed_ratio": 1.5},
          description="R2 (multi-turn): mean turns rising over 3 consecutive evaluations/versions, or failed "
                      "rollouts' mean turns > 1.5x overall")
def r2_turns(ev: Evidence) -> DiagnosticResult:
    if not _has(ev, ("n_turns",)):
        return _skip()
    n_pts, min_rise = int(ev.th("R2_turns.consecutive")), ev.th("R2_turns.min_rise")
    T = pl.col("n_turns").cast(pl.Float64)
    vmap = {v: i for i, v in enumerate(ev.versions)}
    lf = (ev.rollouts.filter(pl.col("version").is_in(list(ev.versions)) & pl.col("n_edits").is_not_null())
          .select("version", "split", "step", "n_turns")
          .with_columns(pl.col("version").replace_strict(vmap, return_dtype=pl.Int32).alias("vi")))
    evals = (lf.filter(pl.col("split") == "val").group_by("vi", "version", "step").agg(turns=T.mean())
             .sort("vi", "step").collect())
    vers = (lf.filter(pl.col("split") == "train").group_by("vi", "version").agg(turns=T.mean())
            .with_columns(step=pl.lit(None, dtype=pl.Int64)).sort("vi").collect())
    cur = len(ev.versions) - 1
    df = _rows(ev, ("n_turns",))
    res = DiagnosticResult(metrics={"applicable": 1.0})
    intervention = ("Intervention: context management (trim or summarise old tool outputs) or a turn cap (environment "
                    "change SweEnvSpec.turn_cap)")
    for label, series in (("evaluations", evals), ("versions", vers)):
        run = rising_run(series, "turns", n_pts, cur, min_rise)
        if run is None:
            continue
        rise, tail = run
        res.metrics[f"rise_over_{label}"] = fnum(rise)
        if tail is not None and not res.findings:
            ts = tail["turns"].to_list()
            pts = [v + (f"@{s}" if s is not None else "") for v, s in zip(tail["version"], tail["step"])]
            vs = sorted(set(tail["version"].to_list()), key=ev.versions.index)
            res.findings.append(ev.finding(
                "R2_turns", "R2_turns_rising", "warning",
                f"R2 echo trap: mean turns per rollout rose over {len(ts)} consecutive {label} "
                f"({' -> '.join(f'{x:.1f}' for x in ts)} at {', '.join(pts)}; +{_pct(rise)}). {intervention}",
                versions=vs, metric=f"rise_over_{label}", value=rise, threshold=min_rise, rule="R2",
                rollout_uids=_uids(ev, df.sort("n_turns", descending=True))))
    overall, failed = _mean(df, T), _mean(df.filter(~pl.col("correct")), T)
    ratio = failed / overall if failed is not None and overall else None
    res.metrics.update(turns_mean=overall, failed_turns_mean=failed, failed_turns_ratio=fnum(ratio))
    fr = ev.th("R2_turns.failed_ratio")
    if ratio is not None and ratio > fr:
        res.findings.append(ev.finding(
            "R2_turns", "R2_turns_failed_long", "warning",
            f"R2 echo trap: failed rollouts take {ratio:.2f}x the average turns ({failed:.1f} vs {overall:.1f}, "
            f"> {fr:g}x): failing rollouts loop instead of concluding. {intervention}",
            steps=_steps(df), metric="failed_turns_ratio", value=ratio, threshold=fr, rule="R2",
            rollout_uids=_uids(ev, df.filter(~pl.col("correct")).sort("n_turns", descending=True))))
    return res
