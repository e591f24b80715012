"""The Store: the only code that knows paths inside a campaign directory.

Layout (see ARCHITECTURE.md):

    <campaign>/campaign.json                     CampaignSpec (frozen at creation)
    <campaign>/ledger.jsonl                      append-only events; state is derived by replay
    <campaign>/versions/<vNNN>/version.json      VersionSpec (frozen)
    <campaign>/versions/<vNNN>/rollouts/split=<s>/step=<NNNNNN>.parquet
    <campaign>/versions/<vNNN>/turns/split=<s>/step=<NNNNNN>.parquet
    <campaign>/versions/<vNNN>/metrics/step=<NNNNNN>.parquet
    <campaign>/versions/<vNNN>/checkpoints/  final/  train.log
    <campaign>/versions/<vNNN>/abandoned/attempt-<N>/...   steps of a crashed attempt, moved aside
    <campaign>/diagnostics/<name>-<sha12>.py|.json          user diagnostic revisions (source + metadata)
    <campaign>/validations/<name>-<sha12>-<id>.json         their retrospective validations (append-only)

Rules: one write primitive per table; every write is atomic (temp file, fsync, rename); table
partitions are never rewritten (an append to an existing partition is refused); a reader never
sees a half-written file.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
from pydantic import TypeAdapter, ValidationError

from . import evidence
from .errors import CorruptTableError, SchemaVersionError, StoreError
from .migrations import migrate_document, migrate_event
from .schema import (SCHEMA_VERSION, BacktestReport, CampaignSpec, Decision, HealthReport, Intervention, LedgerEvent,
                     UserDiagnostic, ValidationReport, VersionSpec, event_to_json, version_index)

_STEP_FILE = re.compile(r"^step=(\d{6})\.parquet$")
_EVENT = TypeAdapter(LedgerEvent)


# --------------------------------------------------------------------------- atomic writes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; store files get the usual mode so a notebook server or a colleague
# running as another user can read the evidence.
_FILE_MODE = 0o666 & ~_umask()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _write_new_parquet(path: Path, df: pl.DataFrame) -> None:
    """Write a partition file that must not exist yet; atomic; refuses to overwrite."""
    if path.exists():
        raise StoreError(f"partition {path} already exists; tables are append-only (nothing was written)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)
    os.close(fd)
    try:
        df.write_parquet(tmp, compression="zstd", statistics=True)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        # link() fails if the target appeared meanwhile: no silent overwrite even under a race.
        os.link(tmp, path)
    except FileExistsError as exc:
        raise StoreError(f"partition {path} already exists; tables are append-only (nothing was written)") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(path.parent)


def _step_of(path: Path) -> int | None:
    m = _STEP_FILE.match(path.name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- ledger


def append_line(path: Path, line: str) -> None:
    """Append one line to a JSON-lines log: under an exclusive flock, fsynced. A line torn by a killed
    writer is ended first, so it stays a separate line that readers skip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")
            fh.write(line.encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Ledger:
    """Append-only JSON-lines event log; campaign state is derived by replaying it."""

    def __init__(self, path: Path):
        self.path = path
        self.torn_lines = 0

    def append(self, event) -> None:  # event: one of schema.LedgerEvent's members
        append_line(self.path, event_to_json(event))

    def events(self) -> list:
        if not self.path.exists():
            return []
        out = []
        self.torn_lines = 0
        with open(self.path, "rb") as fh:
            lines = fh.read().split(b"\n")
        for lineno, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                # Only a writer killed mid-line leaves this; the event never completed, so it never
                # happened. Counted so `doctor` can report it.
                self.torn_lines += 1
                continue
            try:
                out.append(_EVENT.validate_python(migrate_event(obj)))
            except ValidationError as exc:
                raise StoreError(
                    f"ledger {self.path} line {lineno} is not a valid event ({exc.errors()[0]['msg']}); "
                    "restore the ledger from backup"
                ) from exc
        return out


# --------------------------------------------------------------------------- store


class Store:
    """A campaign directory. Create with `Store.create`, open with `Store.open`."""

    def __init__(self, root: Path, campaign: CampaignSpec):
        self.root = Path(root)
        self.campaign = campaign
        self.ledger = Ledger(self.root / "ledger.jsonl")

    # ---- opening

    @classmethod
    def create(cls, root: str | Path, spec: CampaignSpec) -> Store:
        root = Path(root)
        if (root / "campaign.json").exists():
            raise StoreError(f"{root} already holds a campaign; use --resume to continue it or pick another --campaign")
        if root.exists() and any(root.iterdir()):
            raise StoreError(f"{root} exists and is not an empty directory; pick another --campaign")
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / "campaign.json", _doc_bytes(spec))
        from .schema import CampaignCreated

        store = cls(root, spec)
        store.ledger.append(CampaignCreated(name=spec.name))
        return store

    @classmethod
    def open(cls, root: str | Path) -> Store:
        root = Path(root)
        path = root / "campaign.json"
        if not path.exists():
            raise StoreError(f"{root} is not a campaign directory (no campaign.json); check the path")
        spec = _read_doc(path, CampaignSpec)
        return cls(root, spec)

    @staticmethod
    def exists(root: str | Path) -> bool:
        return (Path(root) / "campaign.json").exists()

    # ---- versions

    def version_dir(self, version: str) -> Path:
        version_index(version)  # validates the name; paths are never built from arbitrary strings
        return self.root / "versions" / version

    def write_version(self, spec: VersionSpec) -> None:
        path = self.version_dir(spec.version) / "version.json"
        if path.exists():
            existing = _read_doc(path, VersionSpec)
            if existing.model_dump(exclude={"created_at"}) == spec.model_dump(exclude={"created_at"}):
                return  # idempotent repeat
            raise StoreError(f"version {spec.version} already exists with a different spec; versions are frozen")
        atomic_write_bytes(path, _doc_bytes(spec))

    def read_version(self, version: str) -> VersionSpec:
        path = self.version_dir(version) / "version.json"
        if not path.exists():
            raise StoreError(f"campaign {self.root} has no version {version}")
        return _read_doc(path, VersionSpec)

    def versions(self) -> list[str]:
        base = self.root / "versions"
        if not base.exists():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "version.json").exists())

    def checkpoints_dir(self, version: str) -> Path:
        return self.version_dir(version) / "checkpoints"

    def final_dir(self, version: str) -> Path:
        return self.version_dir(version) / "final"

    def train_log(self, version: str) -> Path:
        return self.version_dir(version) / "train.log"

    @contextlib.contextmanager
    def version_lock(self, version: str, timeout: float = 0.0) -> Iterator[None]:
        """Exclusive lock held by whoever trains a version (two writers would duplicate steps)."""
        path = self.version_dir(version) / ".lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.close()
                    raise StoreError(
                        f"version {version} is being trained by another process (lock {path}); "
                        "wait for it or stop it first"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    # ---- documents of the loop: interventions, backtests, decisions, health reports

    def _put_doc(self, rel: str, doc, *, replace: bool = False) -> Path:
        path = self.root / rel
        if path.exists() and not replace:
            existing = json.loads(path.read_text())
            fresh = json.loads(_doc_bytes(doc))
            existing.pop("created_at", None)
            fresh.pop("created_at", None)
            if existing == fresh:
                return path  # idempotent repeat (same content id, written again after a crash)
            raise StoreError(f"{rel} already exists with other content; documents are frozen")
        atomic_write_bytes(path, _doc_bytes(doc))
        return path

    def _get_docs(self, folder: str, model) -> list:
        base = self.root / folder
        if not base.exists():
            return []
        return [_read_doc(p, model) for p in sorted(base.glob("*.json"))]

    def write_intervention(self, iv: Intervention) -> Path:
        if not iv.intervention_id:
            raise StoreError("intervention has no id; create it with evotrainer.interventions.new()")
        return self._put_doc(f"interventions/{iv.intervention_id}.json", iv)

    def read_intervention(self, intervention_id: str) -> Intervention:
        path = self.root / "interventions" / f"{intervention_id}.json"
        if not path.exists():
            raise StoreError(f"campaign {self.root} has no intervention {intervention_id}")
        return _read_doc(path, Intervention)

    def interventions(self) -> list[Intervention]:
        return self._get_docs("interventions", Intervention)

    def write_backtest(self, report: BacktestReport) -> Path:
        return self._put_doc(f"backtests/{report.backtest_id}.json", report)

    def backtests(self) -> list[BacktestReport]:
        return self._get_docs("backtests", BacktestReport)

    def write_decision(self, decision: Decision) -> Path:
        return self._put_doc(f"decisions/{decision.decision_id}.json", decision)

    def decisions(self) -> list[Decision]:
        return self._get_docs("decisions", Decision)

    def write_user_diagnostic(self, meta: UserDiagnostic, source: str) -> Path:
        """Source under diagnostics/<name>-<sha12>.py beside its metadata; the hash must match."""
        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest != meta.sha256:
            raise StoreError(f"diagnostic {meta.name}: source hash {digest[:12]} does not match {meta.sha256[:12]}")
        stem = f"diagnostics/{meta.name}-{digest[:12]}"
        path = self.root / f"{stem}.py"
        if not path.exists():
            atomic_write_bytes(path, source.encode())
        self._put_doc(f"{stem}.json", meta)
        return path

    def user_diagnostics(self, name: str | None = None) -> list[tuple[UserDiagnostic, str]]:
        """Every saved revision (oldest first) with its source, optionally of one name.

        `validated` is derived, not stored (the metadata file is frozen at save time): True when the
        LATEST validation of that revision (sha256) accepted it, so a re-validation that fails revokes it.
        """
        out = []
        latest = self.latest_validations()
        for meta in self._get_docs("diagnostics", UserDiagnostic):
            if name is None or meta.name == name:
                src = (self.root / "diagnostics" / f"{meta.name}-{meta.sha256[:12]}.py").read_text()
                report = latest.get((meta.name, meta.sha256))
                ok = bool(report is not None and report.accepted)
                out.append((meta.model_copy(update={"validated": ok}) if ok != meta.validated else meta, src))
        return sorted(out, key=lambda p: p[0].created_at)

    def write_validation(self, report: ValidationReport) -> Path:
        """Append a retrospective validation (validations/<name>-<sha12>-<id>.json). Never replaced; an
        identical repeat (same content id) is a no-op. The caller records a DiagnosticValidated event."""
        if not (self.root / "diagnostics" / f"{report.name}-{report.sha256[:12]}.json").exists():
            raise StoreError(f"validation of {report.name} {report.sha256[:12]}: no such saved diagnostic revision")
        return self._put_doc(f"validations/{report.name}-{report.sha256[:12]}-{report.validation_id}.json", report)

    def validations(self, name: str | None = None, sha256: str | None = None) -> list[ValidationReport]:
        """Stored validations (oldest first), optionally of one diagnostic name and/or revision."""
        docs = [r for r in self._get_docs("validations", ValidationReport)
                if (name is None or r.name == name) and (sha256 is None or r.sha256 == sha256)]
        return sorted(docs, key=lambda r: r.created_at)

    def latest_validations(self) -> dict[tuple[str, str], ValidationReport]:
        """(name, sha256) -> the newest validation of that revision."""
        out: dict[tuple[str, str], ValidationReport] = {}
        for r in self.validations():
            out[(r.name, r.sha256)] = r
        return out

    def write_health_report(self, report: HealthReport) -> Path:
        """Derived from the evidence (recomputed when diagnostics change), so it may be replaced."""
        return self._put_doc(f"versions/{report.version}/diagnostics/health.json", report, replace=True)

    def read_health_report(self, version: str) -> HealthReport | None:
        path = self.version_dir(version) / "diagnostics" / "health.json"
        return _read_doc(path, HealthReport) if path.exists() else None

    # ---- the controller: one per campaign, and requests to it

    @contextlib.contextmanager
    def controller_lock(self) -> Iterator[None]:
        """Held by the process running the loop; a second controller on one campaign is refused."""
        path = self.root / "controller.lock"
        fh = open(path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            pid = fh.read().strip() or "?"
            fh.close()
            raise StoreError(f"campaign {self.root} is already being run by process {pid}; "
                             "attach to it (evotrainer status / Lab.attach) or stop it first") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def controller_pid(self) -> int | None:
        """The pid of the process running the loop now, or None when nobody holds the lock."""
        path = self.root / "controller.lock"
        if not path.exists():
            return None
        with open(path, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                text = fh.read().strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fh, fcntl.LOCK_UN)
        return None

    def controller_log(self) -> Path:
        """What a background controller (Lab) prints."""
        return self.root / "controller.log"

    def run_target(self) -> int | None:
        """How many versions a background run was asked for (so a re-attached Lab can resume it)."""
        path = self.root / "run-target"
        return int(path.read_text()) if path.exists() else None

    def set_run_target(self, versions: int) -> None:
        atomic_write_bytes(self.root / "run-target", f"{versions}\n".encode())

    def request_pause(self, paused: bool) -> None:
        """The loop checks this between phases: paused, it stops cleanly after the current phase."""
        path = self.root / "pause.request"
        if paused:
            atomic_write_bytes(path, b"pause\n")
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def pause_requested(self) -> bool:
        return (self.root / "pause.request").exists()

    # ---- tables: write primitives (one per table)

    def _table_dir(self, version: str, table: str, split: str | None) -> Path:
        base = self.version_dir(version) / table
        return base / f"split={split}" if split is not None else base

    def append_rollouts(self, version: str, split: str, step: int, df: pl.DataFrame) -> Path:
        if split not in evidence.SPLITS:
            raise StoreError(f"unknown split {split!r}; expected one of {evidence.SPLITS}")
        try:
            df = evidence.conform_rollouts(df)
        except evidence.ContractError as exc:
            raise StoreError(f"rollouts for {version} {split} step {step} refused: {exc}") from exc
        wrong = df.filter((pl.col("version") != version) | (pl.col("split") != split) | (pl.col("step") != step))
        if wrong.height:
            raise StoreError(f"rollouts for {version} {split} step {step} contain rows of another partition")
        path = self._table_dir(version, "rollouts", split) / f"step={step:06d}.parquet"
        _write_new_parquet(path, df)
        return path

    def append_turns(self, version: str, split: str, step: int, df: pl.DataFrame) -> Path:
        try:
            df = evidence.conform(df, evidence.TURN_COLUMNS, "turns")
        except evidence.ContractError as exc:
            raise StoreError(f"turns for {version} {split} step {step} refused: {exc}") from exc
        path = self._table_dir(version, "turns", split) / f"step={step:06d}.parquet"
        _write_new_parquet(path, df)
        return path

    def append_metrics(self, version: str, step: int, values: dict[str, float], source: str,
                       sources: dict[str, str] | None = None) -> Path:
        """One row per metric; `sources` overrides `source` for named metrics."""
        sources = sources or {}
        df = pl.DataFrame(
            {
                "campaign": [self.campaign.name] * len(values),
                "version": [version] * len(values),
                "step": [step] * len(values),
                "name": list(values),
                "value": [float(v) for v in values.values()],
                "source": [sources.get(k, source) for k in values],
            },
            schema=evidence.METRIC_COLUMNS,
        )
        path = self._table_dir(version, "metrics", None) / f"step={step:06d}.parquet"
        _write_new_parquet(path, df)
        return path

    # ---- tables: reads (lazy)

    def partition_files(
        self, table: str, versions: Sequence[str] | str | None = None, split: str | None = None,
        steps: tuple[int | None, int | None] | None = None,
    ) -> list[Path]:
        if isinstance(versions, str):
            versions = [versions]
        if versions is None:
            base = self.root / "versions"
            versions = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []
        lo, hi = steps if steps is not None else (None, None)
        files: list[Path] = []
        for v in versions:
            base = self.version_dir(v) / table
            if not base.exists():
                continue
            dirs = [base] if table == "metrics" else (
                [base / f"split={split}"] if split else sorted(base.glob("split=*"))
            )
            for d in dirs:
                if not d.exists():
                    continue
                for f in sorted(d.iterdir()):
                    s = _step_of(f)
                    if s is None or (lo is not None and s < lo) or (hi is not None and s > hi):
                        continue
                    files.append(f)
        return files

    def steps(self, version: str, split: str = "train") -> list[int]:
        return [_step_of(f) for f in self.partition_files("rollouts", version, split)]  # type: ignore[misc]

    def _scan(self, table: str, files: list[Path], empty_schema: dict, columns: Sequence[str] | None) -> pl.LazyFrame:
        if not files:
            schema = dict(empty_schema)
            lf = pl.LazyFrame(schema=schema)
            return lf.select(columns) if columns else lf
        union: dict[str, pl.DataType] = {}
        for f in files:
            try:
                schema = pl.read_parquet_schema(f)
            except Exception as exc:
                raise CorruptTableError(
                    f"table file {f} is unreadable ({type(exc).__name__}); move it out of the store "
                    f"with `evotrainer doctor {self.root} --quarantine` (it holds only that step's rows)"
                ) from exc
            for name, dtype in schema.items():
                union.setdefault(name, dtype)
        lf = pl.scan_parquet([str(f) for f in files], schema=union, missing_columns="insert",
                             extra_columns="ignore")
        return lf.select(columns) if columns else lf

    def rollouts(
        self, versions: Sequence[str] | str | None = None, split: str | None = None,
        steps: tuple[int | None, int | None] | None = None, columns: Sequence[str] | None = None,
    ) -> pl.LazyFrame:
        """Lazy rollouts of any subset. Step ranges are inclusive and prune whole files unread."""
        files = self.partition_files("rollouts", versions, split, steps)
        return self._scan("rollouts", files, evidence.ROLLOUT_COLUMNS, columns)

    def turns(self, versions=None, split=None, steps=None, columns=None) -> pl.LazyFrame:
        files = self.partition_files("turns", versions, split, steps)
        return self._scan("turns", files, evidence.TURN_COLUMNS, columns)

    def metrics(self, versions=None, steps=None) -> pl.LazyFrame:
        files = self.partition_files("metrics", versions, None, steps)
        return self._scan("metrics", files, evidence.METRIC_COLUMNS, None)

    # ---- crash recovery and repair

    def abandon_steps_after(self, version: str, after_step: int, reason: str,
                            also_val_steps: Sequence[int] = ()) -> tuple[list[int], str]:
        """Move every partition of `version` with step > after_step (and the val partitions of
        `also_val_steps`) to one abandoned/attempt-N/ folder.

        Used when a crashed attempt wrote steps past its last resumable checkpoint, or a val file
        its EvalCompleted event never acknowledged: the resumed run produces them again. The files
        are moved (evidence of the crash is kept), never rewritten; the caller records a
        StepsAbandoned event.
        """
        stray_val = set(also_val_steps)
        vdir = self.version_dir(version)
        moved_steps: set[int] = set()
        n = 1
        while (vdir / "abandoned" / f"attempt-{n}").exists():
            n += 1
        dest_root = vdir / "abandoned" / f"attempt-{n}"
        for table in ("rollouts", "turns", "metrics"):
            for f in self.partition_files(table, version, None):
                s = _step_of(f)
                if s is None:
                    continue
                if s > after_step or (table == "rollouts" and f.parent.name == "split=val" and s in stray_val):
                    dest = dest_root / f.relative_to(vdir)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(f, dest)
                    moved_steps.add(s)
        if moved_steps:
            (dest_root / "REASON.txt").write_text(reason + "\n")
        return sorted(moved_steps), str(dest_root.relative_to(self.root))

    def scan_for_corruption(self) -> list[tuple[Path, str]]:
        """Every table file whose parquet footer or data cannot be read, with the reason."""
        bad = []
        for table in ("rollouts", "turns", "metrics"):
            for f in self.partition_files(table):
                try:
                    pl.read_parquet(f, n_rows=1)
                except Exception as exc:
                    bad.append((f, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
        return bad

    def quarantine(self, path: Path) -> Path:
        dest = self.root / "quarantine" / Path(path).resolve().relative_to(self.root.resolve())
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
        return dest

    def remove_checkpoints(self, version: str) -> None:
        """Drop intermediate trainer checkpoints once a version is final (they are not evidence)."""
        shutil.rmtree(self.checkpoints_dir(version), ignore_errors=True)


# --------------------------------------------------------------------------- documents


def _doc_bytes(doc) -> bytes:
    return (json.dumps(doc.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()


def _read_doc(path: Path, model):
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path} is not readable JSON ({exc}); restore it from backup") from exc
    if not isinstance(raw, dict):
        raise StoreError(f"{path} is not a JSON object; restore it from backup")
    found = raw.get("schema_version")
    if found != SCHEMA_VERSION:
        raw = migrate_document(raw, path)  # raises SchemaVersionError when it cannot
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise SchemaVersionError(
            f"{path}: field '{loc}': {err['msg']}; the file does not match this release's schema "
            f"{SCHEMA_VERSION}: restore it or use the EvoTrainer release that wrote it"
        ) from exc
