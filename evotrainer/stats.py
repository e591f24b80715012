"""Paired statistics for the promotion gate: pure functions over per-item deltas.

A *delta* is one held-out item's score under the candidate minus its score under the baseline,
so every test here is paired: the items are the unit of resampling and of ranking. Nothing here
reads the store; `evotrainer.gate` turns stored val rollouts into deltas and calls these.

- `paired_bootstrap_ci`: percentile bootstrap CI of the mean delta (items resampled with
  replacement), vectorised in chunks with `numpy.random.Generator(PCG64(seed))`.
- `wilcoxon_signed_rank` / `wilcoxon_test`: two-sided Wilcoxon signed-rank test that reproduces
  `scipy.stats.wilcoxon(deltas)` with its defaults (see `wilcoxon_test` for the rules).
- `mcnemar_exact`: exact McNemar test (binomial on the discordant pairs) for k = 1 outcomes.
- `paired_cohens_d`: mean delta over the sample standard deviation of the deltas.

Only numpy and scipy.special are used (no torch).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr

# Largest number of index draws held in memory at once (int64: 8 MiB per million).
_CHUNK_ELEMENTS = 1 << 20

# scipy.stats.wilcoxon (method="auto") thresholds, as in scipy 1.17 `_wilcoxon.py`:
_EXACT_MAX_N = 50  # n (zeros included) > 50 -> normal approximation
_PERMUTATION_MAX_N = 13  # zeros or ties and n <= 13 -> exact sign-flip permutation test


def _as_deltas(deltas: Sequence[float] | np.ndarray, name: str = "deltas") -> np.ndarray:
    d = np.asarray(deltas, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {d.shape}")
    return d


# --------------------------------------------------------------------------- bootstrap


def bootstrap_means(
    deltas: Sequence[float] | np.ndarray, *, B: int = 10_000, seed: int = 0,
) -> np.ndarray:
    """The B bootstrap means of `deltas` (items resampled with replacement), in draw order.

    Replicate b uses the b-th row of `rng.integers(0, n, size=(B, n))` with
    `rng = Generator(PCG64(seed))`. The draws are made in chunks of rows to bound memory; the
    index stream is the same as one (B, n) draw (and as B successive `integers(0, n, size=n)`
    calls), so the result does not depend on the chunk size.
    """
    d = _as_deltas(deltas)
    n = d.size
    if n < 1:
        raise ValueError("bootstrap needs at least one delta")
    if not np.all(np.isfinite(d)):
        raise ValueError("deltas contain NaN or infinity")
    if int(B) != B or B < 1:
        raise ValueError(f"B must be a positive integer, got {B!r}")
    B = int(B)
    rng = np.random.Generator(np.random.PCG64(seed))
    rows = max(1, _CHUNK_ELEMENTS // n)
    out = np.empty(B, dtype=np.float64)
    for start in range(0, B, rows):
        m = min(rows, B - start)
        idx = rng.integers(0, n, size=(m, n))
        out[start:start + m] = d[idx].mean(axis=1)
    return out


def paired_bootstrap_ci(
    deltas: Sequence[float] | np.ndarray, *, B: int = 10_000, seed: int = 0, level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of per-item deltas.

    Resamples items with replacement B times (see `bootstrap_means` for the exact draws) and
    returns the (1-level)/2 and (1+level)/2 quantiles of the bootstrap means (numpy's default
    "linear" quantile interpolation). Deterministic for a given (deltas, B, seed).
    B = 10,000 over 1,000 items takes well under a second.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    means = bootstrap_means(deltas, B=B, seed=seed)
    alpha = 1.0 - level
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)


# --------------------------------------------------------------------------- Wilcoxon


class WilcoxonResult(NamedTuple):
    """Outcome of `wilcoxon_test`. `p` is None (with `reason`) when the test is undefined."""

    p: float | None
    statistic: float | None  # min(R+, R-), scipy's two-sided statistic
    method: str | None  # "exact", "permutation" or "normal"
    n: int  # deltas given (zeros included)
    n_zero: int
    reason: str = ""


def _rank_abs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) of x and the sizes of its tie groups."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    sizes = np.diff(np.r_[starts, xs.size])
    # rank of a tie group = mean of its 1-based positions
    avg = starts + (sizes + 1) / 2.0
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, sizes)
    return ranks, sizes


def _subset_sum_counts(weights: Sequence[int]) -> list[int]:
    """counts[s] = number of subsets of `weights` (non-negative ints) whose sum is s (exact ints)."""
    total = int(sum(weights))
    counts = [0] * (total + 1)
    counts[0] = 1
    reach = 0
    for w in weights:
        w = int(w)
        for s in range(reach, -1, -1):
            c = counts[s]
            if c:
                counts[s + w] += c
        reach += w
    return counts


def _two_sided_from_counts(counts: list[int], obs: int, m: int) -> float:
    """2 * min(P(S <= obs), P(S >= obs)) clipped to 1, with P = count / 2**m (exact)."""
    le = sum(counts[: obs + 1])
    ge = sum(counts[obs:])
    return min(1.0, 2 * min(le, ge) / 2**m)


def wilcoxon_test(deltas: Sequence[float] | np.ndarray) -> WilcoxonResult:
    """Two-sided Wilcoxon signed-rank test of "the deltas are symmetric about 0".

    Reproduces `scipy.stats.wilcoxon(deltas)` with its defaults (zero_method="wilcox",
    correction=False, method="auto") as implemented in scipy 1.17 (`scipy/stats/_wilcoxon.py`):

    - zeros are dropped from the ranking (but still count in n for the method choice below);
      |d| is ranked with average ranks for ties; R+ = sum of ranks of positive deltas;
    - n > 50 (zeros included): normal approximation, z = (R+ - m(m+1)/4) / se with
      se = sqrt((m(m+1)(2m+1) - sum(t^3 - t)/2) / 24) over the m non-zero deltas and tie group
      sizes t, no continuity correction, p = 2 * Phi(-|z|);
    - n <= 50, no zeros and no ties: the exact null distribution of R+ (2^n sign patterns),
      p = 2 * min(P(R+ <= r), P(R+ >= r)) clipped to 1;
    - zeros or ties and n <= 13: scipy runs an exhaustive sign-flip permutation test (2^n <= 9999
      resamples, so it is exact); computed here exactly by counting sign patterns of the
      non-zero deltas (flipping a zero changes nothing, so the proportions are the same);
    - zeros or ties and 13 < n <= 50: normal approximation as above.

    Undefined cases return p=None with a reason instead of scipy's NaN: no deltas, NaN/inf
    deltas, and all deltas zero (scipy returns 1.0 there for n <= 13 and NaN above; with no
    non-zero delta there is no evidence either way, so the gate reports "undefined").
    """
    d = _as_deltas(deltas)
    n = int(d.size)
    if n < 1:
        return WilcoxonResult(None, None, None, 0, 0, "no deltas")
    if not np.all(np.isfinite(d)):
        return WilcoxonResult(None, None, None, n, 0, "deltas contain NaN or infinity")
    nonzero = d[d != 0]
    m = int(nonzero.size)
    n_zero = n - m
    if m == 0:
        return WilcoxonResult(None, None, None, n, n_zero, f"all {n} deltas are zero (no item changed)")

    ranks, sizes = _rank_abs(np.abs(nonzero))
    pos = nonzero > 0
    r_plus = float(ranks[pos].sum())
    r_minus = float(ranks[~pos].sum())
    statistic = min(r_plus, r_minus)
    has_ties = bool(np.any(sizes > 1))

    if n <= _EXACT_MAX_N and not has_ties and n_zero == 0:
        # Ranks are 1..n; R+ is an integer.
        counts = _subset_sum_counts(range(1, m + 1))
        p = _two_sided_from_counts(counts, round(r_plus), m)
        return WilcoxonResult(p, statistic, "exact", n, n_zero)

    if n <= _PERMUTATION_MAX_N:
        # Average ranks are multiples of 1/2: count subsets of doubled ranks.
        doubled = [round(2 * r) for r in ranks]
        counts = _subset_sum_counts(doubled)
        p = _two_sided_from_counts(counts, round(2 * r_plus), m)
        return WilcoxonResult(p, statistic, "permutation", n, n_zero)

    mean = m * (m + 1.0) * 0.25
    var = m * (m + 1.0) * (2.0 * m + 1.0)
    tie_term = float(np.sum(sizes.astype(np.float64) ** 3 - sizes))
    se = math.sqrt((var - tie_term / 2.0) / 24.0)
    z = (r_plus - mean) / se
    p = float(2.0 * ndtr(-abs(z)))
    return WilcoxonResult(min(p, 1.0), statistic, "normal", n, n_zero)


def wilcoxon_signed_rank(deltas: Sequence[float] | np.ndarray) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value (scipy's defaults), or None when undefined.

    See `wilcoxon_test` for the rules and for the reason when the result is None.
    """
    return wilcoxon_test(deltas).p


# --------------------------------------------------------------------------- McNemar, effect size


def mcnemar_exact(b: int, c: int) -> float | None:
    """Exact two-sided McNemar p-value for paired binary outcomes.

    b = items the candidate solves and the baseline does not; c = the reverse. Under the null
    each discordant item is equally likely to go either way, so p is the two-sided binomial
    test of b successes in b + c trials at 1/2: min(1, 2 * P(X <= min(b, c))) (the same value
    as `scipy.stats.binomtest(b, b + c, 0.5).pvalue`). Computed exactly with integers.
    Returns None when there are no discordant items (b + c = 0: the test is undefined).
    """
    if int(b) != b or int(c) != c or b < 0 or c < 0:
        raise ValueError(f"b and c must be non-negative integers, got {b!r}, {c!r}")
    b, c = int(b), int(c)
    n = b + c
    if n == 0:
        return None
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_cohens_d(deltas: Sequence[float] | np.ndarray) -> float | None:
    """Paired Cohen's d (d_z): mean(deltas) / std(deltas, ddof=1).

    None when it is undefined: fewer than 2 deltas, NaN/inf, or every delta equal (zero spread).
    """
    d = _as_deltas(deltas)
    if d.size < 2 or not np.all(np.isfinite(d)):
        return None
    sd = float(np.std(d, ddof=1))
    # Equal deltas can leave a rounding-level spread (mean of 0.2s is not exactly 0.2).
    if not math.isfinite(sd) or sd <= 1e-12 * float(np.max(np.abs(d))):
        return None
    return float(np.mean(d)) / sd
