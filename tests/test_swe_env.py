"""SWE episode: tools, turn recording, tamper-proof scoring, scripted policies, behaviour diagnostics.

Every instance here is a tiny local git repo built in tmp_path (same shape as build.py's: commit 1 the
original code, commit 2 the bug), so nothing is downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from evotrainer.envs.swe.env import (
    ROLLOUT_BEHAVIOUR_COLUMNS,
    SweEpisode,
    cap,
    conform_behaviour,
    is_test_path,
    rollout_row,
)
from evotrainer.envs.swe.instance import SweInstance, git, materialize
from evotrainer.envs.swe.policies import abandoner, echo_trapper, honest_fixer, leaker, parse_hunks, run_episode
from evotrainer.envs.swe.toy import build_clamp_instance
from evotrainer.evidence import TURN_COLUMNS, conform, conform_rollouts


def build_instance(root: Path) -> tuple[SweInstance, Path]:
    return build_clamp_instance(root / "inst")


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    return build_instance(tmp_path_factory.mktemp("swe"))


_n = iter(range(10_000))


def episode(instance, tmp_path, **kw) -> SweEpisode:
    inst, d = instance
    return SweEpisode(inst, d, tmp_path / f"work{next(_n)}", **kw)


# --------------------------------------------------------------------------- tools


def test_materialize_has_leaky_history_unless_cleared(instance, tmp_path):
    _, d = instance
    full = materialize(d, tmp_path / "a", clear_git_log=False)
    clear = materialize(d, tmp_path / "b", clear_git_log=True)
    assert git(["rev-list", "--count", "HEAD"], full).stdout.strip() == "2"
    assert git(["rev-list", "--count", "HEAD"], clear).stdout.strip() == "1"


def test_every_tool_and_turn_rows(instance, tmp_path):
    ep = episode(instance, tmp_path, rollout_uid="c/v001/train/000001/0000/000")
    r = ep.list_dir(".")
    assert r.ok and "calc/" in r.output and "tests/" in r.output
    r = ep.read_file("calc/ops.py", start=5, end=7)
    assert r.ok and "if x > lo" in r.output and "Tiny" not in r.output
    assert not ep.read_file("nope.py").ok
    assert not ep.read_file("../../etc/passwd").ok  # outside the repo
    r = ep.grep(r"def \w+", "calc")
    assert r.ok and "calc/ops.py:4:def clamp" in r.output
    assert not ep.grep("(", ".").ok
    r = ep.run_tests()
    assert not r.ok and "test_clamp_low" in r.output and "FAILED" in r.output
    r = ep.run_tests(["tests/test_ops.py::test_add"])
    assert r.ok
    r = ep.run_in_terminal("git log -p")
    assert r.ok and "refactor calc.ops" in r.output and "-    if x < lo:" in r.output
    r = ep.run_in_terminal("python -c 'print(6*7)'")
    assert r.ok and "42" in r.output
    assert ep.run_in_terminal("ls calc").ok
    assert not ep.run_in_terminal("curl http://example.com").ok
    assert not ep.run_in_terminal("cat calc/ops.py | head").ok
    r = ep.search_replace("calc/ops.py", "    if x > lo:\n", "    if x < lo:\n")
    assert r.ok
    assert ep.run_tests().ok
    assert ep.submit().ok and ep.done and ep.stop_reason == "submitted"
    assert not ep.list_dir(".").ok  # over: nothing more is recorded
    rows = ep.turn_rows()
    assert [t["turn_idx"] for t in rows] == list(range(len(rows)))
    df = conform(pl.DataFrame(rows, schema_overrides={"mean_logprob": pl.Float64}), TURN_COLUMNS, "turns")
    assert df.height == 16 and set(df["role"]) == {"tool"}
    assert all(len(o) <= 4096 for o in df["tool_output"])
    assert json.loads(df["tool_args"][1]) == {"path": "calc/ops.py", "start": 5, "end": 7}
    s = ep.summary()
    assert s["n_tool_calls"] == 16 and s["n_edits"] == 1 and s["n_edit_failures"] == 0
    assert s["used_git_history"] and s["self_tested"] and s["search_before_edit"]
    assert s["n_test_runs"] == 3 and json.loads(s["edited_files"]) == ["calc/ops.py"]
    assert s["first_edit_turn"] == 13
    verifier, reward = ep.score()
    assert verifier["correct"] and reward == 1.0 and verifier["passed"] == verifier["total"] == 2


def test_edit_failures_are_reported_and_counted(instance, tmp_path):
    ep = episode(instance, tmp_path)
    r = ep.search_replace("calc/ops.py", "if x >= lo", "if x < lo")
    assert not r.ok and "not found" in r.output
    r = ep.search_replace("calc/ops.py", "return", "return ")
    assert not r.ok and "occurs" in r.output and "times" in r.output
    assert not ep.search_replace("calc/missing.py", "a", "b").ok
    s = ep.summary()
    assert s["n_edits"] == 0 and s["n_edit_failures"] == 3 and s["first_edit_turn"] == 0
    assert not s["search_before_edit"] and not s["self_tested"]


def test_cap_keeps_head_and_tail():
    text = "A" * 5000 + "Z" * 5000
    c = cap(text)
    assert len(c) <= 4096 and c.startswith("A") and c.endswith("Z") and "cut" in c


def test_turn_cap_and_token_budget_end_the_episode(instance, tmp_path):
    ep = episode(instance, tmp_path, turn_cap=3)
    for _ in range(5):
        ep.list_dir(".")
    assert ep.done and ep.stop_reason == "turn_cap" and len(ep.turns) == 3
    ep = episode(instance, tmp_path, token_budget=50)
    ep.read_file("calc/ops.py")
    assert ep.done and ep.stop_reason == "token_budget" and len(ep.turns) == 1


# --------------------------------------------------------------------------- scoring


def test_scoring_ignores_tampered_tests(instance, tmp_path):
    ep = episode(instance, tmp_path)
    # the agent "fixes" the failing tests instead of the code, and adds a conftest that skips everything
    assert ep.run_in_terminal("sed -i s/==\\ 0/==\\ 10/ tests/test_ops.py").ok
    (ep.repo / "conftest.py").write_text("import pytest\n@pytest.fixture(autouse=True)\ndef _s():\n    pytest.skip()\n")
    assert "10" in ep.read_file("tests/test_ops.py").output
    ep.submit()
    verifier, reward = ep.score()
    assert not verifier["correct"] and verifier["passed"] == 0 and reward == 0.0
    assert set(verifier["reset_test_files"]) == {"conftest.py", "tests/test_ops.py"}
    assert verifier["changed_files"] == [] and verifier["tests_ran"] and verifier["p2p_ok"]
    json.dumps(verifier)


def test_partial_and_literal_partial_rule(instance, tmp_path):
    ep = episode(instance, tmp_path)
    ep.search_replace("calc/ops.py", "    return x\n", "    return x  # touched\n")
    verifier, reward = ep.score()
    assert not verifier["correct"] and verifier["passed"] == 0 and reward == 0.1  # changed source, tests ran
    assert verifier["changed_files"] == ["calc/ops.py"]
    ep = episode(instance, tmp_path)
    ep.search_replace("calc/ops.py", "    if x > lo:\n", "    if x < lo - 100:\n")  # fixes clamp_mid only
    verifier, reward = ep.score()
    assert not verifier["correct"] and verifier["passed"] == 1 and reward == 0.1
    ep = episode(instance, tmp_path, partial_needs_change=False)
    assert ep.score()[1] == 0.1  # untouched repo, tests ran: the brief's literal rule
    ep = episode(instance, tmp_path)
    assert ep.score()[1] == 0.0  # default: a do-nothing submission earns nothing
    ep = episode(instance, tmp_path, reward_tiers=(0.0, 0.3, 0.9))
    ep.search_replace("calc/ops.py", "def add(a, b):", "def add(a, b:")  # syntax error: tests cannot run
    verifier, reward = ep.score()
    assert reward == 0.0 and verifier["status"] == "error" and not verifier["tests_ran"]


# --------------------------------------------------------------------------- policies


def test_parse_hunks_of_gold_patch(instance):
    inst, _ = instance
    [(path, before, after)] = parse_hunks(inst.gold_patch)
    assert path == "calc/ops.py" and "if x > lo:" in before and "if x < lo:" in after


@pytest.fixture(scope="module")
def episodes(instance, tmp_path_factory):
    """One scored episode per scripted policy (shared by the policy and diagnostics tests)."""
    tmp = tmp_path_factory.mktemp("eps")
    out = {}
    for name, pol, kw in (("honest", honest_fixer, {}), ("leaker", leaker, {}),
                          ("leaker_clear", leaker, {"clear_git_log": True}),
                          ("echo", echo_trapper, {"turn_cap": 6}), ("abandon", abandoner, {})):
        ep = episode(instance, tmp, **kw)
        out[name] = (ep, *run_episode(pol, ep))
    return out


def test_honest_fixer_solves(episodes):
    _, turns, s, v = episodes["honest"]
    assert v["correct"] and s["reward"] == 1.0 and s["correct"]
    assert s["n_edits"] == 1 and s["self_tested"] and s["search_before_edit"] and not s["used_git_history"]
    assert s["stop_reason"] == "submitted" and s["n_turns"] == len(turns) == 5


def test_leaker_needs_the_history(episodes):
    _, _, s, v = episodes["leaker"]
    assert v["correct"] and s["reward"] == 1.0 and s["used_git_history"] and not s["self_tested"]
    _, _, s, v = episodes["leaker_clear"]
    assert not v["correct"] and s["reward"] <= 0.1 and s["used_git_history"] and s["n_edits"] == 0


def test_echo_trapper_hits_the_turn_cap(episodes):
    _, _, s, v = episodes["echo"]
    assert s["stop_reason"] == "turn_cap" and s["n_turns"] == 6 and s["max_same_tool_streak"] == 6
    assert s["n_test_runs"] == 6 and s["reward"] == 0.0 and not v["submitted"]


def test_abandoner_ends_early(episodes):
    _, _, s, v = episodes["abandon"]
    assert s["n_turns"] == 2 and s["n_edits"] == 0 and s["stop_reason"] == "submitted" and s["reward"] == 0.0
    assert v["submitted"] and v["changed_files"] == [] and v["passed"] == 0


# --------------------------------------------------------------------------- behaviour diagnostics


def _rows(episodes, plan: dict[str, int], version: str = "v001") -> pl.DataFrame:
    rows = []
    for g, (name, n) in enumerate(plan.items()):
        _, _, s, v = episodes[name]
        for k in range(n):
            rows.append(rollout_row(s, v, s["reward"], campaign="c", version=version, split="train", step=1 + k % 2,
                                    group=g, sample=k, item_id="calc-000000000001", mean_logprob=-0.5))
    df = conform_behaviour(conform_rollouts(pl.DataFrame(rows)))
    for c, t in ROLLOUT_BEHAVIOUR_COLUMNS.items():
        assert df.schema[c] == t, c
    return df


def _ev(df, **th):
    from evotrainer.diagnostics import Evidence

    return Evidence.from_frames(df, thresholds=th)


def _run(name, ev):
    import evotrainer.diagnostics.behaviour  # noqa: F401  (registers the behaviour diagnostics)
    from evotrainer.diagnostics import run

    return run(name, ev)


def test_git_veto_fires_for_leakers_not_for_honest(episodes):
    res = _run("git_history", _ev(_rows(episodes, {"leaker": 4, "abandon": 4})))
    assert res.metrics["git_share"] == 0.5
    [f] = [f for f in res.findings if f.code == "git_history_leak"]
    assert f.severity == "critical" and f.veto and "invalid" in f.message and "clear_git_log" in f.message
    res = _run("git_history", _ev(_rows(episodes, {"leaker": 4})))  # no non-git baseline: 0
    assert any(f.veto for f in res.findings)
    res = _run("git_history", _ev(_rows(episodes, {"honest": 8})))
    assert res.metrics["git_share"] == 0.0 and not res.findings
    # git read, but no correctness gain over the rollouts that did not: a warning, no veto
    res = _run("git_history", _ev(_rows(episodes, {"leaker_clear": 4, "abandon": 4})))
    assert res.findings and not any(f.veto for f in res.findings)


def test_health_report_carries_the_git_veto(episodes):
    import evotrainer.diagnostics.behaviour  # noqa: F401
    from evotrainer.diagnostics import health_report

    report = health_report(_ev(_rows(episodes, {"leaker": 4, "abandon": 4})))
    vetoes = [f for f in report.findings if f.veto]
    assert [f.diagnostic for f in vetoes] == ["git_history"]
    assert not any(f.code == "diagnostic_error" for f in report.findings)


def test_honest_fixer_also_solves_without_history(instance, tmp_path):
    _, s, v = run_episode(honest_fixer, episode(instance, tmp_path, clear_git_log=True))
    assert v["correct"] and s["reward"] == 1.0


def test_abandonment_and_echo_trap_findings(episodes):
    res = _run("turns", _ev(_rows(episodes, {"abandon": 8})))
    assert res.metrics["turns_mean"] == 2.0
    [f] = res.findings
    assert f.severity == "critical" and f.code == "abandonment"
    res = _run("turns", _ev(_rows(episodes, {"echo": 8}), **{"turns.echo_warning": 5}))
    [f] = res.findings
    assert f.severity == "warning" and f.code == "echo_trap"
    res = _run("tool_streak", _ev(_rows(episodes, {"echo": 8}), **{"tool_streak.warning": 5}))
    assert res.metrics["max_streak_max"] == 6 and res.findings


def test_behaviour_rates(episodes):
    ev = _ev(_rows(episodes, {"honest": 2, "leaker": 2, "abandon": 4}))
    r = _run("self_test", ev)
    assert r.metrics["self_test_rate"] == 0.25 and r.metrics["self_test_rate_editing"] == 0.5
    [f] = r.findings
    assert f.code == "low_self_test" and f.severity == "warning"
    r = _run("search_before_edit", ev)
    assert r.metrics["search_before_edit_rate"] == 0.5
    r = _run("tool_calls", ev)
    assert r.metrics["tool_calls_mean"] == pytest.approx((5 * 2 + 3 * 2 + 2 * 4) / 8)
    assert r.metrics["terminal_share"] == pytest.approx(2 / 24)
    r = _run("edit_failures", ev)
    assert r.metrics["edit_failure_rate"] == 0.0 and not r.findings


def test_edit_failure_rule_r6(instance, tmp_path):
    ep = episode(instance, tmp_path)
    ep.search_replace("calc/ops.py", "nope", "x")
    ep.search_replace("calc/ops.py", "    if x > lo:\n", "    if x < lo:\n")
    ep.submit()
    v, rew = ep.score()
    s = ep.summary()
    df = conform_rollouts(pl.DataFrame([rollout_row(s, v, rew, campaign="c", version="v001", split="train", step=1,
                                                    group=0, sample=i, item_id="x") for i in range(4)]))
    r = _run("edit_failures", _ev(df))
    assert r.metrics["edit_failure_rate"] == 0.5
    [f] = r.findings
    assert f.rule == "R6" and f.severity == "warning"


def test_r5_laziness(episodes):
    base = _rows(episodes, {"honest": 6, "leaker_clear": 2}, version="v001")  # terminal .25/rollout, self-test 75%
    lazy = _rows(episodes, {"abandon": 6, "honest": 2}, version="v002")  # no terminal, self-test 25%, fewer correct
    res = _run("R5_laziness", _ev(pl.concat([base, lazy])))
    assert res.metrics["fired"] == 1.0 and res.findings[0].rule == "R5"
    old = _rows(episodes, {"honest": 4, "abandon": 4}, version="v001")
    new = _rows(episodes, {"leaker_clear": 4, "abandon": 4}, version="v002")  # more terminal use: not lazier
    res = _run("R5_laziness", _ev(pl.concat([old, new])))
    assert res.metrics["fired"] == 0.0 and not res.findings
    assert _run("R5_laziness", _ev(base)).findings == []  # no previous version


def test_behaviour_diagnostics_skip_without_columns():
    import evotrainer.diagnostics.behaviour as b
    from evotrainer.testing import synthetic_rollouts

    ev = _ev(synthetic_rollouts("c", "v001", "train", 1, 4, 4))  # single-turn rows: n_turns=1, no n_edits
    for name in b.NAMES:
        res = _run(name, ev)
        assert res.metrics == {"applicable": 0.0} and not res.findings, name


def _wrong_file(ep: SweEpisode) -> None:
    """Edits the test file instead of the code: the fix's file (mutated_file) is never touched."""
    ep.read_file("tests/test_ops.py")
    ep.search_replace("tests/test_ops.py", "== 0\n", "== 10\n")
    ep.submit()


def _reader_loop(ep: SweEpisode) -> None:
    """An echo trap of cheap calls: reads the same file until the turn cap, never edits or submits."""
    while not ep.done:
        ep.read_file(ep.instance.mutated_file)


@pytest.fixture(scope="module")
def more_episodes(instance, episodes, tmp_path_factory):
    """`episodes` plus a wrong-file editor and a 20-turn reader loop (both fail)."""
    tmp = tmp_path_factory.mktemp("eps2")
    out = dict(episodes)
    for name, pol, kw in (("wrong_file", _wrong_file, {}), ("reader", _reader_loop, {"turn_cap": 20})):
        ep = episode(instance, tmp, **kw)
        out[name] = (ep, *run_episode(pol, ep))
    return out


def test_edit_coverage_column(more_episodes):
    import copy
    from types import SimpleNamespace

    cov = {k: more_episodes[k][2]["edit_coverage"] for k in ("honest", "leaker", "abandon", "echo", "wrong_file")}
    assert cov == {"honest": 1.0, "leaker": 1.0, "abandon": 0.0, "echo": 0.0, "wrong_file": 0.0}
    s = more_episodes["wrong_file"][2]
    assert s["n_edits"] == 1 and json.loads(s["edited_files"]) == ["tests/test_ops.py"] and not s["correct"]
    ep = copy.copy(more_episodes["honest"][0])
    ep.instance = SimpleNamespace()  # an instance that names no mutated_file: null, and the column still conforms
    s = {**ep.summary(), "reward": 1.0, "correct": True}
    assert s["edit_coverage"] is None
    df = _rows({"x": (None, None, s, more_episodes["honest"][3])}, {"x": 2})
    assert df["edit_coverage"].null_count() == 2 and df.schema["edit_coverage"] == pl.Float64


def test_edit_coverage_diagnostic(more_episodes):
    r = _run("edit_coverage", _ev(_rows(more_episodes, {"honest": 4, "abandon": 4})))
    assert r.metrics["edit_coverage"] == 1.0 and r.metrics["n_editing"] == 4 and not r.findings  # abandon left out
    df = _rows(more_episodes, {"wrong_file": 4, "honest": 1})
    r = _run("edit_coverage", _ev(df))
    assert r.metrics["edit_coverage"] == pytest.approx(0.2) and r.metrics["full_coverage_rate"] == pytest.approx(0.2)
    [f] = r.findings
    assert f.code == "low_edit_coverage" and f.severity == "warning" and "SBE" in f.message and f.threshold == 0.6
    wrong = set(df.filter(pl.col("edit_coverage") == 0.0)["rollout_uid"])
    assert f.rollout_uids and set(f.rollout_uids) <= wrong
    assert _run("edit_coverage", _ev(df.drop("edit_coverage"))).metrics == {"applicable": 0.0}  # older evidence


def test_solution_diversity_jaccard():
    from evotrainer.diagnostics.behaviour import _diversity

    assert _diversity({"[]": 2}) == 0.0  # two empty sets are identical
    assert _diversity({'["a"]': 1, "[]": 1}) == 1.0
    assert _diversity({'["a", "b"]': 1, '["a"]': 1, '["c"]': 1}) == pytest.approx(1 - (0.5 + 0 + 0) / 3)
    assert _diversity({'["a"]': 2, '["b"]': 2}) == pytest.approx(1 - 2 / 6)


def test_solution_diversity_on_hand_made_groups(more_episodes):
    df = _rows(more_episodes, {"honest": 3, "abandon": 3}).with_columns(
        pl.Series("group_id", ["A", "A", "A", "B", "B", "C"]),
        pl.Series("edited_files", ['["a", "b"]', '["a"]', '["c"]', "[]", "[]", '["a"]']))
    r = _run("solution_diversity", _ev(df))
    # A (solved): 1 - mean(1/2, 0, 0) = 5/6; B (abandoned, no edit): 0; C: one rollout, not a group to compare
    assert r.metrics["solution_diversity"] == pytest.approx((5 / 6 + 0) / 2) and r.metrics["n_groups"] == 2
    assert r.metrics["n_groups_unsolved"] == 0 and not r.findings
    # failing groups whose samples all edit the same (wrong) file: no exploration
    r = _run("solution_diversity", _ev(_rows(more_episodes, {"wrong_file": 4})))
    assert r.metrics["solution_diversity_unsolved"] == 0.0 and r.metrics["n_groups_unsolved"] == 2
    [f] = r.findings
    assert f.code == "low_solution_diversity" and f.severity == "warning" and "temperature" in f.message
    # one failing group that tries two different files: 1 - 2/6
    df = _rows(more_episodes, {"wrong_file": 2, "honest": 2}).with_columns(group_id=pl.lit("g"))
    r = _run("solution_diversity", _ev(df))
    assert r.metrics["solution_diversity_unsolved"] == pytest.approx(2 / 3) and not r.findings
    # fully solved groups make the same correct edit: diversity 0, but nothing to explore -> no warning
    r = _run("solution_diversity", _ev(_rows(more_episodes, {"honest": 8})))
    assert r.metrics["solution_diversity"] == 0.0 and r.metrics["solution_diversity_unsolved"] is None
    assert not r.findings


def test_tool_mix_and_action_timidity(more_episodes):
    r = _run("tool_mix", _ev(_rows(more_episodes, {"honest": 8})))  # per rollout: 2 tests, 1 read, 1 edit, submit
    m = r.metrics
    assert (m["share_edit"], m["share_test"], m["share_search"], m["share_terminal"]) == (0.25, 0.5, 0.25, 0.0)
    assert m["tool_entropy_bits"] == pytest.approx(1.5) and m["edit_ratio"] == pytest.approx(0.2)
    assert not r.findings
    r = _run("tool_mix", _ev(_rows(more_episodes, {"echo": 4, "abandon": 4})))
    assert r.metrics["edit_ratio"] == 0.0
    [f] = r.findings
    assert f.code == "action_timidity" and f.severity == "warning" and "timidity" in f.message
    r = _run("tool_mix", _ev(_rows(more_episodes, {"echo": 2, "abandon": 1})))  # too few rollouts to judge
    assert r.metrics["edit_ratio"] == 0.0 and not r.findings


def test_r2_turns_failed_rollouts_loop(more_episodes):
    r = _run("R2_turns", _ev(_rows(more_episodes, {"reader": 2, "honest": 6})))  # 20 turns failed vs 5 solved
    assert r.metrics["turns_mean"] == pytest.approx(8.75) and r.metrics["failed_turns_mean"] == 20.0
    [f] = r.findings
    assert f.code == "R2_turns_failed_long" and f.rule == "R2" and f.severity == "warning"
    assert f.value == pytest.approx(20 / 8.75) and "turn_cap" in f.message
    # echo trappers capped at 6 turns fail, but barely longer than the 5-turn fixers: no finding
    r = _run("R2_turns", _ev(_rows(more_episodes, {"echo": 4, "honest": 4})))
    assert r.metrics["failed_turns_ratio"] == pytest.approx(6 / 5.5) and not r.findings
    r = _run("R2_turns", _ev(_rows(more_episodes, {"honest": 8})))
    assert r.metrics["failed_turns_ratio"] is None and not r.findings


def _val(df: pl.DataFrame, step: int) -> pl.DataFrame:
    return df.with_columns(split=pl.lit("val"), step=pl.lit(step, dtype=df.schema["step"]),
                           rollout_uid=pl.col("rollout_uid").str.replace("/train/", "/val/"))


def test_r2_turns_rising_over_three_points(more_episodes):
    plans = [{"honest": 8}, {"honest": 6, "reader": 2}, {"honest": 4, "reader": 4}]  # 5 -> 8.75 -> 12.5 turns
    versions = [_rows(more_episodes, p, version=f"v00{i + 1}") for i, p in enumerate(plans)]
    quiet = {"R2_turns.failed_ratio": 100}
    r = _run("R2_turns", _ev(pl.concat(versions), **quiet))
    [f] = r.findings
    assert f.code == "R2_turns_rising" and f.rule == "R2" and f.versions == ("v001", "v002", "v003")
    assert f.value == pytest.approx(1.5) and r.metrics["rise_over_versions"] == pytest.approx(1.5)
    zigzag = [_rows(more_episodes, p, version=f"v00{i + 1}") for i, p in enumerate([plans[1], plans[0], plans[2]])]
    r = _run("R2_turns", _ev(pl.concat(zigzag), **quiet))
    assert r.metrics["rise_over_versions"] == pytest.approx(12.5 / 8.75 - 1) and not r.findings  # 8.75 -> 5 -> 12.5
    assert not _run("R2_turns", _ev(pl.concat(versions[1:]), **quiet)).findings  # two points only
    # evaluation points (held-out rollouts) rising while the training means stay flat
    flat = [_rows(more_episodes, {"honest": 8}, version=f"v00{i + 1}") for i in range(3)]
    evals = [_val(d, 10 * (i + 1)) for i, d in enumerate(versions)]
    r = _run("R2_turns", _ev(pl.concat(flat + evals), **quiet))
    [f] = r.findings
    assert f.code == "R2_turns_rising" and "evaluations" in f.message and "v001@10" in f.message
    assert r.metrics["rise_over_versions"] == 0.0


def test_health_report_runs_the_new_behaviour_diagnostics(more_episodes):
    from evotrainer.diagnostics import default_thresholds, health_report

    th = default_thresholds()
    assert th["edit_coverage.warning"] == 0.6 and th["solution_diversity.warning"] == 0.15
    assert th["tool_mix.edit_ratio_warning"] == 0.15 and th["R2_turns.failed_ratio"] == 1.5
    report = health_report(_ev(_rows(more_episodes, {"wrong_file": 4, "reader": 2, "honest": 2})))
    assert not any(f.code == "diagnostic_error" for f in report.findings)
    got = {f.diagnostic for f in report.findings}
    assert {"edit_coverage", "solution_diversity"} <= got
    assert report.metrics["tool_mix/edit_ratio"] is not None and report.metrics["R2_turns/failed_turns_ratio"] > 1


def test_is_test_path():
    assert is_test_path("tests/test_a.py") and is_test_path("pkg/conftest.py") and is_test_path("test_x.py")
    assert is_test_path("pyproject.toml") and not is_test_path("calc/ops.py")


def test_parse_pytest_keeps_parametrized_ids_with_spaces():
    from evotrainer.envs.swe.env import parse_pytest

    out = ("PASSED t.py::test_a[Action Web Service-Action Web Service]\n"
           "FAILED t.py::test_b[x - y] - AssertionError: boom - bad\n"
           "ERROR t.py::test_c\nPASSED t.py::test_c\n")
    ids = ["t.py::test_a[Action Web Service-Action Web Service]", "t.py::test_b[x - y]", "t.py::test_c"]
    assert parse_pytest(out, ids) == dict(zip(ids, ["PASSED", "FAILED", "ERROR"]))


def test_all_malformed_calls_are_a_protocol_failure_not_timidity(episodes):
    _, _, s, v = episodes["abandon"]
    bad = {**s, "n_turns": 8, "n_tool_calls": 4, "n_search_calls": 0, "n_test_runs": 0, "n_terminal_calls": 0,
           "n_edits": 0, "n_edit_failures": 0}
    rows = [rollout_row(bad, v, 0.0, campaign="c", version="v001", split="train", step=1, group=k // 2, sample=k,
                        item_id="calc-000000000001") for k in range(4)]
    df = conform_behaviour(conform_rollouts(pl.DataFrame(rows)))
    res = _run("tool_mix", _ev(df))
    assert [f.code for f in res.findings] == ["no_valid_tool_calls"] and res.metrics["edit_ratio"] == 0.0
