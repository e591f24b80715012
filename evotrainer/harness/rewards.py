"""Reward components and the composer: vectorised, shared by training and backtests.

A component is registered by name and computes one value per rollout for a whole frame:

    component(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series

The Series is Float64 with one value per row; null means "not applicable". The frame needs the
columns the component declares (`Component.columns`; for most components only `verifier`, the
domain verifier's raw outcome as a JSON string, stored verbatim in the rollout row). Verifier
fields are read through a `VerifierView`: the JSON column is decoded ONCE per frame, into a
struct of the fields that the components in use declare, and shared by all of them.

`score_frame` adds the `r.<name>` column of each component and `reward`, the weighted sum with
nulls counted as 0, which is TRL 1.16's arithmetic: `(rewards_per_func * weights).nansum(1)`, and
NaN (here null) when every component is null for the row (TRL calls such a row "unscorable",
excludes it from the group baseline and gives it advantage 0; see `advantages.py`).

The same functions serve one training batch (8-64 rows) and a backtest over a million stored
rollouts; `score` is a convenience for one rollout, built on `score_frame`.

Errors: an unknown component is a KeyError naming the known ones; a verifier field a component
requires but a row lacks is `MissingVerifierData` naming the field and the component (a backtest
over versions whose verifiers did not record that field must fail, not score silently); a
verifier column that is not valid JSON of the expected types is `VerifierDataError`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from ..errors import EvoTrainerError
from ..schema import RewardComponentSpec

REWARD_PREFIX = "r."


class VerifierDataError(EvoTrainerError):
    """The `verifier` column cannot be decoded into the fields the reward components read."""


class MissingVerifierData(VerifierDataError):
    """A reward component requires a verifier field that some rows do not carry."""

    def __init__(self, field: str, component: str, n_missing: int, n_rows: int, where: str = ""):
        self.field, self.component, self.n_missing, self.n_rows, self.where = field, component, n_missing, n_rows, where
        loc = f"{where}: " if where else ""
        super().__init__(
            f"{loc}reward component {component!r} needs verifier field {field!r}, which {n_missing} of "
            f"{n_rows} rollouts lack; re-run the verifier for those rollouts or pick a component that "
            f"does not need {field!r}"
        )

    def located(self, where: str) -> MissingVerifierData:
        return MissingVerifierData(self.field, self.component, self.n_missing, self.n_rows, where)


# --------------------------------------------------------------------------- verifier view

# Known verifier fields and the dtype they are decoded to. Numbers decode as Float64 so that
# `2` and `2.0` both read. A component may declare a field not listed here with its own dtype.
VERIFIER_FIELDS: dict[str, pl.DataType] = {
    "correct": pl.Boolean(),
    "format_ok": pl.Boolean(),
    "passed": pl.Float64(),
    "total": pl.Float64(),
    "judge": pl.Float64(),
    "reward": pl.Float64(),
}


_DECODE_SLICE = 65_536  # polars' json_decode slows down super-linearly on one huge chunk


def _json_decode(col: pl.Series, dtype: pl.Struct) -> pl.Series:
    """`col.str.json_decode(dtype)` in slices decoded in parallel (4x faster at 1M rows)."""
    n = col.len()
    if n <= _DECODE_SLICE:
        return col.str.json_decode(dtype)
    frame = col.rename("v").to_frame()
    parts = [frame.slice(i, _DECODE_SLICE).lazy().select(pl.col("v").str.json_decode(dtype))
             for i in range(0, n, _DECODE_SLICE)]
    return pl.concat(parts, parallel=True).collect().to_series()


class VerifierView:
    """The verifier JSON of a frame, decoded once into the requested fields (missing -> null)."""

    def __init__(self, frame: pl.DataFrame, fields: Mapping[str, pl.DataType]):
        self.height = frame.height
        self.fields = dict(fields)
        if "verifier" not in frame.columns:
            raise VerifierDataError("rollout frame has no 'verifier' column; reward components read the verifier outcome")
        if not self.fields:
            self._data = pl.DataFrame()
            return
        col = frame.get_column("verifier")
        if col.dtype != pl.String:
            raise VerifierDataError(f"'verifier' column is {col.dtype}, expected a JSON string")
        try:
            decoded = _json_decode(col, pl.Struct(self.fields))
        except pl.exceptions.PolarsError as exc:
            first = str(exc).splitlines()[0][:200]
            raise VerifierDataError(
                f"the 'verifier' column is not JSON with fields of the expected types {self._types()} ({first}); "
                "check the domain verifier's output"
            ) from exc
        self._data = decoded.struct.unnest()

    def _types(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.fields.items())

    def has(self, name: str) -> bool:
        return name in self.fields

    def get(self, name: str) -> pl.Series:
        """The field as a Series (null where a row lacks it)."""
        if name not in self.fields:
            raise KeyError(f"verifier view was built without field {name!r}; declare it on the component")
        return self._data.get_column(name)

    def require(self, name: str, component: str) -> pl.Series:
        s = self.get(name)
        n_missing = s.null_count()
        if n_missing:
            raise MissingVerifierData(name, component, n_missing, self.height)
        return s


# --------------------------------------------------------------------------- context and registry


@dataclass(frozen=True)
class RewardContext:
    """What a component may need beyond the rows. `view` is filled by `score_frame`."""

    max_completion_length: int | None = None
    view: VerifierView | None = field(default=None, compare=False, repr=False)

    def verifier(self, frame: pl.DataFrame, fields: Mapping[str, pl.DataType]) -> VerifierView:
        """The shared view if it covers `fields` for this frame, else a fresh decode."""
        v = self.view
        if v is not None and v.height == frame.height and all(f in v.fields for f in fields):
            return v
        return VerifierView(frame, fields)


ComponentFn = Callable[[pl.DataFrame, Mapping[str, float], RewardContext], pl.Series]


@dataclass(frozen=True)
class Component:
    """A registered reward component: the vectorised function plus what it reads.

    requires: verifier fields every row must carry (else MissingVerifierData);
    uses: optional verifier fields (null when absent);
    columns: frame columns it reads besides `verifier`;
    params: accepted parameters and their defaults (an unknown parameter is an error).
    """

    name: str
    fn: ComponentFn
    requires: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    params: Mapping[str, float] = field(default_factory=dict)
    doc: str = ""

    @property
    def fields(self) -> dict[str, pl.DataType]:
        return {f: VERIFIER_FIELDS.get(f, pl.Float64()) for f in (*self.requires, *self.uses)}

    @property
    def frame_columns(self) -> tuple[str, ...]:
        return (("verifier",) if self.fields else ()) + self.columns

    def resolve_params(self, params: Mapping[str, float] | None) -> dict[str, float]:
        params = dict(params or {})
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise ValueError(
                f"reward component {self.name!r} has no parameter(s) {unknown}; known: {sorted(self.params) or 'none'}"
            )
        return {**self.params, **params}

    def __call__(self, *args: Any, **kwargs: Any):
        """`component(frame, params, ctx) -> Series`; transitional: `component(verifier_dict, completion)
        -> float | None` scores one rollout with default params (callers are moving to score_frame)."""
        if args and isinstance(args[0], Mapping):
            verifier, completion = args[0], (args[1] if len(args) > 1 else kwargs.get("completion", ""))
            _, values = score((RewardComponentSpec(name=self.name),), verifier, completion)
            return values[self.name]
        frame, params, ctx = (list(args) + [None, None, None])[:3]
        frame = kwargs.get("frame", frame)
        params = kwargs.get("params", params)
        ctx = kwargs.get("ctx", ctx) or RewardContext()
        return self.compute(frame, params, ctx)

    def compute(self, frame: pl.DataFrame, params: Mapping[str, float] | None, ctx: RewardContext) -> pl.Series:
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise ValueError(f"reward component {self.name!r} needs frame columns {missing}")
        out = self.fn(frame, self.resolve_params(params), ctx)
        if out.len() != frame.height:
            raise ValueError(f"reward component {self.name!r} returned {out.len()} values for {frame.height} rows")
        out = out.cast(pl.Float64).alias(REWARD_PREFIX + self.name)
        if out.len() and not out.drop_nulls().is_finite().all():
            raise ValueError(f"reward component {self.name!r} returned a non-finite value")
        return out


_REGISTRY: dict[str, Component] = {}


def register(
    name: str, *, requires: Sequence[str] = (), uses: Sequence[str] = (), columns: Sequence[str] = (),
    params: Mapping[str, float] | None = None,
) -> Callable[[ComponentFn], Component]:
    def deco(fn: ComponentFn) -> Component:
        comp = Component(name=name, fn=fn, requires=tuple(requires), uses=tuple(uses), columns=tuple(columns),
                         params=dict(params or {}), doc=(fn.__doc__ or "").strip())
        old = _REGISTRY.get(name)
        if old is not None and old.fn is not fn:
            raise ValueError(f"reward component {name!r} is already registered")
        _REGISTRY[name] = comp
        return comp

    return deco


def get(name: str) -> Component:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown reward component {name!r}; known: {sorted(_REGISTRY)}") from None


def known() -> list[str]:
    return sorted(_REGISTRY)


def needed_fields(components: Sequence[RewardComponentSpec]) -> dict[str, pl.DataType]:
    out: dict[str, pl.DataType] = {}
    for spec in components:
        out.update(get(spec.name).fields)
    return out


def needed_columns(components: Sequence[RewardComponentSpec]) -> list[str]:
    """Frame columns that scoring `components` reads (to select before a big read)."""
    cols: dict[str, None] = {}
    for spec in components:
        cols.update(dict.fromkeys(get(spec.name).frame_columns))
    return list(cols)


# --------------------------------------------------------------------------- components


def _bool01(s: pl.Series) -> pl.Series:
    return s.cast(pl.Float64)


@register("correctness", requires=("correct",))
def correctness(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """1 for a correct final answer (all tests pass), else 0: the paper's binary CR."""
    view = ctx.verifier(frame, {"correct": VERIFIER_FIELDS["correct"]})
    return _bool01(view.require("correct", "correctness"))


@register("correctness_tiers", requires=("correct",), uses=("passed", "total", "format_ok"),
          params={"partial": 0.1, "zero": 0.0})
def correctness_tiers(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """The paper's tiered CR: 1.0 correct; `partial` (0.1) when partial credit exists; else `zero`.

    Partial credit: where the verifier reports `total` (code/SWE tests), 0 < passed < total;
    where it does not (math), a well-formatted but wrong answer (format_ok true).
    """
    view = ctx.verifier(frame, {f: VERIFIER_FIELDS[f] for f in ("correct", "passed", "total", "format_ok")})
    correct = view.require("correct", "correctness_tiers")
    passed, total, fmt = view.get("passed"), view.get("total"), view.get("format_ok")
    df = pl.DataFrame({"c": correct, "p": passed, "t": total, "f": fmt})
    partial = (
        pl.when(pl.col("t").is_not_null())
        .then((pl.col("p") > 0) & (pl.col("p") < pl.col("t")))
        .otherwise(pl.col("f").fill_null(False))
        .fill_null(False)
    )
    expr = (
        pl.when(pl.col("c")).then(pl.lit(1.0))
        .when(partial).then(pl.lit(float(params["partial"])))
        .otherwise(pl.lit(float(params["zero"])))
    )
    return df.select(expr.alias("v")).to_series()


@register("format", uses=("format_ok",))
def format_ok(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """1 when the answer is in the required format (e.g. \\boxed{}), 0 when not, null when the
    verifier does not report format_ok."""
    view = ctx.verifier(frame, {"format_ok": VERIFIER_FIELDS["format_ok"]})
    return _bool01(view.get("format_ok"))


def _max_len(name: str, params: Mapping[str, float], ctx: RewardContext) -> float:
    max_len = params.get("max_len") or ctx.max_completion_length
    if not max_len or max_len <= 0:
        raise ValueError(
            f"reward component {name!r} needs the completion budget: pass max_completion_length in the "
            "RewardContext (the version's train.max_completion_length) or the param max_len"
        )
    return float(max_len)


@register("overlong", columns=("n_completion_tokens", "truncated"), params={"cache_tokens": 0.0, "max_len": 0.0})
def overlong(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """DAPO's soft overlong penalty: 0 up to max_len - cache_tokens, then linear down to -1 at
    max_len; -1 beyond it and for truncated rollouts. cache_tokens 0 (default): max_len // 4."""
    max_len = _max_len("overlong", params, ctx)
    cache = float(params["cache_tokens"]) or float(max_len // 4)
    cache = min(max(cache, 1.0), max_len)
    start = max_len - cache
    n = pl.col("n_completion_tokens").cast(pl.Float64)
    expr = (
        pl.when(pl.col("truncated").fill_null(False) | (n > max_len)).then(pl.lit(-1.0))
        .when(n > start).then((start - n) / cache)
        .otherwise(pl.lit(0.0))
    )
    return frame.select(expr.alias("v")).to_series()


@register("length", columns=("n_completion_tokens",), params={"scale": 1.0, "norm_tokens": 0.0})
def length(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """scale * n_completion_tokens / norm_tokens (default norm: max_completion_length): the share of
    the completion budget used. A negative weight makes it a length penalty, a positive one a
    bonus; it exists to study length gaming (and as a continuous tie-breaker)."""
    norm = float(params["norm_tokens"]) or _max_len("length", params, ctx)
    return frame.select((pl.col("n_completion_tokens").cast(pl.Float64) * (float(params["scale"]) / norm))
                        .alias("v")).to_series()


@register("judge", uses=("judge",))
def judge(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """The LLM-judge slot (the paper's IF): the verifier's `judge` score in [0, 1], null when the
    judge did not score the rollout. The judge itself runs elsewhere and writes the field."""
    view = ctx.verifier(frame, {"judge": VERIFIER_FIELDS["judge"]})
    return view.get("judge").clip(0.0, 1.0)


@register("env_reward", requires=("reward",))
def env_reward(frame: pl.DataFrame, params: Mapping[str, float], ctx: RewardContext) -> pl.Series:
    """The environment's own reward as its verifier recorded it (SWE: the tiers of SweEnvSpec.reward_tiers,
    0 / 0.1 / 1.0 by default, from the hidden tests)."""
    view = ctx.verifier(frame, {"reward": VERIFIER_FIELDS["reward"]})
    return view.require("reward", "env_reward")


# --------------------------------------------------------------------------- composer


def score_frame(
    components: Sequence[RewardComponentSpec], frame: pl.DataFrame, ctx: RewardContext | None = None,
) -> pl.DataFrame:
    """`frame` plus one `r.<name>` column per component (raw values, before weighting) and `reward`.

    reward = sum_i weight_i * r_i with nulls as 0 (TRL's nansum), null where all r_i are null.
    Existing `r.*`/`reward` columns of the frame are replaced. The verifier JSON is decoded once.
    """
    if not components:
        raise ValueError("score_frame needs at least one reward component")
    ctx = ctx or RewardContext()
    comps = [get(spec.name) for spec in components]  # KeyError naming the known ones
    fields: dict[str, pl.DataType] = {}
    for c in comps:
        fields.update(c.fields)
    if fields and (ctx.view is None or ctx.view.height != frame.height or not all(f in ctx.view.fields for f in fields)):
        ctx = replace(ctx, view=VerifierView(frame, fields))
    values = [c.compute(frame, spec.params, ctx) for c, spec in zip(comps, components)]
    weighted = [pl.col(v.name).fill_null(0.0) * float(spec.weight) for v, spec in zip(values, components)]
    any_value = pl.any_horizontal([pl.col(v.name).is_not_null() for v in values])
    total = pl.when(any_value).then(pl.sum_horizontal(weighted)).otherwise(None).alias("reward")
    base = frame.drop([c for c in frame.columns if c.startswith(REWARD_PREFIX) or c == "reward"])
    return base.with_columns(values).with_columns(total)


def score(
    components: Sequence[RewardComponentSpec], verifier: Mapping[str, Any], completion: str, *,
    n_completion_tokens: int = 0, truncated: bool = False, max_completion_length: int | None = None,
) -> tuple[float, dict[str, float | None]]:
    """One rollout: weighted total and each component's raw value (None = not applicable).

    Built on score_frame (a one-row frame). The total is NaN when every component is None.
    """
    import json

    frame = pl.DataFrame(
        {"verifier": [json.dumps(dict(verifier), default=str)], "completion": [completion],
         "n_completion_tokens": [int(n_completion_tokens)], "truncated": [bool(truncated)]},
        schema={"verifier": pl.String, "completion": pl.String, "n_completion_tokens": pl.Int64,
                "truncated": pl.Boolean},
    )
    out = score_frame(components, frame, RewardContext(max_completion_length=max_completion_length))
    row = out.row(0, named=True)
    values = {spec.name: row[REWARD_PREFIX + spec.name] for spec in components}
    total = row["reward"]
    return (math.nan if total is None else float(total)), values
