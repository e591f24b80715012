"""Retrospective validation: a user diagnostic counts only once it separates kept from bad past versions.

    meta = save_user_diagnostic(store, "test_tampering", source, author="agent", reason="...")
    report = validate_user_diagnostic(store, "test_tampering", author="agent", reason="separates v001")
    report.accepted, report.signal, report.cliffs_delta, report.cohens_d, report.points   # per-version values

A diagnostic written during a campaign (by a person in the DiagnosticEditor, or by an agent) is saved
as source + sha256 (usercode.save_user_diagnostic). Before it may affect anything it is replayed over
the campaign's past versions, and it must separate the versions the campaign kept from the ones it
threw out (the paper: "a new metric must be replayed over past versions and shown to separate good
runs from bad ones"). A validation is tied to one revision (sha256); an edited revision (lineage by
parent_sha256) needs its own.

Labels (from the ledger, `loopstate.derive`; a person's completion-gate override wins):
- kept = outcome "promote"; bad = "reject" or "vetoed";
- unused (replayed and reported, never counted): "inconclusive", and a version vetoed ONLY by findings
  of this same diagnostic name (its own verdict cannot be its evidence);
- versions not judged yet, and probes, are not replayed.

Evidence: each version is replayed with exactly the evidence it gets at the gate: the version plus
up to `history` (3) ancestors along the parent chain, oldest first (report.lineage), with
`ctx["version"]` naming the version under diagnosis. So a rule that compares a version with its
parent is validated the way it will run, and a diagnostic that forgets to filter on ctx["version"]
sees its ancestors' rows at the gate too (and validation measures exactly that).

Signals: every metric the diagnostic returns, and "#findings": 1.0 when the version got a veto finding
from it, else 0.0 (when it never vetoes: any warning/critical finding). Info findings are ignored.

The rule (RULE_TEXT; thresholds: MIN_PER_SIDE = 1, min_effect = 0.8 by default). Accepted when:
1. every kept and bad version ran cleanly (a timeout, memory error, exception or bad shape on one of
   them rejects: a diagnostic that cannot run on the campaign's own history does not count);
2. some signal has a value on >= 1 kept and >= 1 bad version, and on those:
   a. it is not constant (constant output: Cohen's d = 0, AUC = 0.5, Cliff's delta = 0: rejected);
   b. the two groups do not overlap (every bad value above every kept value, or every one below):
      AUC = 1 or 0, |Cliff's delta| = 1. This is the criterion that works with 1-2 versions a side;
   c. where Cohen's d is defined (>= 3 versions with a value, pooled sd with ddof 1 per group),
      |d| >= min_effect; zero spread within both groups is an infinite d (passes; stored as None with
      a note, JSON has no infinity); with 1 kept + 1 bad, d is undefined and (b) decides alone;
   d. "#findings" must fire on bad versions, not on kept ones (direction higher_on_bad);
3. a diagnostic that emits any veto finding is accepted only when "#findings" passes: vetoes are
   what change decisions, so a separating metric cannot carry vetoes that do not separate.
The deciding signal is the "#findings" one for a vetoing diagnostic, else the best passing signal
(largest |Cliff's delta|, then |d|). Caveat, stated in every report: with 1-2 versions a side any
non-constant metric separates about half the time by chance; validation is a filter against useless
and broken diagnostics, not proof. Re-validate as versions accumulate: the latest validation of a
revision decides whether it counts (Store.user_diagnostics()' `validated`), so a later failure revokes.

The report (schema.ValidationReport) is stored append-only under validations/ (Store.write_validation)
with author, time and reason, and a DiagnosticValidated ledger event records it.

`validated_user_diagnostics(store)` gives the latest validated revision of each name; the health report
(report.health_report_for) runs exactly those, in the sandbox, under the limits they were validated
with, and merges their metrics ("user:<name>/<metric>") and findings (a veto=True finding vetoes at the
gate through controller._judge). A run that fails becomes a `diagnostic_error` warning; it never vetoes
and never stops the loop. Unvalidated revisions never run there.
"""
from __future__ import annotations

import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import EvoTrainerError
from ..schema import (
    DiagnosticValidated,
    Finding,
    SignalSeparation,
    UserDiagnostic,
    ValidationPoint,
    ValidationReport,
    finding_id,
    utc_now,
)
from .usercode import UserRunResult, run_user_diagnostic

FINDINGS_SIGNAL = "#findings"
MIN_PER_SIDE = 1
DEFAULT_MIN_EFFECT = 0.8  # Cohen's "large"
DEFAULT_HISTORY = 3  # ancestors handed over with each version, as at the gate
DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MEMORY_MB = 1024
MAX_WORKERS = 4  # sandboxed runs in parallel (each is its own process)
USER_PREFIX = "user:"  # user diagnostics' findings and metrics are named "user:<name>"

EVIDENCE_TEXT = ("each judged version replayed with the evidence it gets at the gate: the version plus up to {h} "
                 "ancestors along the parent chain, oldest first (ctx['version'] is the version under diagnosis)")
RULE_TEXT = (
    "accepted when every kept (promote) and bad (reject/vetoed) version ran cleanly and some signal (a returned "
    "metric, or '#findings' = the version got a veto finding, or a warning/critical one when it never vetoes) has "
    "values on >= {n} kept and >= {n} bad version(s), is not constant, separates the groups without overlap "
    "(AUC 0 or 1, |Cliff's delta| = 1) and, where Cohen's d is defined (>= 3 versions with a value; no spread "
    "within both groups = infinite d), has |d| >= {e:g}; '#findings' must fire on bad versions, not kept ones; a "
    "diagnostic that emits veto findings is accepted only through '#findings'. Inconclusive versions and versions "
    "vetoed only by this diagnostic are reported, not used. With 1-2 versions a side any non-constant metric "
    "separates about half the time by chance: this filters useless and broken diagnostics, it is not proof."
)


class ValidationError(EvoTrainerError):
    """A validation could not be run (unknown diagnostic or revision, nothing to replay, bad arguments)."""


def user_name(name: str) -> str:
    """The name a user diagnostic's findings and metrics carry in health reports."""
    return USER_PREFIX + name


# --------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class Label:
    version: str
    outcome: str | None
    label: str  # kept | bad | unused
    note: str = ""


def version_labels(store, name: str | None = None) -> list[Label]:
    """Judged full versions (probes and unjudged ones left out), oldest first, with their labels.

    `name`: a version vetoed only by findings of user diagnostic `name` is unused (self-evidence)."""
    from ..loopstate import derive

    state = derive(store.ledger.events(), store.campaign.name)
    decisions = {d.decision_id: d for d in store.decisions()}
    out = []
    for v in store.versions():
        if store.read_version(v).role == "probe":
            continue
        lp = state.versions.get(v)
        outcome = lp.outcome if lp is not None else None
        if outcome is None:
            continue
        if outcome == "promote":
            out.append(Label(v, outcome, "kept"))
        elif outcome == "reject":
            out.append(Label(v, outcome, "bad"))
        elif outcome == "vetoed":
            if name is not None and _vetoed_only_by(store, v, decisions.get(lp.judged.decision_id), user_name(name)):
                out.append(Label(v, outcome, "unused", f"vetoed only by {user_name(name)} itself: its own verdict "
                                                       "cannot be its evidence"))
            else:
                out.append(Label(v, outcome, "bad"))
        else:
            out.append(Label(v, outcome, "unused", f"{outcome}: neither kept nor thrown out"))
    return out


def _vetoed_only_by(store, version: str, decision, diagnostic: str) -> bool:
    if decision is None or not decision.vetoes:
        return False
    report = store.read_health_report(version)
    by_id = {f.finding_id: f.diagnostic for f in (report.findings if report else ())}
    return all(by_id.get(fid) == diagnostic for fid in decision.vetoes)


# --------------------------------------------------------------------------- effect sizes


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def separation(signal: str, values: dict[str, float | None], labels: dict[str, str], *,
               min_effect: float = DEFAULT_MIN_EFFECT, min_per_side: int = MIN_PER_SIDE) -> SignalSeparation:
    """Effect sizes of `signal` between kept and bad versions and whether it passes the rule (module doc)."""
    kept = [float(values[v]) for v, lab in labels.items() if lab == "kept" and values.get(v) is not None]
    bad = [float(values[v]) for v, lab in labels.items() if lab == "bad" and values.get(v) is not None]
    base = {"signal": signal, "values": dict(values), "n_kept": len(kept), "n_bad": len(bad)}
    if len(kept) < min_per_side or len(bad) < min_per_side:
        return SignalSeparation(**base, why=f"needs values on >= {min_per_side} kept and >= {min_per_side} bad "
                                            f"version(s); has {len(kept)} kept, {len(bad)} bad")
    mk, mb = _mean(kept), _mean(bad)
    base |= {"mean_kept": mk, "mean_bad": mb}
    allv = kept + bad
    if max(allv) == min(allv):
        return SignalSeparation(**base, cohens_d=0.0, auc=0.5, cliffs_delta=0.0, overlap=True, direction="none",
                                why=f"constant output ({allv[0]:g} on every kept and bad version): effect 0")
    wins = sum((b > k) + 0.5 * (b == k) for b in bad for k in kept)
    auc = wins / (len(kept) * len(bad))
    delta = 2 * auc - 1
    overlap = not (max(kept) < min(bad) or max(bad) < min(kept))
    direction = "higher_on_bad" if mb > mk else ("lower_on_bad" if mb < mk else "none")
    n = len(kept) + len(bad)
    d_val: float | None
    if n < 3:
        d_val, d, note = None, None, "undefined with 1 kept + 1 bad version: the rank rule decides alone"
    else:
        pooled = math.sqrt(((len(kept) - 1) * _var(kept) + (len(bad) - 1) * _var(bad)) / (n - 2))
        if pooled == 0:
            d_val, d, note = math.copysign(math.inf, mb - mk), None, "infinite: no spread within either group"
        else:
            d_val = (mb - mk) / pooled
            d, note = d_val, ""
    base |= {"cohens_d": d, "cohens_d_note": note, "auc": auc, "cliffs_delta": delta, "overlap": overlap,
             "direction": direction}
    d_txt = "d undefined" if d_val is None else ("d infinite" if math.isinf(d_val) else f"d={d_val:+.2f}")
    summary = f"Cliff's delta {delta:+.2f}, AUC {auc:.2f}, {d_txt}; kept mean {mk:.4g}, bad mean {mb:.4g}"
    if overlap:
        return SignalSeparation(**base, why=f"kept and bad values overlap ({summary})")
    if d_val is not None and abs(d_val) < min_effect:
        return SignalSeparation(**base, why=f"|Cohen's d| {abs(d_val):.2f} < {min_effect:g} ({summary})")
    if signal == FINDINGS_SIGNAL and direction != "higher_on_bad":
        return SignalSeparation(**base, why=f"its findings fire on kept versions, not on bad ones ({summary})")
    return SignalSeparation(**base, passed=True, why=f"separates kept from bad without overlap ({summary})")


def _strength(s: SignalSeparation) -> tuple:
    d = s.cohens_d
    dkey = math.inf if (d is None and s.cohens_d_note.startswith("infinite")) else abs(d or 0.0)
    return (s.passed, abs(s.cliffs_delta or 0.0), dkey, s.signal == FINDINGS_SIGNAL)


# --------------------------------------------------------------------------- validation


def _revision(store, name: str, sha256: str | None) -> tuple[UserDiagnostic, str]:
    revisions = store.user_diagnostics(name)
    if not revisions:
        known = sorted({m.name for m, _ in store.user_diagnostics()})
        raise ValidationError(f"no saved diagnostic {name!r} (saved: {known or 'none'}); save it first with "
                              "usercode.save_user_diagnostic")
    if sha256 is None:
        return revisions[-1]
    hits = [(m, s) for m, s in revisions if m.sha256 == sha256 or (len(sha256) >= 8 and m.sha256.startswith(sha256))]
    if len(hits) != 1:
        raise ValidationError(f"diagnostic {name} has no single revision {sha256[:12]} "
                              f"(revisions: {[m.sha256[:12] for m, _ in revisions]})")
    return hits[0]


def _run(store, source: str, name: str, version: str, history: int, timeout_s: float,
         memory_mb: int) -> tuple[tuple[str, ...], UserRunResult]:
    from .report import lineage

    versions = tuple(lineage(store, version, history))
    try:
        res = run_user_diagnostic(store, source, list(versions), name=user_name(name), version=version,
                                  timeout_s=timeout_s, memory_mb=memory_mb)
    except Exception as exc:  # noqa: BLE001 - exporting the evidence failed: that version cannot be replayed
        res = UserRunResult(ok=False, error=f"could not run: {type(exc).__name__}: {str(exc)[:300]}")
    return versions, res


def validate_user_diagnostic(store, name: str, sha256: str | None = None, *, metric: str | None = None,
                             min_effect: float = DEFAULT_MIN_EFFECT, history: int = DEFAULT_HISTORY,
                             timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                             author: str, reason: str, write: bool = True) -> ValidationReport:
    """Replay revision `sha256` (default: the newest) of user diagnostic `name` over every judged version
    and decide by the rule in the module docstring. `metric`: judge only that returned metric (or
    "#findings"); default: every signal. Stored (append-only) with a DiagnosticValidated ledger event
    unless write=False. Raises ValidationError when there is nothing to validate against; whatever
    the diagnostic's code does (loop, allocate, raise, write) is contained and reported in the points."""
    if not str(author).strip():
        raise ValidationError("a validation needs an author (who ran it)")
    if len(str(reason).strip()) < 3:
        raise ValidationError("a validation needs a reason (at least 3 characters): the ledger records why")
    if min_effect < 0:
        raise ValidationError(f"min_effect must be >= 0 (got {min_effect})")
    meta, source = _revision(store, name, sha256)
    all_versions = [v for v in store.versions() if store.read_version(v).role != "probe"]
    if not all_versions:
        raise ValidationError(f"campaign {store.root} has no versions to replay {name} over")
    labels = version_labels(store, name)

    jobs = [lab.version for lab in labels]
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_WORKERS, len(jobs)))) as pool:
        runs = list(pool.map(lambda v: _run(store, source, name, v, history, timeout_s, memory_mb), jobs))

    points = []
    for lab, (evidence, res) in zip(labels, runs):
        points.append(ValidationPoint(
            version=lab.version, outcome=lab.outcome, label=lab.label, note=lab.note, evidence=evidence,
            metrics=dict(res.metrics) if res.ok else {},
            finding_codes=tuple(f.code for f in res.findings) if res.ok else (),
            alerts=sum(f.severity in ("warning", "critical") for f in res.findings) if res.ok else 0,
            vetoes=sum(f.veto for f in res.findings) if res.ok else 0,
            error=None if res.ok else (res.error or "failed")))
    label_of = {p.version: p.label for p in points}
    ok_points = [p for p in points if p.error is None]

    signals: list[SignalSeparation] = []
    metric_names = sorted({k for p in ok_points for k in p.metrics})
    vetoing = any(p.vetoes for p in ok_points)
    alerting = any(p.alerts for p in ok_points)
    findings_values = {p.version: (None if p.error else float(p.vetoes > 0 if vetoing else p.alerts > 0))
                       for p in points}
    for m in metric_names:
        if metric is None or metric == m:
            signals.append(separation(m, {p.version: p.metrics.get(m) for p in points}, label_of,
                                      min_effect=min_effect))
    fsig = None
    if vetoing or alerting or metric == FINDINGS_SIGNAL:
        fsig = separation(FINDINGS_SIGNAL, findings_values, label_of, min_effect=min_effect)
        if metric is None or metric == FINDINGS_SIGNAL or vetoing:
            signals.append(fsig)

    failed = [p for p in points if p.error and p.label in ("kept", "bad")]
    used = [p for p in points if p.label in ("kept", "bad")]
    n_kept = sum(p.label == "kept" for p in points)
    n_bad = sum(p.label == "bad" for p in points)
    chosen: SignalSeparation | None = None
    if failed:
        accepted = False
        why = (f"the diagnostic failed on {len(failed)} of {len(used)} kept/bad version(s): "
               + "; ".join(f"{p.version}: {p.error}" for p in failed[:3]))
    elif n_kept < MIN_PER_SIDE or n_bad < MIN_PER_SIDE:
        accepted = False
        why = (f"needs >= {MIN_PER_SIDE} kept (promoted) and >= {MIN_PER_SIDE} bad (rejected or vetoed) version; "
               f"the campaign has {n_kept} kept and {n_bad} bad judged version(s) (a person can mark one with "
               "the completion gate's REVISE --outcome)")
    elif metric is not None and metric != FINDINGS_SIGNAL and metric not in metric_names:
        accepted = False
        why = f"metric {metric!r} was never returned; it returned {metric_names or 'no metrics'}"
    elif not signals:
        accepted = False
        why = "it returned no metrics and no warning/critical findings: nothing separates anything"
    elif vetoing and not (fsig is not None and fsig.passed):
        accepted = False
        chosen = fsig
        why = f"it emits veto findings, and they do not separate kept from bad versions: {fsig.why}"
    else:
        if vetoing:
            chosen = fsig
        else:
            chosen = max(signals, key=_strength)
        accepted = chosen.passed
        why = f"{chosen.signal}: {chosen.why}" if accepted else (
            "no signal separates kept from bad versions: "
            + "; ".join(f"{s.signal}: {s.why}" for s in sorted(signals, key=_strength, reverse=True)[:4]))
    if chosen is None and signals:
        chosen = max(signals, key=_strength)

    draft = ValidationReport(
        validation_id="", name=meta.name, sha256=meta.sha256, author=str(author), reason=str(reason),
        as_of=all_versions[-1], evidence=EVIDENCE_TEXT.format(h=history),
        rule=RULE_TEXT.format(n=MIN_PER_SIDE, e=min_effect), min_effect=float(min_effect), min_per_side=MIN_PER_SIDE,
        history=int(history), timeout_s=float(timeout_s), memory_mb=int(memory_mb), requested_metric=metric,
        points=tuple(points), signals=tuple(signals), signal=chosen.signal if chosen else None,
        cohens_d=chosen.cohens_d if chosen else None, cliffs_delta=chosen.cliffs_delta if chosen else None,
        auc=chosen.auc if chosen else None, accepted=accepted, why=why[:2000])
    blob = json.dumps(draft.model_dump(mode="json", exclude={"created_at", "validation_id"}), sort_keys=True)
    report = draft.model_copy(update={"validation_id": "val-" + hashlib.sha256(blob.encode()).hexdigest()[:12],
                                      "created_at": utc_now()})
    if write:
        store.write_validation(report)
        store.ledger.append(DiagnosticValidated(
            version=report.as_of, name=report.name, sha256=report.sha256, validation_id=report.validation_id,
            accepted=report.accepted, signal=report.signal, cliffs_delta=report.cliffs_delta,
            cohens_d=report.cohens_d, actor=report.author,
            reason=f"{reason} -> {'ACCEPTED' if accepted else 'REJECTED'}: {why}"[:500]))
    return report


# --------------------------------------------------------------------------- at the gate


def validated_user_diagnostics(store) -> list[tuple[UserDiagnostic, str, ValidationReport]]:
    """The latest validated revision of each user diagnostic name (with its source and the accepting report)."""
    latest = store.latest_validations()
    best: dict[str, tuple[UserDiagnostic, str, ValidationReport]] = {}
    for meta, src in store.user_diagnostics():  # oldest first: a later validated revision replaces an earlier one
        rep = latest.get((meta.name, meta.sha256))
        if meta.validated and rep is not None and rep.accepted:
            best[meta.name] = (meta, src, rep)
    return [best[n] for n in sorted(best)]


def run_validated(store, version: str, *, history: int = DEFAULT_HISTORY
                  ) -> tuple[dict[str, float | None], list[Finding]]:
    """Every validated user diagnostic over `version` (+ ancestors), in the sandbox, under the limits it was
    validated with: metrics "user:<name>/<metric>" and findings. Never raises: a run that fails (or a
    store problem) becomes a `diagnostic_error` warning finding, never a veto."""
    metrics: dict[str, float | None] = {}
    findings: list[Finding] = []
    try:
        chosen = validated_user_diagnostics(store)
    except Exception as exc:  # noqa: BLE001 - unreadable diagnostics/validations must not stop the loop
        msg = f"user diagnostics could not be read: {type(exc).__name__}: {str(exc)[:300]}; none of them ran"
        return metrics, [Finding(finding_id=finding_id("user", "diagnostic_error", (version,), None),
                                 diagnostic="user", code="diagnostic_error", severity="warning", message=msg,
                                 versions=(version,))]
    if not chosen:
        return metrics, findings
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_WORKERS, len(chosen)))) as pool:
        runs = list(pool.map(lambda c: _run(store, c[1], c[0].name, version, history, c[2].timeout_s,
                                            c[2].memory_mb), chosen))
    for (meta, _src, rep), (evidence, res) in zip(chosen, runs):
        uname = user_name(meta.name)
        if res.ok:
            for k, v in res.metrics.items():
                metrics[f"{uname}/{k}"] = v
            findings.extend(res.findings)
        else:
            findings.append(Finding(
                finding_id=finding_id(uname, "diagnostic_error", evidence or (version,), None), diagnostic=uname,
                code="diagnostic_error", severity="warning", versions=evidence or (version,),
                message=(f"diagnostic {meta.name} failed: {res.error} (revision {meta.sha256[:12]}, validated by "
                         f"{rep.validation_id}); it did not run, so {version} is unchecked on it")[:2000]))
    return metrics, findings
