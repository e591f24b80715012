"""Built-in diagnostics for single-turn domains (PAPER-FACTS "Diagnostic dimensions and metrics").

Every threshold is the release's number where it gives one (marked "paper"), otherwise a stated
default; all are overridable through `Evidence.thresholds["<diagnostic>.<key>"]`.
Everything is polars expressions over the shared cached frames; no Python loop touches rows.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from .registry import DiagnosticResult, Evidence, fnum, per_step_dict, register

TRAIN = pl.col("split") == "train"


def _windows(steps: list[int]) -> tuple[list[int], list[int]]:
    """First and last quarter of the steps (at least one step each)."""
    k = max(1, len(steps) // 4)
    return steps[:k], steps[-k:]


def _severity(value: float | None, warning: float, critical: float | None = None, above: bool = True):
    if value is None:
        return None
    if above:
        if critical is not None and value > critical:
            return "critical", critical
        if value > warning:
            return "warning", warning
    else:
        if critical is not None and value < critical:
            return "critical", critical
        if value < warning:
            return "warning", warning
    return None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _train_groups(ev: Evidence, version: str | None = None) -> pl.LazyFrame:
    v = version or ev.version
    return ev.groups().filter((pl.col("version") == v) & TRAIN)


# --------------------------------------------------------------------------- results


@register("dead_groups", dimension="results", thresholds={"warning": 0.3, "critical": 0.5, "std_eps": 1e-3},
          description="DGR: share of train groups whose reward std (N-1) < 0.001 (paper: >30% warning, >50% critical)")
def dead_groups(ev: Evidence) -> DiagnosticResult:
    eps = ev.th("dead_groups.std_eps")
    g = _train_groups(ev).with_columns(dead=pl.col("std") < eps)
    per = (g.group_by("step").agg(dgr=pl.col("dead").mean(), n_dead=pl.col("dead").sum().cast(pl.Float64))
           .sort("step").collect())
    tot = g.select(dgr=pl.col("dead").mean(), n_groups=pl.len(), n_dead=pl.col("dead").sum()).collect().row(0)
    res = DiagnosticResult(metrics={"dgr": fnum(tot[0]), "n_groups": float(tot[1]), "n_dead": float(tot[2] or 0)},
                           per_step=per_step_dict(per))
    if per.height:
        res.metrics["dgr_max_step"] = fnum(per["dgr"].max())
    sev = _severity(res.metrics["dgr"], ev.th("dead_groups.warning"), ev.th("dead_groups.critical"))
    if sev:
        dead_ids = g.filter(pl.col("dead")).select("group_id")
        uids = ev.examples(ev.train().join(dead_ids, on="group_id", how="semi"))
        res.findings.append(ev.finding(
            "dead_groups", "dead_groups", sev[0],
            f"{_pct(res.metrics['dgr'])} of training groups are dead (reward std < {eps:g}: no GRPO signal), "
            f"{tot[2]} of {tot[1]} groups; threshold {_pct(sev[1])}",
            steps=ev.step_range(), metric="dgr", value=res.metrics["dgr"], threshold=sev[1], rollout_uids=uids))
    return res


@register("reward_spread", dimension="results", thresholds={"warning": 0.05},
          description="mean within-group reward std over train groups (paper: <0.05 warning)")
def reward_spread(ev: Evidence) -> DiagnosticResult:
    g = _train_groups(ev)
    per = g.group_by("step").agg(spread=pl.col("std").mean()).sort("step").collect()
    spread = fnum(g.select(pl.col("std").mean()).collect().item())
    res = DiagnosticResult(metrics={"spread": spread}, per_step=per_step_dict(per))
    sev = _severity(spread, ev.th("reward_spread.warning"), above=False)
    if sev:
        low = g.filter(pl.col("std") < sev[1]).select("group_id")
        res.findings.append(ev.finding(
            "reward_spread", "low_reward_spread", "warning",
            f"mean within-group reward std is {spread:.4f} (< {sev[1]:g}): groups barely separate good and bad samples",
            steps=ev.step_range(), metric="spread", value=spread, threshold=sev[1],
            rollout_uids=ev.examples(ev.train().join(low, on="group_id", how="semi"))))
    return res


@register("reward_distribution", dimension="results", thresholds={"top_share": 0.5, "max_listed": 12},
          description="share of each discrete reward value; one value > 50% of rollouts is R1's condition")
def reward_distribution(ev: Evidence) -> DiagnosticResult:
    t = ev.train().with_columns(rv=pl.col("reward").round(6))
    counts = (t.group_by("rv").agg(n=pl.len()).with_columns(share=pl.col("n") / pl.col("n").sum())
              .sort("share", "rv", descending=[True, False]).collect())
    per = (t.group_by("step").agg(bc_rate=pl.col("correct").cast(pl.Float64).mean(),
                                  reward_mean=pl.col("reward").mean()).sort("step").collect())
    bc = fnum(t.select(pl.col("correct").cast(pl.Float64).mean()).collect().item())
    res = DiagnosticResult(per_step=per_step_dict(per))
    if counts.height == 0:
        res.metrics.update(top_share=None, top_value=None, n_values=0.0, bc_rate=None)
        return res
    top_value, top_share = fnum(counts["rv"][0]), fnum(counts["share"][0])
    res.metrics.update(top_share=top_share, top_value=top_value, n_values=float(counts.height), bc_rate=bc,
                       reward_mean=fnum(t.select(pl.col("reward").mean()).collect().item()))
    if counts.height <= ev.th("reward_distribution.max_listed"):
        for rv, share in zip(counts["rv"].to_list(), counts["share"].to_list()):
            res.metrics[f"share[{'null' if rv is None else f'{rv:g}'}]"] = float(share)
    th = ev.th("reward_distribution.top_share")
    if top_share is not None and top_share > th:
        uids = ev.examples(t.filter(pl.col("rv") == top_value) if top_value is not None
                           else t.filter(pl.col("rv").is_null()))
        res.findings.append(ev.finding(
            "reward_distribution", "reward_concentrated", "info",
            f"one reward value ({top_value:g}) takes {_pct(top_share)} of training rollouts (> {_pct(th)}); "
            f"with many dead groups this is rule R1 (insufficient signal)",
            steps=ev.step_range(), metric="top_share", value=top_share, threshold=th, rollout_uids=uids))
    return res


@register("cr_flow", dimension="results", thresholds={"solved_above": 0.5, "regress_warning": 0.2},
          description="per-item correct->wrong / wrong->correct flow between consecutive evaluations "
                      "(held-out evals across the versions in evidence; train appearances if no eval)")
def cr_flow(ev: Evidence) -> DiagnosticResult:
    cur = len(ev.versions) - 1
    f = ev.features()
    has_val = ev.val().select(pl.len()).collect().item() > 0
    src = f.filter(pl.col("split") == "val") if has_val else ev.train()
    solved_above = ev.th("cr_flow.solved_above")
    pts = (src.group_by("vi", "step", "item_id").agg(score=pl.col("correct").cast(pl.Float64).mean())
           .with_columns(solved=pl.col("score") > solved_above)
           .sort("vi", "step", "item_id")
           .with_columns(prev=pl.col("solved").shift(1).over("item_id"))
           .filter((pl.col("vi") == cur) & pl.col("prev").is_not_null())
           .with_columns(regressed=pl.col("prev") & ~pl.col("solved"), improved=~pl.col("prev") & pl.col("solved")))
    per = (pts.group_by("step").agg(regressed=pl.col("regressed").sum().cast(pl.Float64),
                                    improved=pl.col("improved").sum().cast(pl.Float64),
                                    compared=pl.len().cast(pl.Float64)).sort("step").collect())
    reg, imp, n = (float(per[c].sum()) for c in ("regressed", "improved", "compared")) if per.height else (0., 0., 0.)
    rate = reg / n if n else None
    res = DiagnosticResult(
        metrics={"regressed": reg, "improved": imp, "compared": n, "net_flow": imp - reg,
                 "regressed_rate": rate, "improved_rate": imp / n if n else None,
                 "source_is_val": 1.0 if has_val else 0.0},
        per_step=per_step_dict(per))
    th = ev.th("cr_flow.regress_warning")
    if rate is not None and rate > th and reg > imp:
        items = pts.filter(pl.col("regressed")).select("vi", "step", "item_id")
        uids = ev.examples(src.filter(pl.col("vi") == cur).join(items, on=["vi", "step", "item_id"], how="semi"))
        res.findings.append(ev.finding(
            "cr_flow", "items_regressed", "warning",
            f"{int(reg)} of {int(n)} item comparisons went correct -> wrong (and only {int(imp)} wrong -> correct) "
            f"between consecutive {'evaluations' if has_val else 'training appearances'}",
            steps=(int(per["step"].min()), int(per["step"].max())), metric="regressed_rate", value=rate,
            threshold=th, rollout_uids=uids))
    return res


@register("heldout", dimension="results", description="held-out Avg@k of the version (split=val) per eval step")
def heldout(ev: Evidence) -> DiagnosticResult:
    def curve(version: str) -> pl.DataFrame:
        return (ev.val(version).group_by("step", "item_id")
                .agg(score=pl.col("correct").cast(pl.Float64).mean(), k=pl.len())
                .group_by("step").agg(avg_at_k=pl.col("score").mean(), n_items=pl.len().cast(pl.Float64),
                                      k=pl.col("k").min().cast(pl.Float64))
                .sort("step").collect())

    per = curve(ev.version)
    res = DiagnosticResult(per_step=per_step_dict(per.select("step", "avg_at_k")))
    if per.height == 0:
        res.metrics.update(avg_at_k=None, n_items=None, k=None, eval_step=None)
        res.findings.append(ev.finding("heldout", "no_heldout", "info",
                                       f"{ev.version} has no held-out evaluation rows (split=val)"))
        return res
    last = per.row(per.height - 1, named=True)
    res.metrics.update(avg_at_k=fnum(last["avg_at_k"]), n_items=last["n_items"], k=last["k"],
                       eval_step=float(last["step"]), best_avg_at_k=fnum(per["avg_at_k"].max()))
    if ev.previous:
        prev = curve(ev.previous)
        if prev.height:
            res.metrics["delta_vs_previous"] = fnum(last["avg_at_k"] - prev["avg_at_k"][-1])
    return res


# --------------------------------------------------------------------------- efficiency


@register("truncation", dimension="efficiency", thresholds={"warning": 0.15},
          description="share of rollouts cut at the token limit (paper: >15% warning)")
def truncation(ev: Evidence) -> DiagnosticResult:
    t = ev.train()
    per = t.group_by("step").agg(rate=pl.col("truncated").cast(pl.Float64).mean()).sort("step").collect()
    rate = fnum(t.select(pl.col("truncated").cast(pl.Float64).mean()).collect().item())
    val_rate = fnum(ev.val().select(pl.col("truncated").cast(pl.Float64).mean()).collect().item())
    res = DiagnosticResult(metrics={"rate": rate, "val_rate": val_rate}, per_step=per_step_dict(per))
    sev = _severity(rate, ev.th("truncation.warning"))
    if sev:
        res.findings.append(ev.finding(
            "truncation", "truncation", "warning",
            f"{_pct(rate)} of training rollouts were truncated at the token limit (> {_pct(sev[1])}): "
            "raise max_completion_length or mask truncated rollouts",
            steps=ev.step_range(), metric="rate", value=rate, threshold=sev[1],
            rollout_uids=ev.examples(t.filter(pl.col("truncated")))))
    return res


@register("length", dimension="efficiency", thresholds={"gaming_corr": 0.3},
          description="completion tokens P50/P90 and length-correctness correlation (paper, math: >0.3 length gaming)")
def length(ev: Evidence) -> DiagnosticResult:
    t = ev.train()
    L = pl.col("n_completion_tokens").cast(pl.Float64)
    per = (t.group_by("step").agg(mean=L.mean(), p50=L.quantile(0.5, "linear"), p90=L.quantile(0.9, "linear"))
           .sort("step").collect())
    row = t.select(p50=L.quantile(0.5, "linear"), p90=L.quantile(0.9, "linear"), mean=L.mean(),
                   corr=pl.corr(L, pl.col("correct").cast(pl.Float64)),
                   failed_mean=L.filter(~pl.col("correct")).mean(),
                   correct_mean=L.filter(pl.col("correct")).mean()).collect().row(0, named=True)
    res = DiagnosticResult(metrics={"p50": fnum(row["p50"]), "p90": fnum(row["p90"]), "mean": fnum(row["mean"]),
                                    "len_correct_corr": fnum(row["corr"]), "failed_mean": fnum(row["failed_mean"]),
                                    "correct_mean": fnum(row["correct_mean"])},
                           per_step=per_step_dict(per))
    corr = res.metrics["len_correct_corr"]
    th = ev.th("length.gaming_corr")
    if corr is not None and corr > th:
        p90 = res.metrics["p90"]
        res.findings.append(ev.finding(
            "length", "length_gaming", "warning",
            f"completion length correlates with correctness (r = {corr:.2f} > {th:g}): the policy may be "
            "gaming length; check that longer answers are not rewarded for length itself",
            steps=ev.step_range(), metric="len_correct_corr", value=corr, threshold=th,
            rollout_uids=ev.examples(t.filter(pl.col("correct") & (L >= p90)))))
    return res


# --------------------------------------------------------------------------- format


@register("format", dimension="format", thresholds={"warning": 0.3},
          description="format-violation rate from the verifier's format_ok (paper, code: >30% = format gate "
                      "misconfigured); skipped when the verifier records no format_ok")
def format_violations(ev: Evidence) -> DiagnosticResult:
    t = ev.train().filter(pl.col("format_ok").is_not_null())
    viol = (~pl.col("format_ok")).cast(pl.Float64)
    per = t.group_by("step").agg(violation_rate=viol.mean()).sort("step").collect()
    rate, n = t.select(viol.mean().alias("a"), pl.len()).collect().row(0)
    res = DiagnosticResult(metrics={"violation_rate": fnum(rate), "judged": float(n)}, per_step=per_step_dict(per))
    sev = _severity(fnum(rate), ev.th("format.warning"))
    if sev:
        res.findings.append(ev.finding(
            "format", "format_gate", "warning",
            f"{_pct(rate)} of training rollouts violate the answer format (> {_pct(sev[1])}): the format gate "
            "(prompt, extraction or format reward) looks misconfigured",
            steps=ev.step_range(), metric="violation_rate", value=rate, threshold=sev[1],
            rollout_uids=ev.examples(t.filter(~pl.col("format_ok")))))
    return res


# --------------------------------------------------------------------------- model state


@register("logprob", dimension="model_state", thresholds={"warning": -0.1, "critical": -0.05},
          description="mean sampling log-prob at the end of the version (last quarter of steps) "
                      "(paper: > -0.1 warning, > -0.05 critical exploration collapse) and its trend")
def logprob(ev: Evidence) -> DiagnosticResult:
    t = ev.train().filter(pl.col("mean_logprob").is_not_null())
    per = t.group_by("step").agg(mean_logprob=pl.col("mean_logprob").mean()).sort("step").collect()
    res = DiagnosticResult(per_step=per_step_dict(per))
    if per.height == 0:
        res.metrics.update(mean_logprob=None, start=None, end=None, slope=None)
        return res
    steps = per["step"].to_list()
    first, last = _windows(steps)
    win = t.select(pl.col("mean_logprob").mean().alias("all"),
                   pl.col("mean_logprob").filter(pl.col("step").is_in(first)).mean().alias("start"),
                   pl.col("mean_logprob").filter(pl.col("step").is_in(last)).mean().alias("end")).collect().row(0)
    slope = float(np.polyfit(steps, per["mean_logprob"].to_numpy(), 1)[0]) if len(steps) > 1 else None
    res.metrics.update(mean_logprob=fnum(win[0]), start=fnum(win[1]), end=fnum(win[2]), slope=slope)
    end = res.metrics["end"]
    sev = _severity(end, ev.th("logprob.warning"), ev.th("logprob.critical"))
    if sev:
        res.findings.append(ev.finding(
            "logprob", "exploration_collapse", sev[0],
            f"mean sampling log-prob is {end:.3f} at the end of the version (> {sev[1]:g}): the policy samples "
            "almost deterministically (exploration collapse); raise temperature or add an exploration bonus",
            steps=(last[0], last[-1]), metric="end", value=end, threshold=sev[1],
            rollout_uids=ev.examples(t.filter(pl.col("step").is_in(last)).sort("mean_logprob", descending=True))))
    return res


@register("entropy", dimension="model_state", thresholds={"drop": 0.5},
          description="policy entropy from the metrics table (TRL 'entropy'): level and trend; "
                      "warning when it falls by >= 50% from the first to the last quarter of steps")
def entropy(ev: Evidence) -> DiagnosticResult:
    per = (ev.version_metrics().filter(pl.col("name") == "entropy").group_by("step")
           .agg(entropy=pl.col("value").mean()).sort("step").collect())
    res = DiagnosticResult(per_step=per_step_dict(per))
    if per.height == 0:
        res.metrics.update(entropy=None, start=None, end=None, change=None)
        return res
    steps = per["step"].to_list()
    first, last = _windows(steps)
    start = fnum(per.filter(pl.col("step").is_in(first))["entropy"].mean())
    end = fnum(per.filter(pl.col("step").is_in(last))["entropy"].mean())
    change = (end - start) / abs(start) if start not in (None, 0.0) and end is not None else None
    res.metrics.update(entropy=fnum(per["entropy"].mean()), start=start, end=end, change=change)
    drop = ev.th("entropy.drop")
    if change is not None and len(steps) > 1 and change <= -drop:
        res.findings.append(ev.finding(
            "entropy", "entropy_collapse", "warning",
            f"policy entropy fell {_pct(-change)} from {start:.3f} to {end:.3f} over the version (>= {_pct(drop)})",
            steps=(steps[0], steps[-1]), metric="change", value=change, threshold=-drop))
    return res


@register("dead_training", dimension="model_state", thresholds={"critical": 0.5, "eps": 1e-12},
          description="share of steps whose loss == 0 and grad_norm == 0 (paper, math: loss stuck at 0 = dead training)")
def dead_training(ev: Evidence) -> DiagnosticResult:
    eps = ev.th("dead_training.eps")
    m = (ev.version_metrics().filter(pl.col("name").is_in(["loss", "grad_norm"]))
         .group_by("step").agg(loss=pl.col("value").filter(pl.col("name") == "loss").mean(),
                               grad_norm=pl.col("value").filter(pl.col("name") == "grad_norm").mean())
         .filter(pl.col("loss").is_not_null()).sort("step").collect())
    res = DiagnosticResult(per_step=per_step_dict(m))
    if m.height == 0:
        res.metrics.update(zero_loss_share=None, steps=0.0)
        return res
    zero = (pl.col("loss").abs() <= eps) & (pl.col("grad_norm").is_null() | (pl.col("grad_norm").abs() <= eps))
    share = float(m.select(zero.cast(pl.Float64).mean()).item())
    res.metrics.update(zero_loss_share=share, steps=float(m.height))
    th = ev.th("dead_training.critical")
    if share > th:
        zs = m.filter(zero)["step"]
        res.findings.append(ev.finding(
            "dead_training", "dead_training", "critical",
            f"loss and grad norm are 0 on {_pct(share)} of steps ({int(share * m.height)} of {m.height}): "
            "nothing is being learned (all advantages zero? every group dead or filtered?)",
            steps=(int(zs.min()), int(zs.max())), metric="zero_loss_share", value=share, threshold=th))
    return res


# --------------------------------------------------------------------------- behaviour


@register("repetition", dimension="behaviour",
          thresholds={"ratio": 0.5, "warning": 0.2, "duplicate_warning": 0.5},
          description="repetitive completions (distinct word-bigram ratio < 0.5, completions of >= 8 words) "
                      "and identical completions within a group, on the text sample (whole steps, ~64k rows)")
def repetition(ev: Evidence) -> DiagnosticResult:
    ratio_th = ev.th("repetition.ratio")
    s = ev.text_sample().filter((pl.col("version") == ev.version) & TRAIN & pl.col("bigram_ratio").is_not_null())
    rep = (pl.col("bigram_ratio") < ratio_th).cast(pl.Float64)
    g = ev.text_groups().filter((pl.col("version") == ev.version) & TRAIN)
    dup = (pl.col("n") - pl.col("n_distinct")).sum() / pl.col("n").sum()
    per_rep = s.group_by("step").agg(repetitive_rate=rep.mean())
    per_dup = g.group_by("step").agg(duplicate_share=dup.cast(pl.Float64))
    per = per_dup.join(per_rep, on="step", how="left").sort("step").collect()
    rate, mean_ratio, judged = s.select(rep.mean().alias("a"), pl.col("bigram_ratio").mean().alias("b"),
                                        pl.len()).collect().row(0)
    has_text = "completion" in ev.schema().names()
    dshare, ident = g.select(dup.cast(pl.Float64).alias("a"),
                             ((pl.col("n_distinct") == 1) & (pl.col("n") > 1)).mean().alias("b")).collect().row(0) if has_text else (None, None)
    res = DiagnosticResult(
        metrics={"repetitive_rate": fnum(rate), "distinct_bigram_mean": fnum(mean_ratio), "judged": float(judged),
                 "sampled_groups": float(g.select(pl.len()).collect().item()),
                 "duplicate_share": fnum(dshare), "diversity": None if dshare is None else 1.0 - dshare,
                 "identical_groups": fnum(ident)},
        per_step=per_step_dict(per) if has_text else {})
    th = ev.th("repetition.warning")
    if rate is not None and rate > th:
        res.findings.append(ev.finding(
            "repetition", "repetitive_completions", "warning",
            f"{_pct(rate)} of sampled training completions repeat themselves (distinct-bigram ratio < {ratio_th:g}; "
            f"{judged} judged) (> {_pct(th)}): degenerate loops",
            steps=ev.step_range(), metric="repetitive_rate", value=rate, threshold=th,
            rollout_uids=ev.examples(s.filter(pl.col("bigram_ratio") < ratio_th))))
    dth = ev.th("repetition.duplicate_warning")
    if dshare is not None and dshare > dth:
        ids = g.filter(pl.col("n_distinct") < pl.col("n")).select("group_id")
        res.findings.append(ev.finding(
            "repetition", "identical_completions", "warning",
            f"{_pct(dshare)} of training completions duplicate another completion of their group (> {_pct(dth)}): "
            "the group explores nothing",
            steps=ev.step_range(), metric="duplicate_share", value=dshare, threshold=dth,
            rollout_uids=ev.examples(ev.text_sample().join(ids, on="group_id", how="semi"))))
    return res


# --------------------------------------------------------------------------- data


@register("saturation", dimension="data", thresholds={"saturated_warning": 0.3, "unsolved_warning": 0.5},
          description="per training item over the version: every sample correct (saturated: no signal) "
                      "or none (never solved)")
def saturation(ev: Evidence) -> DiagnosticResult:
    t = ev.train()
    items = (t.group_by("item_id").agg(n=pl.len(), c=pl.col("correct").cast(pl.Int32).sum())
             .with_columns(saturated=pl.col("c") == pl.col("n"), unsolved=pl.col("c") == 0))
    n_items, sat, uns = items.select(pl.len(), pl.col("saturated").mean(), pl.col("unsolved").mean()).collect().row(0)
    res = DiagnosticResult(metrics={"n_items": float(n_items), "saturated_share": fnum(sat),
                                    "unsolved_share": fnum(uns)})
    for code, share, key, what in (
        ("saturated_items", fnum(sat), "saturated_warning",
         "are solved by every sample (no learning signal; consider data_selection.drop_saturated)"),
        ("unsolved_items", fnum(uns), "unsolved_warning",
         "are never solved by any sample (too hard; consider a curriculum or data_selection.drop_unsolved)"),
    ):
        th = ev.th(f"saturation.{key}")
        if share is not None and share > th:
            col = "saturated" if code == "saturated_items" else "unsolved"
            ids = items.filter(pl.col(col)).select("item_id")
            res.findings.append(ev.finding(
                "saturation", code, "warning", f"{_pct(share)} of {n_items} training items {what} (> {_pct(th)})",
                steps=ev.step_range(), metric=f"{col}_share", value=share, threshold=th,
                rollout_uids=ev.examples(t.join(ids, on="item_id", how="semi"))))
    return res
