"""The paper's rules R1-R4 for single-turn domains, each a registered diagnostic that names its rule.

R1 insufficient signal   DGR > 30% and one discrete reward value > 50% of training rollouts
                         -> make the reward more continuous / add an orthogonal component.
R2 echo trap             mean completion length rising over the last 3 evaluation points (held-out evals
                         across the versions in evidence, else per-version training means) by >= 10%
                         overall, or failed rollouts >= 1.5x the overall mean length
                         -> cap completion length / mask truncated rollouts.
R3 exploration collapse  mean sampling log-prob rising >= 50% (relative, toward 0) AND diversity dropping
                         >= 10pp (distinct completions per group, or the non-repetitive share), within
                         the version (first vs last quarter of steps) or against the previous version
                         -> raise temperature / add an exploration bonus.
R4 reward hacking        training reward rising (by >= 0.05 and z >= 2) while binary correctness is flat
                         or falling (held-out Avg@k across versions when both have it, else the training
                         correct rate) -> simplify the reward. A validity rule: critical, veto=True.
"""
from __future__ import annotations

import itertools
import math

import polars as pl

from .builtins import TRAIN, _pct, _windows
from .registry import DiagnosticResult, Evidence, fnum, register


def _dgr_and_top_share(ev: Evidence) -> tuple[float | None, float | None, float | None]:
    eps = ev.th("dead_groups.std_eps")
    dgr = fnum(ev.groups().filter((pl.col("version") == ev.version) & TRAIN)
               .select((pl.col("std") < eps).mean()).collect().item())
    top = (ev.train().group_by(pl.col("reward").round(6).alias("rv")).agg(n=pl.len())
           .select(share=pl.col("n").max() / pl.col("n").sum(), value=pl.col("rv").sort_by("n").last())
           .collect())
    return dgr, fnum(top["share"][0]) if top.height else None, fnum(top["value"][0]) if top.height else None


@register("R1_insufficient_signal", dimension="results", rule="R1",
          thresholds={"dgr": 0.3, "top_share": 0.5, "critical_dgr": 0.5},
          description="R1: DGR > 30% and one discrete reward value > 50% of rollouts")
def r1(ev: Evidence) -> DiagnosticResult:
    dgr, top, value = _dgr_and_top_share(ev)
    res = DiagnosticResult(metrics={"dgr": dgr, "top_share": top})
    if dgr is None or top is None:
        return res
    fired = dgr > ev.th("R1_insufficient_signal.dgr") and top > ev.th("R1_insufficient_signal.top_share")
    res.metrics["fired"] = 1.0 if fired else 0.0
    if fired:
        sev = "critical" if dgr > ev.th("R1_insufficient_signal.critical_dgr") else "warning"
        dead = (ev.groups().filter((pl.col("version") == ev.version) & TRAIN
                                   & (pl.col("std") < ev.th("dead_groups.std_eps"))).select("group_id"))
        res.findings.append(ev.finding(
            "R1_insufficient_signal", "R1_insufficient_signal", sev,
            f"R1 insufficient signal: {_pct(dgr)} of groups are dead and reward {value:g} takes {_pct(top)} of "
            "rollouts. Intervention: make the reward more continuous (partial-credit tiers) or add an orthogonal "
            "reward component; a std-based group filter only hides the problem",
            steps=ev.step_range(), metric="dgr", value=dgr, threshold=ev.th("R1_insufficient_signal.dgr"), rule="R1",
            rollout_uids=ev.examples(ev.train().join(dead, on="group_id", how="semi"))))
    return res


def rising_run(series: pl.DataFrame, col: str, n_pts: int, current: int, min_rise: float
               ) -> tuple[float | None, pl.DataFrame | None] | None:
    """R2's trend test, shared by the single-turn (length) and multi-turn (turns) rules.

    `series` has one row per evaluation point (a `vi` version index column, in order). None when it
    has fewer than `n_pts` points or does not reach the current version; else (relative rise over the
    last `n_pts` points, those rows when they rise strictly and by at least `min_rise`, else None)."""
    if series.height < n_pts or series["vi"][-1] != current:
        return None
    tail = series.tail(n_pts)
    xs = tail[col].to_list()
    rise = (xs[-1] - xs[0]) / xs[0] if xs[0] else None
    ok = rise is not None and rise >= min_rise and all(b > a for a, b in itertools.pairwise(xs))
    return rise, (tail if ok else None)


@register("R2_echo_trap", dimension="efficiency", rule="R2",
          thresholds={"consecutive": 3, "min_rise": 0.10, "failed_ratio": 1.5},
          description="R2 (single-turn): completion length rising over 3 consecutive evaluations/versions, "
                      "or failed rollouts' length > 1.5x overall")
def r2(ev: Evidence) -> DiagnosticResult:
    n_pts = int(ev.th("R2_echo_trap.consecutive"))
    min_rise = ev.th("R2_echo_trap.min_rise")
    L = pl.col("n_completion_tokens").cast(pl.Float64)
    f = ev.features()
    evals = (f.filter(pl.col("split") == "val").group_by("vi", "version", "step").agg(length=L.mean())
             .sort("vi", "step").collect())
    vers = (f.filter(TRAIN).group_by("vi", "version").agg(length=L.mean()).sort("vi").collect())
    cur = len(ev.versions) - 1
    res = DiagnosticResult()
    rising = None
    for label, series in (("evaluations", evals), ("versions", vers)):
        run = rising_run(series, "length", n_pts, cur, min_rise)
        if run is None:
            continue
        rise, tail = run
        res.metrics[f"rise_over_{label}"] = rise
        if tail is not None and rising is None:
            ls = tail["length"].to_list()
            pts = [f"{v}" + (f"@{s}" if label == "evaluations" else "") for v, s in
                   zip(tail["version"].to_list(), tail["step"].to_list() if "step" in tail.columns else ls)]
            rising = (label, ls, pts, rise, sorted(set(tail["version"].to_list()), key=ev.versions.index))
    t = ev.train()
    overall, failed = t.select(L.mean().alias("a"), L.filter(~pl.col("correct")).mean().alias("b")).collect().row(0)
    ratio = failed / overall if failed is not None and overall else None
    res.metrics.update(failed_length_ratio=fnum(ratio), mean_length=fnum(overall))
    fr = ev.th("R2_echo_trap.failed_ratio")
    intervention = ("Intervention: cap the completion length (max_completion_length, trajectory_filter."
                    "max_completion_tokens) or mask truncated rollouts (trajectory_filter.drop_truncated)")
    if rising:
        label, ls, pts, rise, vs = rising
        res.findings.append(ev.finding(
            "R2_echo_trap", "R2_echo_trap", "warning",
            f"R2 echo trap: mean completion length rose over {len(ls)} consecutive {label} "
            f"({' -> '.join(f'{x:.0f}' for x in ls)} tokens at {', '.join(pts)}; +{_pct(rise)}). {intervention}",
            versions=vs, metric=f"rise_over_{label}", value=rise, threshold=min_rise, rule="R2",
            rollout_uids=ev.examples(t.sort("n_completion_tokens", descending=True))))
    if ratio is not None and ratio > fr:
        res.findings.append(ev.finding(
            "R2_echo_trap", "R2_echo_trap_failed_long", "warning",
            f"R2 echo trap: failed rollouts are {ratio:.2f}x as long as the average ({failed:.0f} vs {overall:.0f} "
            f"tokens, > {fr:g}x). {intervention}",
            steps=ev.step_range(), metric="failed_length_ratio", value=ratio, threshold=fr, rule="R2",
            rollout_uids=ev.examples(t.filter(~pl.col("correct")).sort("n_completion_tokens", descending=True))))
    return res


def _state(ev: Evidence, vi: int, steps: list[int] | None) -> dict[str, float | None]:
    """Mean log-prob, in-group diversity and non-repetitive share of version `vi` (optionally some steps)."""
    def sel(lf: pl.LazyFrame) -> pl.LazyFrame:
        lf = lf.filter((pl.col("vi") == vi) & TRAIN)
        return lf.filter(pl.col("step").is_in(steps)) if steps is not None else lf

    lp = sel(ev.features()).select(pl.col("mean_logprob").mean()).collect().item()
    div = sel(ev.text_groups()).select(pl.col("n_distinct").sum() / pl.col("n").sum()).collect().item()
    ratio_th = ev.th("repetition.ratio")
    nonrep = (sel(ev.text_sample()).filter(pl.col("bigram_ratio").is_not_null())
              .select((pl.col("bigram_ratio") >= ratio_th).cast(pl.Float64).mean()).collect().item())
    return {"logprob": fnum(lp), "diversity": fnum(div), "nonrepetitive": fnum(nonrep)}


@register("R3_exploration_collapse", dimension="model_state", rule="R3",
          thresholds={"logprob_rise": 0.5, "diversity_drop": 0.10},
          description="R3: mean log-prob +50% toward 0 and diversity -10pp (within the version or vs the previous)")
def r3(ev: Evidence) -> DiagnosticResult:
    cur = len(ev.versions) - 1
    has_text = "completion" in ev.schema().names()
    comparisons: list[tuple[str, dict, dict, tuple[str, ...], tuple[int, int] | None]] = []
    steps = ev.train_steps()
    if len(steps) >= 2:
        first, last = _windows(steps)
        comparisons.append(("within the version (first vs last quarter of steps)", _state(ev, cur, first),
                            _state(ev, cur, last), (ev.version,), (steps[0], steps[-1])))
    if ev.previous and ev.train_steps(ev.previous):
        comparisons.append((f"from {ev.previous} to {ev.version}", _state(ev, cur - 1, None), _state(ev, cur, None),
                            (ev.previous, ev.version), None))
    res = DiagnosticResult()
    lp_th, div_th = ev.th("R3_exploration_collapse.logprob_rise"), ev.th("R3_exploration_collapse.diversity_drop")
    for i, (label, a, b, vs, rng) in enumerate(comparisons):
        key = "within" if rng is not None else "vs_previous"
        rise = ((b["logprob"] - a["logprob"]) / abs(a["logprob"])
                if a["logprob"] not in (None, 0.0) and b["logprob"] is not None else None)
        drops = {k: a[k] - b[k] for k in ("diversity", "nonrepetitive")
                 if has_text and a[k] is not None and b[k] is not None}
        drop_key = max(drops, key=drops.get) if drops else None
        res.metrics[f"{key}/logprob_rise"] = fnum(rise)
        for k, v in drops.items():
            res.metrics[f"{key}/{k}_drop"] = fnum(v)
        if rise is None or drop_key is None or rise < lp_th or drops[drop_key] < div_th:
            continue
        sev = "critical" if b["logprob"] > ev.th("logprob.critical") else "warning"
        what = "distinct completions per group" if drop_key == "diversity" else "non-repetitive completions"
        t = ev.train()
        if rng is not None:
            t = t.filter(pl.col("step").is_in(_windows(steps)[1]))
        res.findings.append(ev.finding(
            "R3_exploration_collapse", "R3_exploration_collapse", sev,
            f"R3 exploration collapse {label}: mean log-prob {a['logprob']:.3f} -> {b['logprob']:.3f} "
            f"(+{_pct(rise)} toward 0) while {what} fell {100 * drops[drop_key]:.1f}pp "
            f"({_pct(a[drop_key])} -> {_pct(b[drop_key])}). Intervention: raise the sampling temperature or add "
            "an exploration (entropy/diversity) bonus",
            versions=vs, steps=rng, metric=f"{key}/logprob_rise", value=rise, threshold=lp_th, rule="R3",
            rollout_uids=ev.examples(t.sort("mean_logprob", descending=True))))
    return res


def _z(m1: float, v1: float, n1: int, m2: float, v2: float, n2: int) -> float:
    se = math.sqrt((v1 or 0.0) / max(n1, 1) + (v2 or 0.0) / max(n2, 1))
    return (m2 - m1) / se if se > 0 else (math.inf if m2 > m1 else 0.0)


@register("R4_reward_hacking", dimension="results", validity=True, rule="R4",
          thresholds={"reward_rise": 0.05, "z": 2.0, "bc_flat": 0.005},
          description="R4: training reward rising while binary correctness flat or falling (validity: veto)")
def r4(ev: Evidence) -> DiagnosticResult:
    res = DiagnosticResult()
    rise_th, z_th, flat = (ev.th(f"R4_reward_hacking.{k}") for k in ("reward_rise", "z", "bc_flat"))
    R, C = pl.col("reward"), pl.col("correct").cast(pl.Float64)

    def stats(lf: pl.LazyFrame) -> dict:
        return lf.select(r=R.mean(), rv=R.var(), n=pl.len(), c=C.mean()).collect().row(0, named=True)

    def avg_at_k(version: str) -> float | None:
        df = (ev.val(version).group_by("step", "item_id").agg(s=C.mean()).group_by("step").agg(a=pl.col("s").mean())
              .sort("step").collect())
        return fnum(df["a"][-1]) if df.height else None

    cases = []
    steps = ev.train_steps()
    if len(steps) >= 2:
        first, last = _windows(steps)
        a, b = stats(ev.train().filter(pl.col("step").is_in(first))), stats(ev.train().filter(pl.col("step").is_in(last)))
        cases.append(("within", f"within {ev.version} (steps {first[0]}-{first[-1]} vs {last[0]}-{last[-1]})",
                      a, b, b["c"] - a["c"] if a["c"] is not None and b["c"] is not None else None,
                      "training correct rate", (ev.version,), (steps[0], steps[-1])))
    if ev.previous and ev.train_steps(ev.previous):
        a, b = stats(ev.train(ev.previous)), stats(ev.train())
        pa, pb = avg_at_k(ev.previous), avg_at_k(ev.version)
        if pa is not None and pb is not None:
            dbc, what = pb - pa, "held-out Avg@k"
        else:
            dbc = b["c"] - a["c"] if a["c"] is not None and b["c"] is not None else None
            what = "training correct rate"
        cases.append(("vs_previous", f"from {ev.previous} to {ev.version}", a, b, dbc, what,
                      (ev.previous, ev.version), None))
    for key, label, a, b, dbc, what, vs, rng in cases:
        if a["r"] is None or b["r"] is None or dbc is None:
            continue
        dr = b["r"] - a["r"]
        z = _z(a["r"], a["rv"], a["n"], b["r"], b["rv"], b["n"])
        res.metrics.update({f"{key}/reward_delta": dr, f"{key}/reward_z": fnum(z) if math.isfinite(z) else None,
                            f"{key}/correct_delta": dbc})
        if dr >= rise_th and z >= z_th and dbc <= flat:
            t = ev.train() if rng is None else ev.train().filter(pl.col("step").is_in(_windows(steps)[1]))
            res.findings.append(ev.finding(
                "R4_reward_hacking", "R4_reward_hacking", "critical",
                f"R4 reward hacking {label}: training reward rose {dr:+.3f} ({a['r']:.3f} -> {b['r']:.3f}, z = "
                f"{z:.1f}) while {what} moved {dbc:+.3f} (flat or falling). The shaped components are being "
                "gamed; this version's score is not trustworthy (veto). Intervention: simplify the reward "
                "(remove or down-weight the shaped component)",
                versions=vs, steps=rng, metric=f"{key}/reward_delta", value=dr, threshold=rise_th, rule="R4",
                veto=True, rollout_uids=ev.examples(t.filter(~pl.col("correct")).sort("reward", descending=True))))
    return res
