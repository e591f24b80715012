"""Diagnostics: each planted pathology is found at its planted rate, healthy data stays quiet,
rules R1-R4 across versions, the report's JSON round-trip, and a broken diagnostic's containment."""
import itertools
import json

import polars as pl
import pytest

from evotrainer import diagnostics
from evotrainer.diagnostics import DiagnosticResult, Evidence, registry
from evotrainer.diagnostics.report import format_health, health_report, health_report_for
from evotrainer.schema import HealthReport, finding_id
from evotrainer.testing import planted_rollouts, planted_store

N_GROUPS, G = 20, 8


def _rows(version="v000", split="train", steps=4, seed=0, **kw):
    return planted_rollouts("c", version, steps=steps, n_groups=kw.pop("n_groups", N_GROUPS),
                            group_size=kw.pop("group_size", G), seed=seed, split=split, **kw)


def _ev(*frames, metrics=None, **kw):
    return Evidence.from_frames(pl.concat(frames, how="diagonal_relaxed"), metrics, **kw)


def _run(name, ev):
    return diagnostics.run(name, ev)


def _codes(res):
    return {f.code: f for f in res.findings}


def _metrics(version="v000", steps=4, **values):
    rows = [{"campaign": "c", "version": version, "step": s, "name": k,
             "value": float(v[s - 1] if isinstance(v, list) else v), "source": "trl"}
            for s in range(1, steps + 1) for k, v in values.items()]
    return pl.DataFrame(rows, schema={"campaign": pl.String, "version": pl.String, "step": pl.Int32,
                                      "name": pl.String, "value": pl.Float64, "source": pl.String})


# --------------------------------------------------------------------------- healthy data


def test_healthy_planted_data_raises_no_alert():
    ev = _ev(_rows(), _rows(split="val", steps=[4]), metrics=_metrics(loss=0.1, grad_norm=1.0, entropy=1.0))
    report = health_report(ev)
    assert report.alerts == ()
    assert not any(f.code == "diagnostic_error" for f in report.findings)
    m = report.metrics
    assert m["dead_groups/dgr"] == 0.0 and m["truncation/rate"] == 0.0 and m["format/violation_rate"] == 0.0
    assert m["heldout/avg_at_k"] == pytest.approx(0.5)
    assert m["repetition/repetitive_rate"] == 0.0 and m["repetition/duplicate_share"] == 0.0
    assert -0.6 <= m["logprob/mean_logprob"] <= -0.3
    # every built-in and every rule ran and reported under "<diagnostic>/<metric>"
    for name in diagnostics.known():
        assert any(k.startswith(name + "/") for k in m), name


# --------------------------------------------------------------------------- results


@pytest.mark.parametrize("dead,sat,severity", [(0.35, 0.0, "warning"), (0.4, 0.2, "critical"), (0.25, 0.0, None)])
def test_dead_groups_ratio_and_severity(dead, sat, severity):
    ev = _ev(_rows(dead_groups=dead, saturation=sat))
    res = _run("dead_groups", ev)
    assert res.metrics["dgr"] == pytest.approx(dead + sat)
    assert set(res.per_step["dgr"]) == {1, 2, 3, 4}
    assert all(v == pytest.approx(dead + sat) for v in res.per_step["dgr"].values())
    f = _codes(res).get("dead_groups")
    if severity is None:
        assert f is None
        return
    assert f.severity == severity and f.value == pytest.approx(dead + sat) and f.steps == (1, 4)
    assert f.finding_id == finding_id("dead_groups", "dead_groups", ("v000",), (1, 4))
    # the examples are rollouts of dead groups
    rows = ev.rollouts.collect()
    ex = rows.filter(pl.col("rollout_uid").is_in(list(f.rollout_uids)))
    assert 0 < ex.height <= 10
    stds = rows.group_by("group_id").agg(pl.col("reward").std()).filter(pl.col("group_id").is_in(ex["group_id"].to_list()))
    assert (stds["reward"] < 1e-3).all()


def test_reward_spread_low_when_groups_are_dead():
    quiet = _run("reward_spread", _ev(_rows()))
    assert quiet.metrics["spread"] > 0.5 and not quiet.findings
    res = _run("reward_spread", _ev(_rows(dead_groups=0.95)))
    # one mixed group in 20: 4 right / 4 wrong, std (N-1) of {0.1 x4, 1.1 x4} = 0.5345
    assert res.metrics["spread"] == pytest.approx(0.5345 / 20, abs=1e-3)
    assert _codes(res)["low_reward_spread"].severity == "warning"


def test_reward_distribution_shares():
    res = _run("reward_distribution", _ev(_rows(dead_groups=0.4)))
    # dead groups: reward 0.1 (wrong, formatted); mixed: half 0.1, half 1.1
    assert res.metrics["top_value"] == pytest.approx(0.1)
    assert res.metrics["top_share"] == pytest.approx(0.4 + 0.6 * 0.5)
    assert res.metrics["share[1.1]"] == pytest.approx(0.3)
    assert res.metrics["bc_rate"] == pytest.approx(0.3)
    assert _codes(res)["reward_concentrated"].severity == "info"
    assert not _run("reward_distribution", _ev(_rows())).findings  # exactly 50/50: not > 50%


def test_cr_flow_counts_items_that_regress_between_evaluations():
    val = _rows(split="val", steps=[5, 10], saturation=(0.5, 0.2))  # 10 solved items, then 4 of them
    res = _run("cr_flow", _ev(_rows(steps=10), val))
    assert res.metrics["regressed"] == 6 and res.metrics["improved"] == 0 and res.metrics["compared"] == 20
    assert res.metrics["regressed_rate"] == pytest.approx(0.3)
    f = _codes(res)["items_regressed"]
    assert f.severity == "warning" and f.steps == (10, 10)
    rows = val.filter(pl.col("rollout_uid").is_in(list(f.rollout_uids)))
    assert rows.height > 0 and (rows["step"] == 10).all()
    items = rows["item_id"].unique().to_list()
    before = val.filter(pl.col("item_id").is_in(items) & (pl.col("step") == 5))
    after = val.filter(pl.col("item_id").is_in(items) & (pl.col("step") == 10))
    assert before["correct"].all() and after["correct"].mean() <= 0.5  # solved at step 5, not at step 10
    # improving items are not flagged
    up = _run("cr_flow", _ev(_rows(steps=10), _rows(split="val", steps=[5, 10], saturation=(0.2, 0.5))))
    assert up.metrics["improved"] == 6 and not up.findings


def test_cr_flow_spans_versions():
    v0 = _ev(_rows("v000"), _rows("v000", split="val", steps=[4], saturation=0.5),
             _rows("v001"), _rows("v001", split="val", steps=[4], saturation=0.1))
    res = _run("cr_flow", v0)
    assert res.metrics["regressed"] == 8 and res.metrics["regressed_rate"] == pytest.approx(0.4)


def test_heldout_avg_at_k():
    res = _run("heldout", _ev(_rows(), _rows(split="val", steps=[2, 4], saturation=(0.0, 0.25))))
    assert res.metrics["avg_at_k"] == pytest.approx(0.25 + 0.75 * 0.5)
    assert res.metrics["eval_step"] == 4 and res.metrics["k"] == G and res.metrics["n_items"] == N_GROUPS
    assert res.per_step["avg_at_k"] == {2: pytest.approx(0.5), 4: pytest.approx(0.625)}
    none = _run("heldout", _ev(_rows()))
    assert none.metrics["avg_at_k"] is None and _codes(none)["no_heldout"].severity == "info"


# --------------------------------------------------------------------------- efficiency and format


@pytest.mark.parametrize("rate,warn", [(0.25, True), (0.10, False)])
def test_truncation_rate(rate, warn):
    ev = _ev(_rows(truncation=rate))
    res = _run("truncation", ev)
    assert res.metrics["rate"] == pytest.approx(rate, abs=1 / (N_GROUPS * G))
    f = _codes(res).get("truncation")
    assert (f is not None) == warn
    if warn:
        ex = ev.rollouts.collect().filter(pl.col("rollout_uid").is_in(list(f.rollout_uids)))
        assert ex.height and ex["truncated"].all()


def test_length_percentiles_and_length_gaming():
    healthy = _run("length", _ev(_rows(mean_length=80)))
    assert 70 <= healthy.metrics["p50"] <= 90 and 100 <= healthy.metrics["p90"] <= 120
    assert abs(healthy.metrics["len_correct_corr"]) < 0.3 and not healthy.findings
    gamed = _run("length", _ev(_rows(mean_length=80, length_gaming=True)))
    assert gamed.metrics["len_correct_corr"] > 0.6
    assert gamed.metrics["correct_mean"] == pytest.approx(gamed.metrics["failed_mean"] + 80, abs=8)
    assert _codes(gamed)["length_gaming"].severity == "warning"


@pytest.mark.parametrize("rate,warn", [(0.4, True), (0.2, False)])
def test_format_violation_rate(rate, warn):
    res = _run("format", _ev(_rows(format_fail=rate)))
    assert res.metrics["violation_rate"] == pytest.approx(rate, abs=1 / (N_GROUPS * G))
    assert ("format_gate" in _codes(res)) == warn


def test_format_skipped_without_format_ok():
    rows = _rows(format_fail=0.5).with_columns(pl.lit('{"correct": false}').alias("verifier"))
    res = _run("format", _ev(rows))
    assert res.metrics["violation_rate"] is None and res.metrics["judged"] == 0 and not res.findings


# --------------------------------------------------------------------------- model state


@pytest.mark.parametrize("lp,severity", [(-0.03, "critical"), (-0.08, "warning"), (-0.3, None), (None, None)])
def test_logprob_exploration_collapse(lp, severity):
    res = _run("logprob", _ev(_rows(logprob=lp)))
    if lp is not None:
        assert res.metrics["end"] == pytest.approx(lp, abs=0.002)
    f = _codes(res).get("exploration_collapse")
    assert (f.severity if f else None) == severity


def test_logprob_trend_uses_the_end_of_the_version():
    res = _run("logprob", _ev(_rows(steps=8, logprob=(-0.5, -0.02))))
    assert res.metrics["slope"] > 0 and res.metrics["start"] < -0.4
    # last quarter = steps 7, 8: (-0.0886 - 0.02) / 2; the version mean (-0.26) alone would not warn
    assert res.metrics["end"] == pytest.approx(-0.0543, abs=0.002) and res.metrics["mean_logprob"] < -0.2
    f = _codes(res)["exploration_collapse"]
    assert f.severity == "warning" and f.steps == (7, 8)


def test_entropy_trend_from_metrics_table():
    res = _run("entropy", _ev(_rows(), metrics=_metrics(entropy=[2.0, 1.6, 1.0, 0.6])))
    assert res.metrics["start"] == 2.0 and res.metrics["end"] == 0.6
    assert res.metrics["change"] == pytest.approx(-0.7)
    assert _codes(res)["entropy_collapse"].severity == "warning"
    flat = _run("entropy", _ev(_rows(), metrics=_metrics(entropy=[2.0, 1.9, 2.1, 1.8])))
    assert not flat.findings
    absent = _run("entropy", _ev(_rows()))
    assert absent.metrics["entropy"] is None and not absent.findings


def test_dead_training_loss_stuck_at_zero():
    dead = _run("dead_training", _ev(_rows(), metrics=_metrics(loss=[0.0, 0.0, 0.0, 0.2], grad_norm=[0.0, 0.0, 0.0, 1.0])))
    assert dead.metrics["zero_loss_share"] == pytest.approx(0.75)
    f = _codes(dead)["dead_training"]
    assert f.severity == "critical" and f.steps == (1, 3)
    live = _run("dead_training", _ev(_rows(), metrics=_metrics(loss=0.0, grad_norm=0.5)))
    assert live.metrics["zero_loss_share"] == 0.0 and not live.findings  # loss 0 but gradients flow


# --------------------------------------------------------------------------- behaviour and data


@pytest.mark.parametrize("rate,warn", [(0.3, True), (0.1, False)])
def test_repetitive_completions(rate, warn):
    ev = _ev(_rows(repetition=rate))
    res = _run("repetition", ev)
    assert res.metrics["repetitive_rate"] == pytest.approx(rate, abs=1 / (N_GROUPS * G))
    assert res.metrics["judged"] == N_GROUPS * G * 4
    f = _codes(res).get("repetitive_completions")
    assert (f is not None) == warn
    if warn:
        texts = ev.rollouts.collect().filter(pl.col("rollout_uid").is_in(list(f.rollout_uids)))["completion"]
        for t in texts:  # the examples really loop
            w = t.split()
            assert len(set(itertools.pairwise(w))) / (len(w) - 1) < 0.5


def test_identical_completions_within_groups():
    res = _run("repetition", _ev(_rows(identical=0.75)))
    assert res.metrics["duplicate_share"] == pytest.approx(0.75 * (G - 1) / G)
    assert res.metrics["identical_groups"] == pytest.approx(0.75)
    assert _codes(res)["identical_completions"].severity == "warning"
    assert not _codes(_run("repetition", _ev(_rows(identical=0.25))))


def test_text_is_read_for_a_bounded_sample_of_whole_steps(monkeypatch):
    monkeypatch.setattr(registry, "TEXT_SAMPLE_CAP", 100)
    ev = _ev(_rows(repetition=0.5))  # 4 steps x 160 rows
    res = _run("repetition", ev)
    # every 7th step plus the last -> steps 1 and 4 (320 rows) -> every 2nd group by rank -> 20 groups
    sample = ev.text_sample().collect()
    assert sorted(sample["step"].unique().to_list()) == [1, 4]
    assert res.metrics["sampled_groups"] == 20 and sample.height == 160
    assert sample.group_by("group_id").len()["len"].to_list() == [G] * 20  # whole groups
    assert res.metrics["judged"] == 160 and res.metrics["repetitive_rate"] == pytest.approx(0.5, abs=0.1)
    ident = _run("repetition", _ev(_rows(identical=0.5)))
    assert ident.metrics["identical_groups"] == pytest.approx(0.5, abs=0.2)


def test_saturated_and_never_solved_items():
    res = _run("saturation", _ev(_rows(saturation=0.4, dead_groups=0.55)))
    assert res.metrics["saturated_share"] == pytest.approx(0.4) and res.metrics["unsolved_share"] == pytest.approx(0.55)
    codes = _codes(res)
    assert codes["saturated_items"].severity == "warning" and codes["unsolved_items"].severity == "warning"
    assert not _run("saturation", _ev(_rows(saturation=0.2, dead_groups=0.3))).findings


# --------------------------------------------------------------------------- rules across versions


def _store(tmp_path, versions):
    return planted_store(tmp_path / "camp", versions)


@pytest.mark.parametrize("dead,severity", [(0.4, "warning"), (0.6, "critical"), (0.2, None)])
def test_r1_insufficient_signal(tmp_path, dead, severity):
    store = _store(tmp_path, {"v000": {}, "v001": {"dead_groups": dead}})
    rep = health_report_for(store, "v001")
    f = [x for x in rep.findings if x.rule == "R1"]
    assert [x.severity for x in f] == ([severity] if severity else [])
    if severity:
        assert "more continuous" in f[0].message and f[0].value == pytest.approx(dead)


def test_r2_echo_trap_lengths_rising_over_versions(tmp_path):
    store = _store(tmp_path, {f"v00{i}": {"mean_length": L, "val": {"mean_length": L}}
                              for i, L in enumerate((60, 70, 85, 110))})
    rep = health_report_for(store, "v003")
    f = [x for x in rep.findings if x.code == "R2_echo_trap"]
    assert len(f) == 1 and f[0].rule == "R2" and f[0].severity == "warning"
    assert f[0].versions == ("v001", "v002", "v003") and "turn cap" not in f[0].message
    assert "cap the completion length" in f[0].message
    # rising then falling: no echo trap
    store2 = planted_store(tmp_path / "c2", {f"v00{i}": {"mean_length": L, "val": {"mean_length": L}}
                                            for i, L in enumerate((60, 85, 110, 90))})
    assert not [x for x in health_report_for(store2, "v003").findings if x.rule == "R2"]


def test_r2_failed_rollouts_much_longer():
    rows = _rows(mean_length=60)
    rows = rows.with_columns(pl.when(~pl.col("correct")).then(pl.col("n_completion_tokens") * 4)
                             .otherwise(pl.col("n_completion_tokens")).alias("n_completion_tokens"))
    res = _run("R2_echo_trap", _ev(rows))
    assert res.metrics["failed_length_ratio"] == pytest.approx(4 / 2.5, rel=0.05)
    assert _codes(res)["R2_echo_trap_failed_long"].rule == "R2"
    assert not _run("R2_echo_trap", _ev(_rows())).findings


def test_r3_exploration_collapse_within_and_across_versions(tmp_path):
    within = _run("R3_exploration_collapse", _ev(_rows(steps=8, logprob=(-0.5, -0.12), repetition=(0.0, 0.4))))
    f = _codes(within)["R3_exploration_collapse"]
    assert f.rule == "R3" and f.steps == (1, 8) and "temperature" in f.message
    assert within.metrics["within/logprob_rise"] > 0.5 and within.metrics["within/nonrepetitive_drop"] >= 0.1
    # log-prob rises but diversity holds: not R3
    assert not _run("R3_exploration_collapse", _ev(_rows(steps=8, logprob=(-0.5, -0.12)))).findings
    store = _store(tmp_path, {"v000": {"logprob": -0.5}, "v001": {"logprob": -0.04, "identical": 0.3}})
    rep = health_report_for(store, "v001")
    r3 = [x for x in rep.findings if x.rule == "R3"]
    assert len(r3) == 1 and r3[0].versions == ("v000", "v001") and r3[0].severity == "critical"
    assert rep.metrics["R3_exploration_collapse/vs_previous/diversity_drop"] == pytest.approx(0.3 * (G - 1) / G)


def test_r4_reward_hacking_is_a_vetoing_validity_rule(tmp_path):
    assert registry.get("R4_reward_hacking").validity
    within = _run("R4_reward_hacking", _ev(_rows(steps=8, reward_hacking=True)))
    f = _codes(within)["R4_reward_hacking"]
    assert f.severity == "critical" and f.veto and f.rule == "R4" and "simplify the reward" in f.message
    store = _store(tmp_path, {"v000": {"val": {}}, "v001": {"reward_hacking": True, "steps": 1, "val": {}}})
    rep = health_report_for(store, "v001")
    r4 = [x for x in rep.findings if x.rule == "R4"]
    assert len(r4) == 1 and r4[0].versions == ("v000", "v001") and r4[0].veto
    assert "held-out Avg@k" in r4[0].message
    assert "R4" in format_health(rep) and "VETO" in format_health(rep)


def test_r4_quiet_when_correctness_rises_with_reward(tmp_path):
    store = _store(tmp_path, {"v000": {"correct_share": 0.25, "val": {"correct_share": 0.25}},
                              "v001": {"correct_share": 0.75, "val": {"correct_share": 0.75}}})
    rep = health_report_for(store, "v001")
    assert rep.metrics["R4_reward_hacking/vs_previous/reward_delta"] == pytest.approx(0.5)
    assert not [x for x in rep.findings if x.rule == "R4"]
    assert not any(f.veto for f in rep.findings)


# --------------------------------------------------------------------------- the report


def test_report_json_round_trip_and_store(tmp_path):
    store = _store(tmp_path, {"v000": {"val": {}}, "v001": {"dead_groups": 0.6, "truncation": 0.2, "val": {},
                                                            "metrics": {"loss": 0.0, "grad_norm": 0.0}}})
    rep = health_report_for(store, "v001", write=True)
    assert HealthReport.model_validate_json(rep.model_dump_json()) == rep
    assert HealthReport.model_validate(json.loads(json.dumps(rep.model_dump(mode="json")))) == rep
    assert store.read_health_report("v001") == rep
    assert rep.per_step["dead_groups/dgr"] == {str(s): pytest.approx(0.6) for s in (1, 2, 3, 4)}
    sev = [f.severity for f in rep.findings]
    assert sev == sorted(sev, key={"critical": 0, "warning": 1, "info": 2}.get)
    text = format_health(rep)
    assert text.index("CRITICAL") < text.index("WARNING") < text.index("Metrics:")
    assert "dead_groups/dgr" in text
    # re-running gives the same finding ids (interventions cite them)
    again = health_report_for(store, "v001")
    assert [f.finding_id for f in again.findings] == [f.finding_id for f in rep.findings]


def test_report_follows_the_lineage(tmp_path):
    from evotrainer.diagnostics.report import lineage

    store = _store(tmp_path, {"v000": {}, "v001": {}, "v002": {}})
    assert lineage(store, "v002", history=3) == ["v000", "v001", "v002"]
    assert lineage(store, "v002", history=1) == ["v001", "v002"]
    rep = health_report_for(store, "v001")
    assert rep.version == "v001"


def test_thresholds_are_configurable_and_checked():
    ev = _ev(_rows(dead_groups=0.35), thresholds={"dead_groups.warning": 0.4})
    assert not _run("dead_groups", ev).findings
    with pytest.raises(KeyError, match="unknown threshold"):
        health_report(_ev(_rows(), thresholds={"dead_group.warning": 0.4}))
    assert diagnostics.default_thresholds()["dead_groups.critical"] == 0.5


def test_a_raising_diagnostic_becomes_an_error_finding():
    @diagnostics.register("test_broken", dimension="behaviour")
    def broken(ev):
        raise RuntimeError("boom")

    @diagnostics.register("test_validity", dimension="results", validity=True)
    def validity(ev):
        return DiagnosticResult(metrics={"x": 1.0}, findings=[ev.finding("test_validity", "leak", "critical", "leak")])

    try:
        rep = health_report(_ev(_rows()))
        err = [f for f in rep.findings if f.diagnostic == "test_broken"]
        assert len(err) == 1 and err[0].code == "diagnostic_error" and err[0].severity == "warning"
        assert "RuntimeError: boom" in err[0].message
        leak = [f for f in rep.findings if f.diagnostic == "test_validity"]
        assert leak[0].veto and rep.metrics["test_validity/x"] == 1.0
        assert rep.metrics["dead_groups/dgr"] == 0.0  # the others still ran
        with pytest.raises(ValueError, match="already registered"):
            diagnostics.register("test_broken", dimension="behaviour")(lambda ev: DiagnosticResult())
    finally:
        diagnostics.unregister("test_broken")
        diagnostics.unregister("test_validity")


def test_empty_version_reports_without_errors():
    ev = Evidence.from_frames(_rows("v000"), versions=["v000", "v001"])
    rep = health_report(ev)
    assert rep.version == "v001"
    assert not any(f.code == "diagnostic_error" for f in rep.findings), format_health(rep)
    assert rep.metrics["dead_groups/dgr"] is None


def test_python_baseline_agrees_with_polars():
    from evotrainer.diagnostics.bench import python_baseline

    rows = _rows(dead_groups=0.3, truncation=0.2, format_fail=0.1, repetition=0.2, logprob=-0.2)
    ev = _ev(rows)
    rep = health_report(ev)
    base = python_baseline(rows.to_dicts())
    for key, value in base.items():
        assert rep.metrics[key] == pytest.approx(value, abs=1e-9), key
