"""Behaviour diagnostics for multi-turn tool-using (SWE) rollouts, from rollout-level columns.

Evidence carries rollouts, not turns, so these read the behaviour summary columns that
`envs.swe.env.SweEpisode.summary()` writes into each rollout row (see ROLLOUT_BEHAVIOUR_COLUMNS):
n_turns, n_tool_calls, n_edits, n_edit_failures, n_test_runs, n_terminal_calls, n_search_calls,
self_tested, search_before_edit, used_git_history, max_same_tool_streak, first_edit_turn, edited_files.

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
"""
from __future__ import annotations

import polars as pl

from .builtins import _pct
from .registry import DiagnosticResult, Evidence, fnum, register

NAMES = ("tool_calls", "edit_failures", "self_test", "search_before_edit", "turns", "tool_streak", "git_history",
         "R5_laziness")
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
