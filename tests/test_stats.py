"""evotrainer.stats against scipy and slow pure-Python references."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats

from evotrainer import stats as st

# --------------------------------------------------------------------------- Wilcoxon


def _scipy_wilcoxon(d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scipy.stats.wilcoxon(d)


def _random_deltas(rng, i):
    # Small n stops at 10: scipy's exhaustive sign-flip test costs ~2^n (0.8 s at n = 13); the
    # boundary sizes 13 and 14 are in test_wilcoxon_branches.
    n = int(rng.integers(1, 11)) if i % 2 == 0 else int(rng.integers(11, 130))
    kind = (i // 2) % 5
    if kind == 0:  # continuous: no zeros, no ties
        return rng.normal(size=n)
    if kind == 1:  # coarse: many zeros and ties
        return rng.integers(-3, 4, size=n) / 4
    if kind == 2:  # rounded: ties, some zeros
        return np.round(rng.normal(size=n), 1)
    if kind == 3:  # what the gate produces: share-correct differences at k = 8
        return (rng.integers(0, 9, size=n) - rng.integers(0, 9, size=n)) / 8
    return rng.normal(0.5, 1.0, size=n)  # shifted


def test_wilcoxon_matches_scipy_on_random_cases():
    rng = np.random.default_rng(1234)
    methods: dict[str, int] = {}
    for i in range(700):
        d = _random_deltas(rng, i)
        ours = st.wilcoxon_test(d)
        if np.all(d == 0):
            assert ours.p is None and "zero" in ours.reason
            continue
        ref = _scipy_wilcoxon(d)
        methods[ours.method] = methods.get(ours.method, 0) + 1
        assert ours.p == pytest.approx(ref.pvalue, rel=1e-12, abs=0), (d, ours, ref)
        assert ours.statistic == pytest.approx(ref.statistic, rel=1e-12)
        assert st.wilcoxon_signed_rank(d) == ours.p
    # every branch of scipy's method="auto" was exercised
    assert set(methods) == {"exact", "permutation", "normal"}
    assert min(methods.values()) > 60


@pytest.mark.parametrize(
    "d, method",
    [
        ([0.5, -0.25, 0.75, 1.0, 0.125], "exact"),  # small, no zeros/ties
        ([0.5, 0.5, -0.25, 0.0, 1.0, 0.75], "permutation"),  # small, zeros and ties
        (list(np.linspace(-1, 3, 50)), "exact"),  # n = 50, still exact
        ([0.25] * 5 + [-0.25] * 3 + [0.0] * 2 + [0.5] * 3, "permutation"),  # n = 13 with ties
        ([0.25] * 5 + [-0.25] * 3 + [0.0] * 2 + [0.5] * 4, "normal"),  # n = 14 with ties
        (list(np.random.default_rng(1).normal(size=13)), "exact"),  # n = 13, no ties
        ([0.25] * 10 + [-0.25] * 4 + [0.0] * 3 + [0.5] * 5, "normal"),  # 13 < n <= 50 with ties
        (list(np.random.default_rng(2).normal(size=51)), "normal"),  # n = 51, no ties
        (list(np.random.default_rng(0).normal(0.3, 1, 200)), "normal"),  # large n
    ],
)
def test_wilcoxon_branches(d, method):
    ours = st.wilcoxon_test(d)
    assert ours.method == method
    assert ours.p == pytest.approx(_scipy_wilcoxon(d).pvalue, rel=1e-12)


def test_wilcoxon_undefined_cases():
    for d in ([], [0.0], [0.0] * 5, [0.0] * 80):
        r = st.wilcoxon_test(d)
        assert r.p is None and r.reason
        assert st.wilcoxon_signed_rank(d) is None
    assert st.wilcoxon_test([1.0, float("nan")]).p is None
    # a single non-zero delta is defined (p = 1), as in scipy
    assert st.wilcoxon_signed_rank([0.3]) == pytest.approx(_scipy_wilcoxon([0.3]).pvalue)


# --------------------------------------------------------------------------- bootstrap


def _reference_bootstrap_ci(deltas, B, seed, level):
    """Slow pure-Python percentile bootstrap, drawing the same indices one replicate at a time."""
    rng = np.random.Generator(np.random.PCG64(seed))
    n = len(deltas)
    means = []
    for _ in range(B):
        idx = rng.integers(0, n, size=n)  # the same stream as the chunked (B, n) draw
        means.append(math.fsum(deltas[int(j)] for j in idx) / n)
    means.sort()

    def quantile(q):  # numpy's default "linear" method
        h = (B - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, B - 1)
        return means[lo] + (h - lo) * (means[hi] - means[lo])

    alpha = 1 - level
    return quantile(alpha / 2), quantile(1 - alpha / 2)


@pytest.mark.parametrize("n, B, seed, level", [(7, 500, 0, 0.95), (40, 2000, 3, 0.9), (300, 1500, 11, 0.99)])
def test_bootstrap_matches_pure_python_reference(n, B, seed, level):
    rng = np.random.default_rng(n)
    deltas = list((rng.integers(0, 5, n) - rng.integers(0, 5, n)) / 4 + rng.normal(0, 0.01, n))
    low, high = st.paired_bootstrap_ci(deltas, B=B, seed=seed, level=level)
    ref_low, ref_high = _reference_bootstrap_ci(deltas, B, seed, level)
    assert low == pytest.approx(ref_low, abs=1e-12)
    assert high == pytest.approx(ref_high, abs=1e-12)


def test_bootstrap_draws_do_not_depend_on_chunking(monkeypatch):
    d = np.random.default_rng(5).normal(size=53)
    whole = st.bootstrap_means(d, B=1000, seed=9)
    monkeypatch.setattr(st, "_CHUNK_ELEMENTS", 53 * 7)  # 7 rows a chunk, a ragged last chunk
    chunked = st.bootstrap_means(d, B=1000, seed=9)
    np.testing.assert_array_equal(whole, chunked)


def test_bootstrap_deterministic_and_seed_sensitive():
    d = np.random.default_rng(0).normal(0.1, 1, 120)
    assert st.paired_bootstrap_ci(d, seed=4) == st.paired_bootstrap_ci(d, seed=4)
    assert st.paired_bootstrap_ci(d, seed=4) != st.paired_bootstrap_ci(d, seed=5)


def test_bootstrap_coverage_sanity():
    rng = np.random.default_rng(42)
    shifted = rng.normal(0.3, 0.5, 200)  # known positive shift
    low, high = st.paired_bootstrap_ci(shifted)
    assert 0 < low < shifted.mean() < high
    negative = rng.normal(-0.3, 0.5, 200)
    assert st.paired_bootstrap_ci(negative)[1] < 0
    # centred noise: over repeated samples the 90% CI covers the true mean 0 most of the time
    covered = 0
    for i in range(200):
        x = rng.normal(0, 1, 60)
        lo, hi = st.paired_bootstrap_ci(x, B=1000, seed=i, level=0.9)
        covered += lo <= 0 <= hi
    assert 0.8 <= covered / 200 <= 0.97
    # wider level -> wider interval; constant deltas -> a point
    lo90, hi90 = st.paired_bootstrap_ci(shifted, level=0.9)
    assert lo90 >= low and hi90 <= high
    assert st.paired_bootstrap_ci([0.25] * 10) == (0.25, 0.25)


def test_bootstrap_input_errors():
    with pytest.raises(ValueError):
        st.paired_bootstrap_ci([])
    with pytest.raises(ValueError):
        st.paired_bootstrap_ci([1.0, float("nan")])
    with pytest.raises(ValueError):
        st.paired_bootstrap_ci([1.0, 2.0], level=1.0)
    with pytest.raises(ValueError):
        st.paired_bootstrap_ci([1.0, 2.0], B=0)



# --------------------------------------------------------------------------- McNemar, Cohen's d


def test_mcnemar_matches_binomtest():
    for b in range(41):
        for c in range(41):
            if b + c == 0:
                assert st.mcnemar_exact(0, 0) is None
                continue
            ref = scipy.stats.binomtest(b, b + c, 0.5).pvalue
            assert st.mcnemar_exact(b, c) == pytest.approx(ref, rel=1e-12), (b, c)
    for b, c in [(120, 160), (700, 650), (3, 300)]:
        assert st.mcnemar_exact(b, c) == pytest.approx(scipy.stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)
    assert st.mcnemar_exact(4, 4) == 1.0
    with pytest.raises(ValueError):
        st.mcnemar_exact(-1, 3)


def test_paired_cohens_d():
    d = np.array([0.1, 0.4, -0.2, 0.5, 0.3])
    assert st.paired_cohens_d(d) == pytest.approx(d.mean() / d.std(ddof=1))
    assert st.paired_cohens_d([0.2]) is None
    assert st.paired_cohens_d([0.2, 0.2, 0.2]) is None
