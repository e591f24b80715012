"""The promotion gate over a real temp store with val rollouts."""
from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from evotrainer import gate, stats
from evotrainer.errors import EvoTrainerError
from evotrainer.schema import Decision, Finding, finding_id
from evotrainer.testing import synthetic_rollouts, temp_store

STEP = 10  # both versions evaluated at the same step -> the same item_ids


@pytest.fixture
def camp(tmp_path):
    return temp_store(tmp_path / "c")


def add_val(store, version, *, p, n_items=60, k=4, step=STEP, seed=None):
    df = synthetic_rollouts(store.campaign.name, version, "val", step, n_groups=n_items, group_size=k,
                            p_correct=p, seed=seed if seed is not None else int(version[1:]))
    store.append_rollouts(version, "val", step, df)
    return df


def veto_finding(version="v001"):
    return Finding(
        finding_id=finding_id("behaviour", "git_leak", (version,), None),
        diagnostic="behaviour", code="git_leak", severity="critical",
        message="42% of trajectories run git log", versions=(version,), veto=True,
    )


def test_items_line_up_across_versions(camp):
    a = add_val(camp, "v000", p=0.3, seed=1)
    b = add_val(camp, "v001", p=0.7, seed=2)
    assert sorted(set(a["item_id"])) == sorted(set(b["item_id"]))
    joined, info = gate.paired_item_scores(camp.rollouts("v001", "val"), camp.rollouts("v000", "val"))
    assert info["shared_items"] == 60 == joined.height
    assert (joined["n_cand"] == 4).all() and (joined["n_base"] == 4).all()
    # per-item scores equal evidence.per_item_scores' share correct
    from evotrainer.evidence import per_item_scores

    ref = per_item_scores(b).select("item_id", "score").sort("item_id")
    assert joined.select("item_id", "score_cand").sort("item_id")["score_cand"].to_list() == ref["score"].to_list()


def test_compare_stats(camp):
    add_val(camp, "v000", p=0.3, seed=1)
    add_val(camp, "v001", p=0.7, seed=2)
    rule = gate.GateRule()
    s = gate.compare(camp.rollouts("v001", "val"), camp.rollouts("v000", "val"), rule)
    assert s.n_items == 60 and s.k_candidate == 4 and s.k_baseline == 4
    assert s.mean_delta == pytest.approx(s.mean_candidate - s.mean_baseline)
    joined, _ = gate.paired_item_scores(camp.rollouts("v001", "val"), camp.rollouts("v000", "val"))
    d = joined["delta"].to_numpy()
    assert (s.ci_low, s.ci_high) == stats.paired_bootstrap_ci(d, B=rule.B, seed=rule.seed, level=rule.level)
    assert s.p_wilcoxon == stats.wilcoxon_signed_rank(d)
    assert s.effect_size == pytest.approx(stats.paired_cohens_d(d))
    assert s.p_mcnemar is None  # k > 1
    assert s.bootstrap_b == 10_000 and s.bootstrap_seed == 0 and s.ci_level == 0.95


def test_compare_uses_each_versions_final_eval_step(camp):
    # v000 evaluated at steps 5 and 10: only step 10 counts. Items differ by step, so use
    # a DataFrame with the step-5 items renamed to the step-10 ones to see which step is used.
    good = add_val(camp, "v001", p=0.9, seed=3)
    early = synthetic_rollouts("test", "v000", "val", 5, n_groups=60, group_size=4, p_correct=0.95, seed=4)
    early = early.with_columns(item_id=pl.Series(good["item_id"].to_list()))
    late = synthetic_rollouts("test", "v000", "val", STEP, n_groups=60, group_size=4, p_correct=0.1, seed=5)
    base = pl.concat([early, late])
    s = gate.compare(good, base)
    assert s.mean_baseline == pytest.approx(late["correct"].mean())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # testing.py: advantage std of 1-sample groups
def test_binary_outcomes_get_mcnemar(camp):
    add_val(camp, "v000", p=0.3, k=1, n_items=200, seed=1)
    add_val(camp, "v001", p=0.6, k=1, n_items=200, seed=2)
    s = gate.compare(camp.rollouts("v001", "val"), camp.rollouts("v000", "val"))
    assert s.k_candidate == s.k_baseline == 1
    joined, _ = gate.paired_item_scores(camp.rollouts("v001", "val"), camp.rollouts("v000", "val"))
    b = int(((joined["c_cand"] == 1) & (joined["c_base"] == 0)).sum())
    c = int(((joined["c_cand"] == 0) & (joined["c_base"] == 1)).sum())
    import scipy.stats

    assert s.p_mcnemar == pytest.approx(scipy.stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-12)
    assert s.p_mcnemar < 0.01


def test_first_version_promotes(camp):
    add_val(camp, "v000", p=0.3)
    d = gate.decide(camp, "v000", None)
    assert d.outcome == "promote" and d.stats is None and d.baseline is None
    assert "first version" in d.reason


def test_clear_improvement_promotes(camp):
    add_val(camp, "v000", p=0.2, seed=1)
    add_val(camp, "v001", p=0.8, seed=2)
    d = gate.decide(camp, "v001", "v000")
    assert d.outcome == "promote"
    assert d.stats.ci_low > 0 and d.stats.mean_delta > 0.4
    assert d.stats.k_candidate == d.stats.k_baseline == 4
    assert "promote" in d.reason and "CI" in d.reason
    assert d.rule == gate.GateRule().describe()
    camp.write_decision(d)
    assert camp.decisions() == [d]


def test_clear_regression_rejects(camp):
    add_val(camp, "v000", p=0.8, seed=1)
    add_val(camp, "v001", p=0.2, seed=2)
    d = gate.decide(camp, "v001", "v000")
    assert d.outcome == "reject" and d.stats.ci_high < 0
    assert d.stats.p_wilcoxon < 1e-6


def test_noise_is_inconclusive(camp):
    add_val(camp, "v000", p=0.5, seed=1, n_items=40)
    add_val(camp, "v001", p=0.5, seed=2, n_items=40)
    d = gate.decide(camp, "v001", "v000")
    assert d.outcome == "inconclusive"
    assert d.stats.ci_low <= 0 <= d.stats.ci_high
    assert "keep v000" in d.reason


def test_identical_evidence_is_inconclusive_with_undefined_wilcoxon(camp):
    add_val(camp, "v000", p=0.5, seed=7)
    add_val(camp, "v001", p=0.5, seed=7)  # same draws -> every delta is 0
    d = gate.decide(camp, "v001", "v000")
    assert d.outcome == "inconclusive"
    assert d.stats.ci_low == d.stats.ci_high == 0.0
    assert d.stats.p_wilcoxon is None and d.stats.effect_size is None
    assert "Wilcoxon undefined" in d.reason


def test_veto_wins_over_a_big_improvement(camp):
    add_val(camp, "v000", p=0.1, seed=1)
    add_val(camp, "v001", p=0.95, seed=2)
    f = veto_finding()
    harmless = f.model_copy(update={"finding_id": "f-harmless", "veto": False, "code": "note"})
    d = gate.decide(camp, "v001", "v000", vetoes=[f, harmless])
    assert d.outcome == "vetoed"
    assert d.vetoes == (f.finding_id,)
    assert f.finding_id in d.reason and "veto" in d.reason and "git_leak" in d.reason
    assert d.stats is not None and d.stats.ci_low > 0  # recorded, not used
    # without the veto the same evidence promotes
    assert gate.decide(camp, "v001", "v000", vetoes=[harmless]).outcome == "promote"


def test_veto_without_evidence_still_decides(camp):
    add_val(camp, "v000", p=0.3)
    d = gate.decide(camp, "v001", "v000", vetoes=[veto_finding()])  # v001 has no val rollouts
    assert d.outcome == "vetoed" and d.stats is None and "no val rollouts" in d.reason
    first = gate.decide(camp, "v000", None, vetoes=[veto_finding("v000")])
    assert first.outcome == "vetoed"


def test_determinism_and_ids(camp):
    add_val(camp, "v000", p=0.4, seed=1)
    add_val(camp, "v001", p=0.6, seed=2)
    a = gate.decide(camp, "v001", "v000")
    b = gate.decide(camp, "v001", "v000")
    assert a.stats == b.stats and a.decision_id == b.decision_id
    other_seed = gate.decide(camp, "v001", "v000", rule=gate.GateRule(seed=1))
    joined, _ = gate.paired_item_scores(camp.rollouts("v001", "val"), camp.rollouts("v000", "val"))
    d = joined["delta"].to_numpy()
    assert (other_seed.stats.ci_low, other_seed.stats.ci_high) == stats.paired_bootstrap_ci(d, seed=1)
    assert other_seed.stats.bootstrap_seed == 1
    assert other_seed.decision_id != a.decision_id
    vetoed = gate.decide(camp, "v001", "v000", vetoes=[veto_finding()])
    assert vetoed.decision_id != a.decision_id
    assert a.decision_id.startswith("d-")
    # decided_by is who, not what: it does not change the id
    assert gate.decide(camp, "v001", "v000", decided_by="alice").decision_id == a.decision_id


def test_too_few_shared_items_is_a_clear_error(camp):
    add_val(camp, "v000", p=0.5, n_items=30, step=10)
    add_val(camp, "v001", p=0.5, n_items=30, step=11)  # other step -> other items
    with pytest.raises(gate.GateError) as exc:
        gate.decide(camp, "v001", "v000")
    msg = str(exc.value)
    assert isinstance(exc.value, EvoTrainerError)
    assert "v001 has 30 val items" in msg and "v000 has 30" in msg and "0 shared" in msg
    assert "min_items=5" in msg

    # 3 shared items: still too few for min_items=5, fine for min_items=3
    base = synthetic_rollouts("test", "v000", "val", 10, n_groups=3, group_size=2)
    cand = synthetic_rollouts("test", "v001", "val", 10, n_groups=8, group_size=2, seed=9)
    with pytest.raises(gate.GateError, match="3 shared"):
        gate.compare(cand, base)
    assert gate.compare(cand, base, gate.GateRule(min_items=3)).n_items == 3


def test_missing_evidence_and_bad_arguments(camp):
    add_val(camp, "v000", p=0.5)
    with pytest.raises(gate.GateError, match="v001 has no val rollouts"):
        gate.decide(camp, "v001", "v000")
    with pytest.raises(gate.GateError, match="both v000"):
        gate.decide(camp, "v000", "v000")
    mixed = pl.concat([synthetic_rollouts("test", v, "val", 10, n_groups=8, group_size=2) for v in ("v000", "v001")])
    with pytest.raises(gate.GateError, match="mix versions"):
        gate.compare(mixed, mixed)
    with pytest.raises(ValueError):
        gate.GateRule(promote_if_ci_low_above=-0.1, reject_if_ci_high_below=0.1)


def test_rule_describe_and_thresholds(camp):
    rule = gate.GateRule(promote_if_ci_low_above=0.02, reject_if_ci_high_below=-0.02, level=0.9)
    text = rule.describe()
    assert "90% CI low" in text and "> 0.02" in text and "< -0.02" in text and "B=10000" in text
    add_val(camp, "v000", p=0.2, seed=1)
    add_val(camp, "v001", p=0.8, seed=2)
    d = gate.decide(camp, "v001", "v000", rule=gate.GateRule(promote_if_ci_low_above=0.9))
    assert d.outcome == "inconclusive"  # a real gain, but below a demanding threshold


def _dec(candidate, baseline, outcome, minutes):
    t = (dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=minutes)).isoformat()
    return Decision(decision_id=f"d-{candidate}-{minutes}", candidate=candidate, baseline=baseline,
                    outcome=outcome, stats=None, rule="r", created_at=t)


def test_best_version_follows_the_chain():
    assert gate.best_version([]) is None
    chain = [
        _dec("v000", None, "promote", 0),
        _dec("v001", "v000", "promote", 1),
        _dec("v002", "v001", "reject", 2),
        _dec("v003", "v001", "inconclusive", 3),
        _dec("v004", "v001", "promote", 4),
        _dec("v005", "v004", "vetoed", 5),
        _dec("v006", "v000", "promote", 6),  # stale: beat v000, which is no longer the best
    ]
    assert gate.best_version(chain) == "v004"
    assert gate.best_version(list(reversed(chain))) == "v004"  # time order, not input order
    # a later non-promote decision on a pair in the chain (a veto found afterwards) rolls back
    assert gate.best_version(chain + [_dec("v004", "v001", "vetoed", 9)]) == "v001"
    assert gate.best_version(chain + [_dec("v001", "v000", "vetoed", 9)]) == "v000"
    # ... and the chain grows again from there
    assert gate.best_version(chain + [_dec("v004", "v001", "vetoed", 9),
                                      _dec("v008", "v001", "promote", 10)]) == "v008"
    # a non-promote decision on a pair outside the chain changes nothing
    assert gate.best_version(chain + [_dec("v004", "v000", "reject", 9)]) == "v004"
    # a vetoed first version leaves no best; a later valid first version starts the chain
    assert gate.best_version([_dec("v000", None, "vetoed", 0)]) is None
    assert gate.best_version([_dec("v000", None, "vetoed", 0), _dec("v001", None, "promote", 1)]) == "v001"


def test_best_version_from_stored_decisions(camp):
    add_val(camp, "v000", p=0.2, seed=1)
    add_val(camp, "v001", p=0.8, seed=2)
    add_val(camp, "v002", p=0.1, seed=3)
    for cand, base in (("v000", None), ("v001", "v000"), ("v002", "v001")):
        camp.write_decision(gate.decide(camp, cand, base))
    outcomes = {d.candidate: d.outcome for d in camp.decisions()}
    assert outcomes == {"v000": "promote", "v001": "promote", "v002": "reject"}
    assert gate.best_version(camp.decisions()) == "v001"


def test_core_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, evotrainer.gate, evotrainer.stats; print(any(m in sys.modules for m in ('torch','trl')))"
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip() == "False"


def test_gate_error_message_counts_item_sides():
    cand = synthetic_rollouts("test", "v001", "val", 10, n_groups=4, group_size=3)
    base = synthetic_rollouts("test", "v000", "val", 10, n_groups=6, group_size=3)
    with pytest.raises(gate.GateError) as exc:
        gate.compare(cand, base)
    assert "v001 has 4 val items" in str(exc.value) and "v000 has 6" in str(exc.value)
    assert "4 shared" in str(exc.value)
    assert np.isfinite(gate.compare(cand, base, gate.GateRule(min_items=4)).mean_delta)
