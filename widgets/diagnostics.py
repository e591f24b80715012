"""DiagnosticEditor: write a diagnostic, run it on chosen versions in a sandboxed subprocess
(evotrainer.diagnostics.usercode), read its metrics and findings, save it as a revision, and validate
a saved revision retrospectively (evotrainer.diagnostics.validation) against the campaign's judged versions."""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import time
from typing import ClassVar

import traitlets as t

from ._base import EvoWidget, clean, esm, running_loop

DEFAULT_SOURCE = '''\
# diagnose(rollouts, metrics) gets eager polars DataFrames of the chosen versions (every split) and
# returns {"metrics": {name: float|None}, "findings": [{severity, code, message, rollout_uids, veto}]}.
import polars as pl


def diagnose(rollouts, metrics):
    train = rollouts.filter(pl.col("split") == "train")
    groups = train.group_by("group_id").agg(std=pl.col("reward").std(ddof=0), uid=pl.col("rollout_uid").first())
    dead = groups.filter(pl.col("std") < 1e-3)
    share = dead.height / groups.height if groups.height else None
    findings = []
    if share is not None and share > 0.5:
        findings.append({"severity": "warning", "code": "many_dead_groups",
                         "message": f"{share:.0%} of groups have no reward spread",
                         "rollout_uids": dead["uid"].head(20).to_list()})
    return {"metrics": {"dead_share": share, "n_rollouts": float(rollouts.height)}, "findings": findings}
'''

_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="evo-diagnostic")
    return _POOL


def _usercode():
    from evotrainer.diagnostics import usercode  # lazy: the runner may land after this module

    return usercode


def _validation():
    from evotrainer.diagnostics import validation  # lazy, like the runner

    return validation


MAX_SIGNAL_COLUMNS = 8  # signals shown as columns of the per-version table (the deciding one first)


class DiagnosticEditor(EvoWidget):
    """Root element: `.evo-diagnostic-editor`.

    Synced traits: `source`, `version_options`, `selected_versions`, `running`, `result` ({ok,
    metrics: [{name, value}], findings: [...], error, stdout, seconds}), `revisions`, `name`,
    `author`, `reason`, `linked`, `timeout_s`, `message`, `validating`, `validation` (the last
    retrospective validation, see `validate`). Buttons (data-action): run, save, validate,
    open_finding (a finding -> the linked RolloutBrowser), load_revision.
    """

    _esm = esm("diagnostics.js")
    _ACTIONS: ClassVar[dict[str, str]] = {"run": "run", "save": "save", "set_source": "set_source", "open_finding": "open_finding",
                "load_revision": "load_revision", "set_versions": "set_versions", "validate": "validate"}

    source = t.Unicode("").tag(sync=True)
    version_options = t.List().tag(sync=True)
    selected_versions = t.List().tag(sync=True)
    running = t.Bool(False).tag(sync=True)
    result = t.Dict(allow_none=True, default_value=None).tag(sync=True)
    revisions = t.List().tag(sync=True)
    name = t.Unicode("").tag(sync=True)
    author = t.Unicode("").tag(sync=True)
    reason = t.Unicode("").tag(sync=True)
    linked = t.Bool(False).tag(sync=True)
    timeout_s = t.Float(10.0).tag(sync=True)
    validating = t.Bool(False).tag(sync=True)
    validation = t.Dict(allow_none=True, default_value=None).tag(sync=True)

    def __init__(self, lab, source: str | None = None, timeout_s: float = 10.0, **kwargs):
        super().__init__(lab, timeout_s=timeout_s, **kwargs)
        self._browser = None
        self._parent_sha: str | None = None
        self._future = None
        self._validation_future = None
        if source is None:
            with contextlib.suppress(Exception):
                uc = _usercode()
                source = getattr(uc, "TEMPLATE", None) or getattr(uc, "EXAMPLE_SOURCE", None)
        self.source = source or DEFAULT_SOURCE
        self.refresh()

    def refresh(self) -> None:
        store = self.lab.store
        self.version_options = store.versions()
        if not self.selected_versions and self.version_options:
            self.selected_versions = [self.version_options[-1]]
        revs = []
        with contextlib.suppress(Exception):
            for meta, _src in store.user_diagnostics():
                revs.append({"name": meta.name, "sha256": meta.sha256, "author": meta.author, "reason": meta.reason,
                             "parent_sha256": meta.parent_sha256, "created_at": meta.created_at,
                             "validated": meta.validated})
        self.revisions = clean(revs)

    # ---- editing

    def set_source(self, src: str) -> None:
        self.source = src

    def set_versions(self, versions) -> None:
        versions = [versions] if isinstance(versions, str) else list(versions)
        bad = [v for v in versions if v not in self.version_options]
        if bad:
            raise ValueError(f"unknown version(s) {bad}")
        self.selected_versions = versions

    def load_revision(self, sha256: str) -> None:
        for meta, src in self.lab.store.user_diagnostics():
            if meta.sha256 == sha256 or meta.sha256.startswith(sha256):
                self.source, self.name, self._parent_sha = src, meta.name, meta.sha256
                self._say(f"loaded {meta.name} revision {meta.sha256[:12]}", "info")
                return
        raise ValueError(f"no saved diagnostic revision {sha256}")

    def link(self, browser) -> DiagnosticEditor:
        """Findings open in this RolloutBrowser (filter by their example rollouts)."""
        self._browser = browser
        self.linked = browser is not None
        return self

    # ---- running (subprocess with a timeout, off the kernel's thread)

    def run(self, versions=None, wait: bool = False, source: str | None = None):
        """Run the source on `versions` (default: the picker's). With wait=True: block and return the
        result dict; otherwise run in a worker (awaited on the kernel's asyncio loop when there is
        one) and update `result` when done; returns the Future/Task."""
        if source is not None:
            self.source = source
        if versions is not None:
            self.set_versions(versions)
        versions = list(self.selected_versions)
        if not versions:
            self._say("pick at least one version", "error")
            return None
        if self.running and not wait:
            self._say("a run is in progress", "error")
            return self._future
        src, timeout = self.source, float(self.timeout_s)
        self.running = True
        self._say(f"running on {', '.join(versions)} (timeout {timeout:g}s)…", "info")
        if wait:
            return self._finish(self._execute(src, versions, timeout))
        loop = running_loop()
        if loop is not None:
            async def go():
                res = await loop.run_in_executor(_pool(), self._execute, src, versions, timeout)
                return self._finish(res)  # back on the kernel's loop: safe to touch the widget
            self._future = loop.create_task(go())
        else:  # no event loop (plain Python): no frontend is attached, the callback updates plain state
            fut = _pool().submit(self._execute, src, versions, timeout)
            fut.add_done_callback(lambda f: self._finish(f.result()))
            self._future = fut
        return self._future

    def _execute(self, src: str, versions: list[str], timeout: float) -> dict:
        t0 = time.perf_counter()
        try:
            uc = _usercode()
        except ImportError as exc:
            return {"ok": False, "metrics": {}, "findings": [], "stdout": "", "seconds": 0.0,
                    "error": f"the diagnostic runner (evotrainer.diagnostics.usercode) is not available: {exc}"}
        try:
            r = uc.run_user_diagnostic(self.lab.store, src, versions, timeout_s=timeout)
        except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down  # the runner's own failure is shown, never raised into the kernel
            return {"ok": False, "metrics": {}, "findings": [], "stdout": "", "seconds": time.perf_counter() - t0,
                    "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": bool(r.ok), "metrics": dict(r.metrics or {}), "findings": list(r.findings or []),
                "error": r.error, "stdout": r.stdout or "", "seconds": float(r.seconds)}

    def _finish(self, res: dict) -> dict:
        findings = []
        for i, f in enumerate(res.get("findings") or []):
            f = dict(f) if isinstance(f, dict) else (f.model_dump(mode="json") if hasattr(f, "model_dump") else {"message": str(f)})
            f["index"] = i
            f["n_examples"] = len(f.get("rollout_uids") or [])
            findings.append(f)
        out = clean({**res, "metrics": [{"name": k, "value": v} for k, v in sorted((res.get("metrics") or {}).items())],
                     "findings": findings})
        self.result = out
        self.running = False
        stdout = out.get("stdout") or ""
        cut = stdout[stdout.rfind("[output truncated"):].strip() if "[output truncated" in stdout else ""
        if out.get("ok"):
            self._say(f"ok in {out.get('seconds') or 0:.2f}s: {len(out['metrics'])} metrics, {len(findings)} findings"
                      + (f"; its printed output was cut: {cut}" if cut else ""), "ok")
        else:
            self._say(out.get("error") or "the diagnostic failed", "error")
        return out

    # ---- findings -> the rollout browser

    def open_finding(self, index: int) -> None:
        if self._browser is None:
            raise ValueError("no RolloutBrowser linked: editor.link(browser)")
        findings = (self.result or {}).get("findings") or []
        if not 0 <= int(index) < len(findings):
            raise ValueError(f"no finding #{index}")
        f = findings[int(index)]
        uids = list(f.get("rollout_uids") or [])
        if f.get("finding_id") and not uids:
            self._browser.set_filters(finding_id=f["finding_id"], uids=None)
        else:
            self._browser.set_filters(uids=uids, finding_id=None)
        self._say(f"finding {f.get('code') or index}: {len(uids)} rollouts shown in the browser", "ok")

    # ---- saving a revision

    def save(self, name: str | None = None, author: str | None = None, reason: str | None = None):
        """Save the source as a new revision (its parent: the revision last loaded or saved, if of the same name)."""
        name = (name if name is not None else self.name).strip()
        author = (author if author is not None else self.author).strip()
        reason = (reason if reason is not None else self.reason).strip()
        missing = [k for k, v in (("name", name), ("author", author), ("reason", reason)) if not v]
        if missing:
            self._say(f"save needs {', '.join(missing)}", "error")
            return None
        try:
            uc = _usercode()
            # the parent is the revision last loaded or saved when it has this name; a new name starts a new lineage
            parent = self._parent_sha if self._parent_sha and any(
                m.sha256 == self._parent_sha for m, _src in self.lab.store.user_diagnostics(name)) else None
            meta = uc.save_user_diagnostic(self.lab.store, name, self.source, author, reason, parent_sha256=parent)
        except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down
            self._say(f"not saved: {exc}", "error")
            return None
        self.name, self.author, self.reason = name, author, reason
        self._parent_sha = meta.sha256
        self.refresh()
        self._say(f"saved {meta.name} revision {meta.sha256[:12]}", "ok")
        return meta

    # ---- retrospective validation of a saved revision (off the kernel's thread)

    def _target_revision(self, name: str | None):
        """The revision to validate: the one loaded or last saved in this editor when `name` is empty or
        names it, else the newest revision of `name`; with nothing loaded, the newest saved revision."""
        revs = [m for m, _src in self.lab.store.user_diagnostics()]  # oldest first
        if not revs:
            raise ValueError("no saved diagnostic revision to validate: save one first")
        loaded = next((m for m in revs if m.sha256 == self._parent_sha), None) if self._parent_sha else None
        name = (name if name is not None else self.name or "").strip()
        if not name:
            return loaded or revs[-1]
        if loaded is not None and loaded.name == name:
            return loaded
        mine = [m for m in revs if m.name == name]
        if not mine:
            raise ValueError(f"no saved diagnostic {name!r} (saved: {sorted({m.name for m in revs})}); save it first")
        return mine[-1]

    def validate(self, name: str | None = None, who: str | None = None, reason: str | None = None,
                 metric: str | None = None, wait: bool = False, timeout_s: float | None = None):
        """Validate a saved revision retrospectively (`validate_user_diagnostic`): replay it over every judged
        version and accept it only if it separates the kept (promoted) versions from the bad (rejected or
        vetoed) ones. The revision: the one loaded or last saved here (or the newest of `name`). `who` and
        `reason` default to the editor's author and reason; `metric` judges one returned metric only.
        The report is stored with a ledger event; `validation` shows it and the revisions list is refreshed.
        With wait=True: block and return the `validation` dict; otherwise run in the worker (the kernel stays
        free) and return the Future/Task, as `run` does. Only validated revisions run at the gate."""
        who = (who if who is not None else self.author).strip()
        reason = (reason if reason is not None else self.reason).strip()
        metric = (metric or "").strip() or None
        missing = [k for k, v in (("who", who), ("reason", reason)) if not v]
        if missing:
            self._say(f"validate needs {', '.join(missing)} (the ledger records who validated and why)", "error")
            return None
        try:
            meta = self._target_revision(name)
        except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down
            self._say(f"not validated: {exc}", "error")
            return None
        if self.validating and not wait:
            self._say("a validation is in progress", "error")
            return self._validation_future
        unsaved = meta.sha256 == self._parent_sha and self.source_sha256 != meta.sha256
        args = (meta.name, meta.sha256, who, reason, metric, timeout_s)
        self.validating = True
        self._say(f"validating {meta.name} revision {meta.sha256[:12]} over the judged versions…"
                  + (" (the editor's unsaved edits are not part of it: save them to validate them)" if unsaved else ""),
                  "info")
        if wait:
            return self._finish_validation(self._execute_validation(*args))
        loop = running_loop()
        if loop is not None:
            async def go():
                res = await loop.run_in_executor(_pool(), self._execute_validation, *args)
                return self._finish_validation(res)  # back on the kernel's loop: safe to touch the widget
            self._validation_future = loop.create_task(go())
        else:  # no event loop (plain Python): no frontend is attached; the Future resolves once the state is updated
            self._validation_future = _pool().submit(lambda: self._finish_validation(self._execute_validation(*args)))
        return self._validation_future

    def _execute_validation(self, name: str, sha256: str, who: str, reason: str, metric: str | None,
                            timeout_s: float | None) -> dict:
        t0 = time.perf_counter()
        base = {"ok": False, "name": name, "sha256": sha256, "author": who, "reason": reason, "metric": metric}
        try:
            val = _validation()
            kwargs = {} if timeout_s is None else {"timeout_s": float(timeout_s)}
            report = val.validate_user_diagnostic(self.lab.store, name, sha256, metric=metric, author=who,
                                                  reason=reason, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down
            return {**base, "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
        return {**validation_view(report), "seconds": time.perf_counter() - t0}

    def _finish_validation(self, res: dict) -> dict:
        out = clean(res)
        self.validation = out
        self.validating = False
        self.refresh()  # the revisions list shows `validated`
        if not out.get("ok"):
            self._say(f"not validated: {out.get('error') or 'the validation failed'}", "error")
        else:
            verdict = "ACCEPTED" if out["accepted"] else "REJECTED"
            self._say(f"{out['name']} {out['sha256'][:12]} {verdict}: {out['why']}", "ok" if out["accepted"] else "info")
        return out

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()




def validation_view(report) -> dict:
    """A ValidationReport as the editor's plain-JSON `validation`: the verdict and why, the effect sizes of
    every signal (the deciding one first), and a per-version table (rows: kept / bad / unused versions;
    columns: the first MAX_SIGNAL_COLUMNS signals)."""
    def order(s):
        return (s.signal != report.signal, not s.passed, -abs(s.cliffs_delta or 0.0), s.signal)

    signals = sorted(report.signals, key=order)
    values = {s.signal: s.values for s in signals}
    names = [s.signal for s in signals] or sorted({k for p in report.points for k in p.metrics})
    columns = names[:MAX_SIGNAL_COLUMNS]
    rows = []
    for p in report.points:
        rows.append({"version": p.version, "label": p.label, "outcome": p.outcome,
                     "values": [values[c].get(p.version) if c in values else p.metrics.get(c) for c in columns],
                     "alerts": p.alerts, "vetoes": p.vetoes, "error": p.error, "note": p.note,
                     "evidence": list(p.evidence)})
    effects = [{"signal": s.signal, "deciding": s.signal == report.signal, "passed": s.passed, "n_kept": s.n_kept,
                "n_bad": s.n_bad, "mean_kept": s.mean_kept, "mean_bad": s.mean_bad, "cohens_d": s.cohens_d,
                "cohens_d_note": s.cohens_d_note, "auc": s.auc, "cliffs_delta": s.cliffs_delta,
                "direction": s.direction, "why": s.why} for s in signals]
    counts = {lab: sum(p.label == lab for p in report.points) for lab in ("kept", "bad", "unused")}
    return clean({
        "ok": True, "accepted": report.accepted, "name": report.name, "sha256": report.sha256,
        "validation_id": report.validation_id, "author": report.author, "reason": report.reason,
        "created_at": report.created_at, "as_of": report.as_of, "metric": report.requested_metric,
        "why": report.why, "reasons": [f"{s.signal}: {s.why}" for s in signals],
        "signal": report.signal, "cohens_d": report.cohens_d, "cliffs_delta": report.cliffs_delta,
        "auc": report.auc, "cohens_d_note": next((s.cohens_d_note for s in signals if s.signal == report.signal), ""),
        "effects": effects, "columns": columns, "hidden_columns": len(names) - len(columns),
        "rows": rows, "n_kept": counts["kept"], "n_bad": counts["bad"], "n_unused": counts["unused"],
        "rule": report.rule, "evidence": report.evidence, "error": None})
