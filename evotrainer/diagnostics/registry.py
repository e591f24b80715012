"""The diagnostic registry and the Evidence a diagnostic reads.

A diagnostic is a plain function registered by name:

    @register("dead_groups", dimension="results", thresholds={"warning": 0.3, "critical": 0.5})
    def dead_groups(ev: Evidence) -> DiagnosticResult: ...

It reads lazy polars frames from `ev` and returns metrics over the version under diagnosis
(`ev.version`, the LAST of `ev.versions`), per-step series, and findings (`schema.Finding`, made with
`ev.finding(...)` so the id is `schema.finding_id(...)`). `run(name, ev)` never raises: an exception
becomes a `diagnostic_error` finding. A diagnostic registered with `validity=True` is a validity check:
its critical findings carry `veto=True` (they block promotion whatever the score).

Thresholds: each diagnostic declares its defaults at registration; `ev.th("dead_groups.warning")`
returns the caller's override from `Evidence.thresholds` or the default. An override with an unknown
key is an error (a typo must not silently keep the default).

Shared per-rollout features (`ev.features()`, `ev.groups()`, `ev.text_sample()`) are computed once
per Evidence and cached, so twenty diagnostics do not scan the parquet files twenty times.
"""
from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from ..schema import Finding, Severity, finding_id

Dimension = Literal["results", "behaviour", "efficiency", "model_state", "format", "data"]
DIMENSIONS: tuple[str, ...] = ("results", "behaviour", "efficiency", "model_state", "format", "data")

# Completion text is read for a sample of whole steps, about this many rows per version and split.
# Decoding and tokenising every completion of a 1M-rollout version costs seconds; a 64k sample
# estimates a rate to within ~0.4pp (95%), and whole steps keep whole groups for duplicate counts.
TEXT_SAMPLE_CAP = 65_536
MIN_WORDS_FOR_REPETITION = 8  # shorter completions are not judged for repetition (ratio is trivially high)


# --------------------------------------------------------------------------- results


@dataclass
class DiagnosticResult:
    """What one diagnostic saw over the version under diagnosis.

    metrics: name -> value over the whole version (None: not computable, e.g. no rows);
    per_step: metric -> {step: value} over the version's training (or evaluation) steps;
    findings: schema.Finding, made with `Evidence.finding`.
    """

    metrics: dict[str, float | None] = field(default_factory=dict)
    per_step: dict[str, dict[int, float | None]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


DiagnosticFn = Callable[["Evidence"], DiagnosticResult]


@dataclass(frozen=True)
class DiagnosticInfo:
    name: str
    fn: DiagnosticFn
    dimension: str
    validity: bool = False
    description: str = ""
    thresholds: Mapping[str, float] = field(default_factory=dict)
    rule: str | None = None  # "R1".."R6" for the paper's rules


_REGISTRY: dict[str, DiagnosticInfo] = {}


def register(name: str, *, dimension: Dimension, validity: bool = False, description: str = "",
             thresholds: Mapping[str, float] | None = None, rule: str | None = None,
             replace: bool = False) -> Callable[[DiagnosticFn], DiagnosticFn]:
    """Decorator: register `fn(ev: Evidence) -> DiagnosticResult` under `name`.

    Re-registering a name with another function is refused unless `replace=True` (a diagnostic
    written during a campaign may supersede a built-in only on purpose).
    """
    if dimension not in DIMENSIONS:
        raise ValueError(f"unknown dimension {dimension!r}; expected one of {DIMENSIONS}")
    if not name or "/" in name:
        raise ValueError(f"bad diagnostic name {name!r} (non-empty, no '/')")

    def deco(fn: DiagnosticFn) -> DiagnosticFn:
        old = _REGISTRY.get(name)
        if old is not None and old.fn is not fn and not replace:
            raise ValueError(f"diagnostic {name!r} is already registered; pass replace=True to supersede it")
        _REGISTRY[name] = DiagnosticInfo(name=name, fn=fn, dimension=dimension, validity=validity,
                                         description=description or (fn.__doc__ or "").strip().split("\n")[0],
                                         thresholds=dict(thresholds or {}), rule=rule)
        return fn

    return deco


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> DiagnosticInfo:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown diagnostic {name!r}; known: {known()}") from None


def known(dimension: str | None = None) -> list[str]:
    """Registered names in registration order (built-ins first, rules last)."""
    return [n for n, d in _REGISTRY.items() if dimension is None or d.dimension == dimension]


def default_thresholds() -> dict[str, float]:
    """Every threshold key ("<diagnostic>.<key>") with its default."""
    return {f"{n}.{k}": v for n, d in _REGISTRY.items() for k, v in d.thresholds.items()}


def run(name: str, ev: Evidence) -> DiagnosticResult:
    """Run one diagnostic; an exception becomes a `diagnostic_error` finding, never a crash."""
    info = get(name)
    try:
        res = info.fn(ev)
        if not isinstance(res, DiagnosticResult):
            raise TypeError(f"returned {type(res).__name__}, expected DiagnosticResult")
    except Exception as exc:  # noqa: BLE001 - a broken diagnostic must not take the health report down
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
        msg = f"diagnostic {name} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"
        if info.validity:
            msg += "; this validity check did not run, so the version's validity is unchecked on it"
        return DiagnosticResult(findings=[ev.finding(name, "diagnostic_error", "warning", msg[:1000])])
    if info.validity:
        res.findings = [f.model_copy(update={"veto": True}) if f.severity == "critical" and not f.veto else f
                        for f in res.findings]
    return res


# --------------------------------------------------------------------------- evidence


@dataclass(eq=False)
class Evidence:
    """Lazy evidence for diagnosing `versions[-1]`, with earlier versions (oldest first) for trends.

    rollouts: contract rows (train and val) of `versions`; metrics: long format (version, step,
    name, value). Rows of versions not listed are ignored.
    """

    rollouts: pl.LazyFrame
    metrics: pl.LazyFrame
    versions: tuple[str, ...]
    thresholds: Mapping[str, float] = field(default_factory=dict)
    max_examples: int = 10
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.versions = tuple(self.versions)
        if not self.versions:
            raise ValueError("Evidence needs at least one version (the last is the one under diagnosis)")
        if len(set(self.versions)) != len(self.versions):
            raise ValueError(f"Evidence versions repeat: {self.versions}")

    @classmethod
    def from_frames(cls, rollouts: pl.DataFrame | pl.LazyFrame, metrics: pl.DataFrame | pl.LazyFrame | None = None,
                    versions: Sequence[str] | None = None, **kw: Any) -> Evidence:
        """Evidence from in-memory frames; `versions` defaults to the rollouts' versions, sorted."""
        lf = rollouts.lazy()
        if versions is None:
            versions = sorted(lf.select(pl.col("version").unique()).collect().to_series().to_list())
        if metrics is None:
            from ..evidence import METRIC_COLUMNS

            metrics = pl.LazyFrame(schema=METRIC_COLUMNS)
        return cls(lf, metrics.lazy(), tuple(versions), **kw)

    @property
    def version(self) -> str:
        return self.versions[-1]

    @property
    def previous(self) -> str | None:
        return self.versions[-2] if len(self.versions) > 1 else None

    def upto(self, version: str) -> Evidence:
        """The same evidence, diagnosing `version` (later versions dropped)."""
        if version not in self.versions:
            raise KeyError(f"version {version} is not in the evidence {self.versions}")
        if version == self.version:
            return self
        i = self.versions.index(version)
        return Evidence(self.rollouts, self.metrics, self.versions[: i + 1], self.thresholds, self.max_examples)

    # ---- thresholds

    def th(self, key: str) -> float:
        """Threshold "<diagnostic>.<key>": the override in `thresholds`, else the registered default."""
        if key in self.thresholds:
            return float(self.thresholds[key])
        name, _, sub = key.partition(".")
        info = _REGISTRY.get(name)
        if info is None or sub not in info.thresholds:
            raise KeyError(f"unknown threshold {key!r}; known: {sorted(default_thresholds())}")
        return float(info.thresholds[sub])

    def check_thresholds(self) -> None:
        unknown = sorted(set(self.thresholds) - set(default_thresholds()))
        if unknown:
            raise KeyError(f"unknown threshold keys {unknown}; known: {sorted(default_thresholds())}")

    # ---- findings

    def finding(self, diagnostic: str, code: str, severity: Severity, message: str, *,
                versions: Sequence[str] | None = None, steps: tuple[int, int] | None = None,
                metric: str | None = None, value: float | None = None, threshold: float | None = None,
                rule: str | None = None, veto: bool = False, rollout_uids: Sequence[str] = ()) -> Finding:
        vs = tuple(versions) if versions is not None else (self.version,)
        steps = (int(steps[0]), int(steps[1])) if steps is not None else None
        return Finding(
            finding_id=finding_id(diagnostic, code, vs, steps), diagnostic=diagnostic, code=code,
            severity=severity, message=message, versions=vs, steps=steps, metric=metric,
            value=None if value is None else float(value), threshold=threshold, rule=rule, veto=veto,
            rollout_uids=tuple(rollout_uids)[: self.max_examples],
        )

    def examples(self, lf: pl.LazyFrame | pl.DataFrame) -> tuple[str, ...]:
        """Up to `max_examples` rollout_uids spread evenly over the (already filtered) rows."""
        k = self.max_examples
        out = (lf.lazy().select("rollout_uid")
               .filter(pl.int_range(pl.len()) % (pl.len() // k).clip(1) == 0).head(k).collect())
        return tuple(out["rollout_uid"].to_list())

    # ---- shared cached frames

    def memo(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def schema(self) -> pl.Schema:
        return self.memo("schema", lambda: self.rollouts.collect_schema())

    def reward_components(self) -> list[str]:
        return [c for c in self.schema().names() if c.startswith("r.")]

    def features(self) -> pl.LazyFrame:
        """One row per rollout of `versions` with the cheap per-rollout features, materialised once.

        Columns: vi (index of the version in `versions`), version, split, step, item_id, group_id,
        sample_idx, rollout_uid, n_completion_tokens, truncated, reward, correct, mean_logprob,
        filtered, r.* components, format_ok (from the verifier JSON; null where absent).
        No text: completions are read only for the text sample.
        """
        return self.memo("features", lambda: _features(self).lazy())

    def text_sample(self) -> pl.LazyFrame:
        """Completion-level features on a sample of whole steps (about TEXT_SAMPLE_CAP rows per version and
        split: every k-th step plus the last; all steps when they fit), so whole groups are kept.

        chash: hash of the completion; bigram_ratio = distinct word bigrams / word bigrams (whitespace
        words), null for completions shorter than MIN_WORDS_FOR_REPETITION words.
        """
        return self.memo("text_sample", lambda: _text_sample(self).lazy())

    def text_groups(self) -> pl.LazyFrame:
        """Per group of the text sample: size n and n_distinct completions."""
        return self.memo("text_groups", lambda: _text_groups(self).lazy())

    def groups(self) -> pl.LazyFrame:
        """One row per GRPO group (all versions, both splits): reward std (N-1, TRL's), size,
        correct count, mean reward, first step."""
        return self.memo("groups", lambda: _groups(self).lazy())

    def train(self, version: str | None = None) -> pl.LazyFrame:
        v = version or self.version
        return self.features().filter((pl.col("version") == v) & (pl.col("split") == "train"))

    def val(self, version: str | None = None) -> pl.LazyFrame:
        v = version or self.version
        return self.features().filter((pl.col("version") == v) & (pl.col("split") == "val"))

    def train_steps(self, version: str | None = None) -> list[int]:
        v = version or self.version
        return self.memo(f"steps:{v}", lambda: sorted(
            self.train(v).select(pl.col("step").unique()).collect().to_series().to_list()))

    def step_range(self, version: str | None = None) -> tuple[int, int] | None:
        s = self.train_steps(version)
        return (s[0], s[-1]) if s else None

    def version_metrics(self, version: str | None = None) -> pl.LazyFrame:
        v = version or self.version
        return self.metrics.filter(pl.col("version") == v)


def _features(ev: Evidence) -> pl.DataFrame:
    names = ev.schema().names()
    base = ["version", "split", "step", "item_id", "group_id", "sample_idx", "rollout_uid", "n_completion_tokens",
            "truncated", "reward", "correct", "mean_logprob", "filtered"]
    cols = [pl.col(c) for c in base if c in names]
    cols += [pl.col(c) for c in ev.reward_components()]
    if "verifier" in names:
        # json.dumps writes `"format_ok": true`; a regex is ~3x cheaper than a JSON path over 1M rows.
        fmt = pl.col("verifier").str.extract(r'"format_ok"\s*:\s*(true|false)', 1)
        cols.append(pl.when(fmt.is_null()).then(None).otherwise(fmt == "true").alias("format_ok"))
    else:
        cols.append(pl.lit(None, dtype=pl.Boolean).alias("format_ok"))
    vmap = {v: i for i, v in enumerate(ev.versions)}
    return (ev.rollouts.filter(pl.col("version").is_in(list(ev.versions)))
            .select(cols)
            .with_columns(pl.col("version").replace_strict(vmap, return_dtype=pl.Int32).alias("vi"))
            .collect())


def _sample_plan(counts: pl.DataFrame, cap: int) -> tuple[list[tuple[int, str, list[int]]], int]:
    """Per (version index, split): the steps to read (every k-th, plus the last) and a group stride."""
    plan, stride = [], 1
    for (vi, split), part in counts.sort("step").group_by(["vi", "split"], maintain_order=True):
        steps, ns = part["step"].to_list(), part["n"].to_list()
        k = max(1, -(-sum(ns) // cap))
        chosen = sorted(set(steps[::k]) | {steps[-1]})
        plan.append((int(vi), str(split), chosen))
        rows = sum(n for s, n in zip(steps, ns) if s in set(chosen))
        stride = max(stride, -(-rows // (2 * cap)))  # a few huge steps: thin them by whole groups
    return plan, stride


def _text_sample(ev: Evidence) -> pl.DataFrame:
    names = ev.schema().names()
    schema = {"vi": pl.Int32, "version": pl.String, "split": pl.String, "step": pl.Int32, "group_id": pl.String,
              "rollout_uid": pl.String, "chash": pl.UInt64, "n_words": pl.UInt32, "bigram_ratio": pl.Float64}
    if "completion" not in names:
        return pl.DataFrame(schema=schema)
    counts = ev.features().group_by("vi", "split", "step").agg(n=pl.len()).collect()
    if counts.height == 0:
        return pl.DataFrame(schema=schema)
    cur = len(ev.versions) - 1
    cols = ["version", "split", "step", "group_id", "rollout_uid", "completion"]
    parts = []
    # The version under diagnosis gets the full cap; earlier versions (trend evidence: version-level rates
    # only) a quarter of it.
    for is_cur, cap in ((True, TEXT_SAMPLE_CAP), (False, max(1, TEXT_SAMPLE_CAP // 4))):
        sub = counts.filter((pl.col("vi") == cur) if is_cur else (pl.col("vi") != cur))
        if sub.height == 0:
            continue
        plan, stride = _sample_plan(sub, cap)
        # One simple predicate per (version, split): step predicates prune whole files by their parquet
        # statistics, so the completions of unsampled steps are never decoded (an OR of them would not).
        for vi, split, steps in plan:
            lf = ev.rollouts.filter((pl.col("version") == ev.versions[vi]) & (pl.col("split") == split)
                                    & pl.col("step").is_in(steps)).select(cols)
            if stride > 1:
                lf = lf.filter(pl.col("group_id").rank("dense") % stride == 0)
            parts.append(lf)
    lf = pl.concat(parts)
    # Whitespace words. Literal replacements + filtering empty tokens: ~4x cheaper than a \s+ regex.
    text = pl.col("completion")
    for ws in ("\n", "\t", "\r"):
        text = text.str.replace_all(ws, " ", literal=True)
    words = text.str.split(" ").list.eval(pl.element().filter(pl.element().str.len_bytes() > 0))
    h = pl.element().hash(seed=11)
    bigrams = pl.col("_w").list.eval(h * 1_000_003 + h.shift(-1)).list.drop_nulls()
    vmap = {v: i for i, v in enumerate(ev.versions)}
    return (lf.with_columns(words.alias("_w"), pl.col("completion").hash(seed=7).alias("chash"))
            .with_columns(pl.col("_w").list.len().alias("n_words"))
            .with_columns(pl.when(pl.col("n_words") >= MIN_WORDS_FOR_REPETITION)
                          .then(bigrams.list.n_unique() / (pl.col("n_words") - 1))
                          .otherwise(None).cast(pl.Float64).alias("bigram_ratio"))
            .with_columns(pl.col("version").replace_strict(vmap, return_dtype=pl.Int32).alias("vi"))
            .select(list(schema))
            .collect())


def _text_groups(ev: Evidence) -> pl.DataFrame:
    return (ev.text_sample().group_by("group_id")
            .agg(pl.col("vi").first(), pl.col("version").first(), pl.col("split").first(), pl.col("step").first(),
                 n=pl.len(), n_distinct=pl.col("chash").n_unique())
            .collect())


def _groups(ev: Evidence) -> pl.DataFrame:
    return (ev.features().group_by("group_id")
            .agg(pl.col("vi").first(), pl.col("version").first(), pl.col("split").first(),
                 pl.col("step").first(), pl.col("item_id").first(),
                 n=pl.len(), std=pl.col("reward").std(ddof=1).fill_null(0.0).fill_nan(0.0),
                 n_correct=pl.col("correct").cast(pl.Int32).sum(),
                 reward_mean=pl.col("reward").mean())
            .collect())


def per_step_dict(df: pl.DataFrame, step_col: str = "step") -> dict[str, dict[int, float | None]]:
    """{column: {step: value}} for every column of a per-step frame except the step column."""
    steps = df[step_col].to_list()
    out: dict[str, dict[int, float | None]] = {}
    for c in df.columns:
        if c == step_col:
            continue
        out[c] = {int(s): (None if v is None else float(v)) for s, v in zip(steps, df[c].to_list())}
    return out


def fnum(x: Any) -> float | None:
    """A plain float or None (NaN and null become None)."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x
