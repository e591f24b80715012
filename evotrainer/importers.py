"""Importers: rollouts of runs made elsewhere become campaigns that EvoTrainer can read.

An imported campaign has no weights and no training stack behind it, but its rollouts satisfy the
evidence contract (`evidence.ROLLOUT_COLUMNS`) and its ledger carries the same training events a
trained campaign has, so `evotrainer status`, ledger replay, diagnostics, backtests and reports work
on it unchanged. Core only: polars, json, hashlib (no torch, trl, pandas).

Two formats (`detect_and_import` picks one):

* **JSONL** (`import_jsonl`): one rollout per line in the evidence contract.
  - Required fields: `version` (vNNN), `split` (train|val), `step` (int >= 0), `item_id`
    (string or int), `prompt`, `completion` (strings, or chat messages: see below), `reward`
    (number), `correct` (bool, or 0/1).
  - Optional, derived when missing: `campaign` (always set to the importing campaign's name; a
    different value in the file is replaced), `group_id` (see below), `sample_idx` (order within the
    group in file order), `rollout_uid` (`evidence.rollout_uid`; a uid given in the file is kept).
  - Optional with defaults: `n_prompt_tokens`, `n_completion_tokens`, `truncated`, `stop_reason`,
    `advantage`, `mean_logprob`, `filter_reason` -> null (unknown); `filtered` -> false (EvoTrainer's
    filters did not run); `n_turns` -> 1; `n_tool_calls` -> 0; `verifier` -> `{"correct": <correct>}`
    so that the `correctness` reward component can re-score the rows in a backtest (a dict value is
    stored as its JSON text).
  - `r.<component>`: number or null, one float column each. Any other field is kept as an extra
    column (lists and dicts as JSON text; a column whose values mix types is stored as text).
  - Groups: the group index comes from `group` (int), or from `group_id` (an int, a contract id
    `vNNN/split/step/gggg` of the same partition, or any other label: labels are numbered in order of
    first appearance within the (version, split, step) partition), or, when neither is given, from
    `item_id` (all rows of one item at one step form one group, numbered in order of first
    appearance). The stored `group_id` is always `evidence.group_id(version, split, step, index)`.
    Within a partition either every row gives the group field or none does; the same for
    `sample_idx`.
  - Every line is validated before anything is written; a bad line is a one-line error
    `FILE:LINE: ...` naming the field, and nothing is stored.

* **TRL completions** (`import_trl_completions`): the `completions/completions_<step>.parquet` files
  that TRL 1.16's `GRPOTrainer` writes with `log_completions=True`. Their columns, in order: `step`,
  `prompt`, `completion`, one float column per reward function (named after it), the `log_extra`
  columns, `advantage`. See that function for the mapping.

Campaigns that an import creates: `CampaignSpec(name=..., policy="external:<file name>",
preset="import:jsonl" | "import:trl")`. The source is therefore recorded in `policy` and `preset`.
The data spec, harness and train config are the `smoke` preset's, with the facts the rows show
filled in (`group_size`, `prompts_per_step`, `max_steps`, `eval_k`, `n_train`, `n_val`); the domain
stays "math" (the only domain the schema knows) and means nothing for imported rows. Each version
found gets a `VersionSpec` (parent = the preceding version of the campaign, the campaign's harness,
note "imported from <file name>"); a version that already exists keeps its spec.

Ledger events (actor "importer", reason "imported from <file name>"): `VersionCreated` for a new
version, `StepCompleted` per train partition (n_rollouts, reward_mean, correct_mean as
`evidence.step_summary` computes them; seconds 0), `EvalCompleted` per val partition (k, n_items,
Avg@k as `evidence.avg_at_k` computes them), then `TrainingFinished` (steps = last train step,
checkpoint "" because no weights exist). So `status.from_ledger` equals `status.from_tables`.

Re-importing is idempotent: a partition already stored with identical rows is skipped, and an
event is appended only when the ledger lacks it (so an import killed half way completes on the
next run). A partition stored with different rows is an error and nothing is written.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from . import evidence
from .config import PRESETS
from .errors import EvoTrainerError
from .schema import (
    CampaignSpec,
    DataSpec,
    EvalCompleted,
    StepCompleted,
    TrainConfig,
    TrainingFinished,
    VersionCreated,
    VersionSpec,
    version_index,
)
from .status import replay
from .store import Store

__all__ = ["JSONL_REQUIRED", "ImportDataError", "detect_and_import", "import_jsonl", "import_trl_completions"]

ACTOR = "importer"
JSONL_REQUIRED = ("version", "split", "step", "item_id", "prompt", "completion", "reward", "correct")
_OPT_INT = ("n_prompt_tokens", "n_completion_tokens", "sample_idx", "n_turns", "n_tool_calls")
_OPT_BOOL = ("truncated", "filtered")
_OPT_STR = ("stop_reason", "filter_reason", "rollout_uid", "campaign")
_OPT_FLOAT = ("advantage", "mean_logprob")
_DEFAULTS: dict[str, Any] = {"filtered": False, "n_turns": 1, "n_tool_calls": 0}
_GROUP_ID = re.compile(r"^(v\d{3})/(train|val)/(\d{6})/(\d{4})$")
_MAX_ERRORS = 50


class ImportDataError(EvoTrainerError):
    """An external file cannot be imported (bad line, unknown format, conflict with stored rows).

    `errors` lists every problem found (the message shows the first and a count).
    """

    def __init__(self, message: str, errors: Sequence[str] = ()):
        super().__init__(message)
        self.errors = list(errors) or [message]


def _fail(errors: list[str], fix: str) -> ImportDataError:
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return ImportDataError(f"{errors[0]}{more}; {fix}", errors)


# --------------------------------------------------------------------------- value checks


class _Bad(ValueError):
    pass


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def _int(v: Any, field: str, minimum: int = 0) -> int:
    if not _is_int(v) or int(v) < minimum:
        raise _Bad(f"field '{field}' must be an integer >= {minimum} (got {v!r})")
    return int(v)


def _num(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Bad(f"field '{field}' must be a number (got {v!r})")
    return float(v)


def _bool(v: Any, field: str) -> bool:
    if isinstance(v, bool):
        return v
    if _is_int(v) and int(v) in (0, 1):
        return bool(int(v))
    raise _Bad(f"field '{field}' must be true/false (got {v!r})")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: keep the text ones
        return "".join(b.get("text") or "" for b in content if isinstance(b, dict) and b.get("type", "text") == "text")
    return "" if content is None else str(content)


def prompt_text(value: Any) -> str:
    """A prompt as stored: a string as is; chat messages as their JSON (lossless, item-identifying)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def completion_text(value: Any) -> tuple[str, int, int]:
    """(text, n_turns, n_tool_calls) of a completion: a string, or a list of chat messages.

    Chat completions become the newline-joined contents of their assistant messages (every message
    when none has a role); n_turns counts assistant messages (at least 1), n_tool_calls the
    messages with role "tool".
    """
    if isinstance(value, str):
        return value, 1, 0
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(m, Mapping) for m in value):
        raise _Bad(f"must be a string or a list of chat messages (got {type(value).__name__})")
    roles = [m.get("role") for m in value]
    chosen = [m for m in value if m.get("role") == "assistant"] or [m for m in value if m.get("role") is None] or value
    text = "\n".join(_content_text(m.get("content")) for m in chosen)
    return text, max(1, roles.count("assistant")), roles.count("tool")


def _row(obj: Any) -> dict[str, Any]:
    """One JSONL object, checked and normalised (raises _Bad naming the field)."""
    if not isinstance(obj, dict):
        raise _Bad(f"line is not a JSON object (got {type(obj).__name__})")
    for f in JSONL_REQUIRED:
        if f not in obj or obj[f] is None:
            raise _Bad(f"missing required field '{f}'")
    out: dict[str, Any] = {}
    v = obj["version"]
    try:
        version_index(v if isinstance(v, str) else "")
    except ValueError:
        raise _Bad(f"field 'version' must look like 'v000' (got {v!r})") from None
    out["version"] = v
    if obj["split"] not in evidence.SPLITS:
        raise _Bad(f"field 'split' must be one of {list(evidence.SPLITS)} (got {obj['split']!r})")
    out["split"] = obj["split"]
    out["step"] = _int(obj["step"], "step")
    item = obj["item_id"]
    if not (isinstance(item, str) and item) and not (isinstance(item, int) and not isinstance(item, bool)):
        raise _Bad(f"field 'item_id' must be a non-empty string or an integer (got {item!r})")
    out["item_id"] = str(item)
    if not isinstance(obj["prompt"], str | list | dict):
        raise _Bad(f"field 'prompt' must be a string or chat messages (got {obj['prompt']!r})")
    out["prompt"] = prompt_text(obj["prompt"])
    try:
        text, n_turns, n_tools = completion_text(obj["completion"])
    except _Bad as exc:
        raise _Bad(f"field 'completion' {exc}") from None
    out["completion"] = text
    out["reward"] = _num(obj["reward"], "reward")
    if not math.isfinite(out["reward"]):
        raise _Bad(f"field 'reward' must be finite (got {obj['reward']!r})")
    out["correct"] = _bool(obj["correct"], "correct")
    if not isinstance(obj["completion"], str):
        out["n_turns"], out["n_tool_calls"] = n_turns, n_tools
    for f in _OPT_INT:
        if obj.get(f) is not None:
            out[f] = _int(obj[f], f)
    for f in _OPT_BOOL:
        if obj.get(f) is not None:
            out[f] = _bool(obj[f], f)
    for f in _OPT_STR:
        if obj.get(f) is not None:
            if not isinstance(obj[f], str):
                raise _Bad(f"field '{f}' must be a string (got {obj[f]!r})")
            out[f] = obj[f]
    for f in _OPT_FLOAT:
        if obj.get(f) is not None:
            out[f] = _num(obj[f], f)
    ver = obj.get("verifier")
    if ver is not None:
        if not isinstance(ver, str | dict):
            raise _Bad(f"field 'verifier' must be a JSON object or its text (got {ver!r})")
        out["verifier"] = ver if isinstance(ver, str) else json.dumps(ver, sort_keys=True)
    for key, val in obj.items():
        if key.startswith(evidence.REWARD_PREFIX):
            out[key] = None if val is None else _num(val, key)
        elif key == "group":
            if val is not None:
                if not _is_int(val) or val < 0:
                    raise _Bad(f"field 'group' must be an integer >= 0 (got {val!r})")
                out["group"] = int(val)
        elif key == "group_id":
            if val is not None:
                if not (isinstance(val, str) or _is_int(val)) or (_is_int(val) and val < 0):
                    raise _Bad(f"field 'group_id' must be an integer >= 0 or a string (got {val!r})")
                out["group_id"] = int(val) if _is_int(val) else val
        elif key not in out and key not in JSONL_REQUIRED and key not in evidence.ROLLOUT_COLUMNS:
            out["x:" + key] = json.dumps(val, sort_keys=True) if isinstance(val, list | dict) else val
    return out


# --------------------------------------------------------------------------- JSONL


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    errors: list[str] = []
    rows: list[dict[str, Any]] = []
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed by the `with` below
    except OSError as exc:
        raise ImportDataError(f"cannot read {path}: {exc.strerror}; check the path") from exc
    with fh:
        try:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                where = f"{path.name}:{lineno}"
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError as exc:
                    errors.append(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
                    continue
                try:
                    r = _row(obj)
                except _Bad as exc:
                    errors.append(f"{where}: {exc}")
                    continue
                r["_line"] = lineno
                rows.append(r)
                if len(errors) >= _MAX_ERRORS:
                    break
        except UnicodeDecodeError as exc:
            raise ImportDataError(f"{path.name}: not UTF-8 text ({exc.reason}); is it really JSONL?") from exc
    if errors:
        raise _fail(errors, "fix the file and import again (nothing was imported)")
    if not rows:
        raise ImportDataError(f"{path.name}: no rollouts (the file is empty); nothing was imported")
    return rows


def _assign_groups(rows: list[dict[str, Any]], file: str) -> list[str]:
    """Fill `_group` and `sample_idx` per (version, split, step) partition. Returns error lines."""
    errors: list[str] = []
    parts: dict[tuple, list[dict]] = {}
    for r in rows:
        parts.setdefault((r["version"], r["split"], r["step"]), []).append(r)
    for (version, split, step), part in parts.items():
        label = f"{version}/{split}/step {step}"
        field = next((f for f in ("group", "group_id") if any(f in r for r in part)), None)
        if field is not None:
            missing = next((r for r in part if field not in r), None)
            if missing is not None:
                errors.append(f"{file}:{missing['_line']}: missing field '{field}' (other rows of {label} give it)")
                continue
        numbering: dict[Any, int] = {}
        kinds: dict[bool, dict] = {}
        for r in part:
            if field == "group":
                r["_group"] = r["group"]
                continue
            key = r["group_id"] if field == "group_id" else r["item_id"]
            if field == "group_id":
                if _is_int(key):
                    r["_group"] = int(key)
                    kinds.setdefault(True, r)
                    continue
                m = _GROUP_ID.match(key)
                if m and m.group(1) == version and m.group(2) == split and int(m.group(3)) == step:
                    r["_group"] = int(m.group(4))
                    kinds.setdefault(True, r)
                    continue
                kinds.setdefault(False, r)
            r["_group"] = numbering.setdefault(key, len(numbering))
        if len(kinds) == 2:
            bad = max(kinds.values(), key=lambda r: r["_line"])
            errors.append(f"{file}:{bad['_line']}: field 'group_id' mixes group numbers and free labels in {label} "
                          f"(a number or '{version}/{split}/{step:06d}/NNNN' everywhere, or labels everywhere)")
            continue
        if any(r["_group"] > 9999 for r in part):
            bad = next(r for r in part if r["_group"] > 9999)
            errors.append(f"{file}:{bad['_line']}: group index {bad['_group']} exceeds 9999 in {label}")
            continue
        has_sample = [("sample_idx" in r) for r in part]
        if any(has_sample) and not all(has_sample):
            bad = part[has_sample.index(False)]
            errors.append(f"{file}:{bad['_line']}: missing field 'sample_idx' (other rows of {label} give it)")
            continue
        if not any(has_sample):
            counters: Counter = Counter()
            for r in part:
                r["sample_idx"] = counters[r["_group"]]
                counters[r["_group"]] += 1
        seen: dict[tuple[int, int], int] = {}
        for r in part:
            key2 = (r["_group"], r["sample_idx"])
            if key2 in seen:
                errors.append(f"{file}:{r['_line']}: repeats group {key2[0]} sample {key2[1]} of {label} "
                              f"(first at line {seen[key2]})")
                break
            seen[key2] = r["_line"]
    return errors


def _frame_from_rows(rows: list[dict[str, Any]], campaign: str) -> pl.DataFrame:
    """Contract frame from checked rows (defaults filled, uids derived, extras typed)."""
    n = len(rows)
    data: dict[str, list] = {}
    for r in rows:
        r["campaign"] = campaign
        r["group_id"] = evidence.group_id(r["version"], r["split"], r["step"], r["_group"])
        if "rollout_uid" not in r:
            r["rollout_uid"] = evidence.rollout_uid(campaign, r["version"], r["split"], r["step"], r["_group"],
                                                    r["sample_idx"])
        if "verifier" not in r:
            r["verifier"] = json.dumps({"correct": r["correct"]})
    for col in evidence.ROLLOUT_COLUMNS:
        data[col] = [r.get(col, _DEFAULTS.get(col)) for r in rows]
    extra_keys = sorted({k for r in rows for k in r if k.startswith(evidence.REWARD_PREFIX)})
    other_keys = sorted({k for r in rows for k in r if k.startswith("x:")})
    series = [pl.Series(c, data[c], dtype=t) for c, t in evidence.ROLLOUT_COLUMNS.items()]
    series += [pl.Series(k, [r.get(k) for r in rows], dtype=pl.Float64) for k in extra_keys]
    for k in other_keys:
        vals = [r.get(k) for r in rows]
        kinds = {type(v) for v in vals if v is not None}
        if kinds == {int, float}:
            kinds = {float}
        if len(kinds) == 1:
            s = pl.Series(k[2:], vals, dtype={str: pl.String, int: pl.Int64, float: pl.Float64,
                                              bool: pl.Boolean}[kinds.pop()])
        else:  # mixed types (or all null): text
            s = pl.Series(k[2:], [None if v is None else (v if isinstance(v, str) else json.dumps(v)) for v in vals],
                          dtype=pl.String)
        series.append(s)
    df = pl.DataFrame(series)
    assert df.height == n
    return df


def _resolve_name(store_dir: Path, name: str | None, default: str) -> tuple[str, bool]:
    """(campaign name, store exists)."""
    if Store.exists(store_dir):
        existing = Store.open(store_dir).campaign.name
        if name is not None and name != existing:
            raise ImportDataError(f"{store_dir} holds campaign {existing!r}, not {name!r}; drop name= or pick "
                                  "another directory (nothing was imported)")
        return existing, True
    return name or default, False


def import_jsonl(path: str | Path, store_dir: str | Path, *, name: str | None = None,
                 version: str | None = None) -> Store:
    """Import a JSONL file of contract rollouts into the campaign at `store_dir` (created if absent).

    `name`: the campaign name for a new campaign (default: the file's single `campaign` value, else
    the file stem); must match an existing campaign's name. `version`: import only the rows of this
    version (default: every version in the file). Returns the opened Store.
    """
    path, store_dir = Path(path), Path(store_dir)
    if not path.is_file():
        raise ImportDataError(f"{path} does not exist or is not a file; check the path")
    rows = _read_jsonl(path)
    if version is not None:
        version_index(version)
        rows = [r for r in rows if r["version"] == version]
        if not rows:
            raise ImportDataError(f"{path.name} has no rows of version {version}; nothing was imported")
    errors = _assign_groups(rows, path.name)
    if errors:
        raise _fail(errors, "fix the file and import again (nothing was imported)")
    file_campaigns = {r["campaign"] for r in rows if "campaign" in r}
    default = file_campaigns.pop() if len(file_campaigns) == 1 else path.stem
    campaign, _ = _resolve_name(store_dir, name, default)
    rows.sort(key=lambda r: (r["version"], r["split"], r["step"], r["_group"], r["sample_idx"]))
    df = _frame_from_rows(rows, campaign)
    dup = df.filter(pl.col("rollout_uid").is_duplicated())
    if dup.height:
        uid = dup["rollout_uid"][0]
        lines = [r["_line"] for r in rows if r["rollout_uid"] == uid]
        raise ImportDataError(f"{path.name}:{lines[-1]}: rollout_uid {uid!r} repeats line {lines[0]}; "
                              "fix the file and import again (nothing was imported)")
    return _commit(store_dir, df, campaign=campaign, source=path.name, kind="jsonl")


# --------------------------------------------------------------------------- TRL completions

TRL_FIXED = ("step", "prompt", "completion", "advantage")
_CORRECT_NAME = re.compile(r"correct|accura", re.IGNORECASE)
_TRL_FILE = re.compile(r"^completions_(\d+)\.parquet$")


def _trl_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ImportDataError(f"{path} does not exist; check the path")
    base = path / "completions" if (path / "completions").is_dir() else path
    files = sorted((p for p in base.iterdir() if _TRL_FILE.match(p.name)), key=lambda p: int(_TRL_FILE.match(p.name).group(1)))
    if not files:
        raise ImportDataError(f"{path} holds no TRL completions files (completions/completions_<step>.parquet); "
                              "train with GRPOConfig(log_completions=True) or point at the files")
    return files


def import_trl_completions(
    path_or_dir: str | Path, store_dir: str | Path, *, name: str | None = None, version: str = "v000",
    reward_columns: Sequence[str] | None = None, reward_weights: Mapping[str, float] | None = None,
    correct_column: str | None = None, group_size: int | None = None,
) -> Store:
    """Import TRL GRPOTrainer `log_completions` parquet files as version `version`.

    Accepts a training output directory (with `completions/`), the `completions/` directory, or one
    `completions_<step>.parquet` file. The mapping (TRL 1.16, `GRPOTrainer.log`):

    * `step` -> `step` (TRL's `global_step` when the table was logged), split "train" (TRL writes eval
      tables to the same file names, so they cannot be told apart; import train logs only).
    * reward columns: every numeric column other than `step` and `advantage`, unless `reward_columns`
      names them (TRL writes `log_extra` columns between the rewards and `advantage`; numeric extras
      therefore need `reward_columns`). Each becomes `r.<name>` (NaN -> null: not applicable).
      Non-reward columns are kept as `trl.<name>` (lists/dicts as JSON text).
    * `reward` = the sum of the reward columns with nulls as 0, times `reward_weights` (default 1
      each: the weights are not in the files; TRL's default is 1), null when every column is null.
    * `correct`: `correct_column` if given, else the first column whose name contains "correct" or
      "accura" (bool as is; numbers > 0.5 are correct), else `reward > 0.5`. Null when that value is.
    * groups: consecutive rows of the same prompt within a file (TRL logs the G samples of a prompt
      contiguously); with `group_size`, a run is split into chunks of that size (a run that is not a
      multiple is an error). `item_id` = "p-" + sha256(prompt text)[:12]; `sample_idx` = position.
    * `prompt`: the string, or the chat messages as JSON; `completion`: the string, or the assistant
      messages' contents joined by newlines (n_turns / n_tool_calls counted from the messages).
    * `advantage` as logged; `verifier` = JSON of the reward values plus `"correct"`.
    * Unknown facts: `n_prompt_tokens`, `n_completion_tokens`, `truncated`, `stop_reason`,
      `mean_logprob`, `filter_reason` are null; `filtered` is false.
    * TRL does not clear its log buffers between logs: when `logging_steps` is smaller than
      `steps_per_generation`, consecutive files repeat the same generation batch. A file whose rows
      equal the previous file's is skipped (its rows were already imported under the earlier step).
    """
    src, store_dir = Path(path_or_dir), Path(store_dir)
    version_index(version)
    files = _trl_files(src)
    frames: list[pl.DataFrame] = []
    used: list[Path] = []
    prev: pl.DataFrame | None = None
    for f in files:
        try:
            raw = pl.read_parquet(f)
        except Exception as exc:  # polars raises several types on a bad file
            raise ImportDataError(f"{f.name}: not a readable parquet file ({type(exc).__name__}); "
                                  "nothing was imported") from exc
        missing = [c for c in ("step", "prompt", "completion") if c not in raw.columns]
        if missing:
            raise ImportDataError(f"{f.name}: missing column(s) {missing}; not a TRL completions file "
                                  "(nothing was imported)")
        if raw.height == 0:
            continue
        body = raw.drop("step")
        if prev is not None and body.columns == prev.columns and body.equals(prev):
            continue  # the same generation batch logged again at a later step
        prev = body
        frames.append(raw)
        used.append(f)
    if not frames:
        raise ImportDataError(f"{src}: the TRL completions files hold no rows; nothing was imported")
    # Union of columns (reward functions are the same in every file of one run, extras may vary).
    columns: list[str] = []
    for fr in frames:
        columns += [c for c in fr.columns if c not in columns]
    if reward_columns is None:
        numeric = [c for c in columns if c not in TRL_FIXED and any(
            c in fr.columns and fr.schema[c].is_numeric() for fr in frames)]
        rcols = numeric
    else:
        rcols = list(reward_columns)
        unknown = [c for c in rcols if c not in columns]
        if unknown:
            raise ImportDataError(f"reward_columns {unknown} are not in the TRL files (columns: {columns})")
    if not rcols:
        raise ImportDataError(f"{src}: no reward columns found (columns: {columns}); pass reward_columns=")
    weights = {c: float((reward_weights or {}).get(c, 1.0)) for c in rcols}
    if correct_column is not None and correct_column not in columns:
        raise ImportDataError(f"correct_column {correct_column!r} is not in the TRL files (columns: {columns})")
    ccol = correct_column or next((c for c in columns if c not in TRL_FIXED and _CORRECT_NAME.search(c)), None)
    extras = [c for c in columns if c not in TRL_FIXED and c not in rcols]
    run_dir = src.parent if src.is_file() or src.name == "completions" else src
    if run_dir.name == "completions":
        run_dir = run_dir.parent
    campaign, _ = _resolve_name(store_dir, name, run_dir.name or "trl")

    records: list[dict[str, Any]] = []
    seen_steps: dict[int, str] = {}
    for fr, f in zip(frames, used):
        steps = fr["step"].unique().to_list()
        if len(steps) != 1 or not _is_int(steps[0]) or steps[0] < 0:
            raise ImportDataError(f"{f.name}: column 'step' must hold one non-negative integer per file "
                                  f"(got {steps[:5]}); nothing was imported")
        step = int(steps[0])
        if step in seen_steps:
            raise ImportDataError(f"{f.name}: step {step} is also in {seen_steps[step]}; nothing was imported")
        seen_steps[step] = f.name
        prev_prompt, group, sample = object(), -1, 0
        for row in fr.iter_rows(named=True):
            p = prompt_text(row["prompt"])
            if p != prev_prompt or (group_size is not None and sample == group_size):
                group, sample, prev_prompt = group + 1, 0, p
            try:
                text, n_turns, n_tools = completion_text(row["completion"])
            except _Bad as exc:
                raise ImportDataError(f"{f.name}: column 'completion' {exc}; nothing was imported") from None
            rewards = {c: _nan_to_none(row.get(c)) for c in rcols}
            present = [weights[c] * v for c, v in rewards.items() if v is not None]
            reward = math.fsum(present) if present else None
            if ccol is not None:
                cv = row.get(ccol)
                correct = None if _nan_to_none(cv) is None else (cv if isinstance(cv, bool) else float(cv) > 0.5)
            else:
                correct = None if reward is None else reward > 0.5
            verifier = dict(rewards)
            verifier.setdefault("correct", correct)
            rec: dict[str, Any] = {
                "version": version, "split": "train", "step": step, "item_id": "p-" + _sha(p),
                "_group": group, "sample_idx": sample, "prompt": p, "completion": text,
                "reward": reward, "correct": correct, "advantage": _nan_to_none(row.get("advantage")),
                "verifier": json.dumps(verifier, sort_keys=True), "n_turns": n_turns, "n_tool_calls": n_tools,
            }
            for c in rcols:
                rec[evidence.REWARD_PREFIX + c] = rewards[c]
            for c in extras:
                v = row.get(c)
                rec["x:trl." + c] = json.dumps(v, sort_keys=True, default=str) if isinstance(v, list | dict) else v
            records.append(rec)
            sample += 1
        if group_size is not None:
            sizes = Counter(r["_group"] for r in records if r["step"] == step)
            bad = [g for g, n in sizes.items() if n != group_size]
            if bad:
                raise ImportDataError(f"{f.name}: a run of the same prompt is not a multiple of group_size "
                                      f"{group_size} (group {bad[0]} has {sizes[bad[0]]}); nothing was imported")
        if group > 9999:
            raise ImportDataError(f"{f.name}: more than 10000 groups in one step; nothing was imported")
    df = _frame_from_rows(records, campaign)
    return _commit(store_dir, df, campaign=campaign, source=src.name, kind="trl")


def _nan_to_none(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- detection


def detect_and_import(path: str | Path, store_dir: str | Path, **kw: Any) -> Store:
    """Import `path` with the importer its extension and contents call for.

    `.jsonl` / `.ndjson` / `.json` (one object per line) -> `import_jsonl`; a `.parquet` file with
    TRL's `step`/`prompt`/`completion` columns, or a directory holding `completions_<step>.parquet`
    files (directly or under `completions/`) -> `import_trl_completions`. Anything else is an
    ImportDataError naming the formats known.
    """
    p = Path(path)
    known = "known formats: JSONL rollouts (.jsonl) and TRL log_completions parquet (completions_<step>.parquet)"
    if p.is_dir():
        base = p / "completions" if (p / "completions").is_dir() else p
        if any(_TRL_FILE.match(c.name) for c in base.iterdir()):
            return import_trl_completions(p, store_dir, **kw)
        raise ImportDataError(f"{p} is a directory without TRL completions files; {known}")
    if not p.is_file():
        raise ImportDataError(f"{p} does not exist; check the path")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return import_jsonl(p, store_dir, **kw)
    if suffix == ".parquet":
        try:
            cols = pl.read_parquet_schema(p)
        except Exception as exc:
            raise ImportDataError(f"{p.name} is not a readable parquet file ({type(exc).__name__}); {known}") from exc
        if all(c in cols for c in ("step", "prompt", "completion")):
            return import_trl_completions(p, store_dir, **kw)
        raise ImportDataError(f"{p.name}: parquet without TRL's step/prompt/completion columns; {known}")
    with open(p, "rb") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith(b"{"):
        return import_jsonl(p, store_dir, **kw)
    raise ImportDataError(f"cannot tell the format of {p.name}; {known}")


# --------------------------------------------------------------------------- writing


def _infer_train(df: pl.DataFrame) -> tuple[TrainConfig, DataSpec]:
    base_t, base_d = PRESETS["smoke"].train, PRESETS["smoke"].data
    t: dict[str, Any] = {}
    d: dict[str, Any] = {}
    train = df.filter(pl.col("split") == "train")
    val = df.filter(pl.col("split") == "val")
    if train.height:
        sizes = train.group_by("group_id").len()["len"]
        gs = Counter(sizes.to_list()).most_common(1)[0][0]
        if gs >= 2:
            t["group_size"] = int(gs)
        t["prompts_per_step"] = int(train.group_by(["version", "step"]).agg(pl.col("group_id").n_unique())["group_id"].max())
        if train["step"].max() > 0:
            t["max_steps"] = int(train["step"].max())
        d["n_train"] = int(train["item_id"].n_unique())
    if val.height:
        per = evidence.avg_at_k(val)
        t["eval_k"] = int(per["k"].min())
        d["n_val"] = int(val["item_id"].n_unique())
    return base_t.model_copy(update=t), base_d.model_copy(update=d)


def _same(existing: pl.DataFrame, new: pl.DataFrame) -> bool:
    if set(existing.columns) != set(new.columns):
        return False
    existing = existing.select(new.columns)
    return existing.schema == new.schema and existing.equals(new, null_equal=True)


def _commit(store_dir: Path, df: pl.DataFrame, *, campaign: str, source: str, kind: str) -> Store:
    """Validate every partition against the store, then write versions, partitions and events."""
    parts: dict[tuple[str, str, int], pl.DataFrame] = {}
    for key, part in df.group_by(["version", "split", "step"], maintain_order=True):
        try:
            parts[(str(key[0]), str(key[1]), int(key[2]))] = evidence.conform_rollouts(part)
        except evidence.ContractError as exc:
            raise ImportDataError(f"{source}: {exc}; nothing was imported") from exc
    store = Store.open(store_dir) if Store.exists(store_dir) else None
    conflicts: list[str] = []
    todo: list[tuple[str, str, int]] = []
    for (v, split, step), part in sorted(parts.items()):
        path = store.version_dir(v) / "rollouts" / f"split={split}" / f"step={step:06d}.parquet" if store else None
        if path is not None and path.exists():
            try:
                existing = pl.read_parquet(path)
            except Exception as exc:  # noqa: BLE001 - any unreadable file is a conflict, reported
                conflicts.append(f"stored partition {v}/{split}/step {step} is unreadable ({type(exc).__name__})")
                continue
            if not _same(existing, part):
                conflicts.append(f"{v}/{split}/step {step} is already stored with different rows")
        else:
            todo.append((v, split, step))
    if conflicts:
        raise _fail([f"{source}: {c}" for c in conflicts],
                    "import into a new campaign directory or as another version (nothing was imported)")
    train_cfg, data_cfg = _infer_train(df)
    if store is None:
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        preset = PRESETS["smoke"]
        spec = CampaignSpec(name=campaign, preset=f"import:{kind}", policy=f"external:{source}", data=data_cfg,
                            train=train_cfg, harness=preset.harness, seed=preset.seed)
        store = Store.create(store_dir, spec)
    reason = f"imported from {source}"
    status = replay(store.ledger.events(), store.campaign.name)
    all_versions = sorted(set(store.versions()) | {v for v, _, _ in parts})
    for v in sorted({v for v, _, _ in parts}):
        vdf = df.filter(pl.col("version") == v)
        if v not in store.versions():
            parent = all_versions[all_versions.index(v) - 1] if all_versions.index(v) > 0 else None
            t, d = _infer_train(vdf)
            store.write_version(VersionSpec(
                version=v, parent=parent, policy=store.campaign.policy, harness=store.campaign.harness, data=d,
                train=t, seed=store.campaign.seed + version_index(v), note=reason,
            ))
        vstat = status.versions.get(v)
        if vstat is None:
            store.ledger.append(VersionCreated(version=v, parent=store.read_version(v).parent, actor=ACTOR,
                                               reason=reason))
        changed = False
        for (pv, split, step), part in sorted(parts.items(), key=lambda kv: (kv[0][2], kv[0][1])):
            if pv != v:
                continue
            if (v, split, step) in todo:
                store.append_rollouts(v, split, step, part)
                changed = True
            if split == "train" and (vstat is None or step not in vstat.steps):
                s = evidence.step_summary(part).row(0, named=True)
                store.ledger.append(StepCompleted(version=v, step=step, n_rollouts=s["n_rollouts"],
                                                  reward_mean=s["reward_mean"], correct_mean=s["correct_mean"],
                                                  seconds=0.0, actor=ACTOR, reason=reason))
                changed = True
            elif split == "val" and (vstat is None or step not in vstat.evals):
                a = evidence.avg_at_k(part).row(0, named=True)
                store.ledger.append(EvalCompleted(version=v, step=step, k=a["k"], n_items=a["n_items"],
                                                  avg_at_k=a["avg_at_k"], actor=ACTOR, reason=reason))
                changed = True
        if changed or vstat is None or vstat.state.value != "trained":
            store.ledger.append(TrainingFinished(version=v, steps=max(store.steps(v, "train"), default=0),
                                                 seconds=0.0, checkpoint="", actor=ACTOR, reason=reason))
    return store
