"""The skill library: validated trigger -> intervention recipes, shared by every campaign and domain.

A **skill** (PAPER-FACTS "Skills and memory") has five parts:

- **trigger**: a *declarative* condition over a version's health report, never code. `any_finding`
  lists finding conditions (a finding `code` or rule id such as "R1", at or above a severity), any
  one of which must be present; `all_metrics` lists thresholds over `HealthReport.metrics`
  ("dead_groups/dgr > 0.3"), all of which must hold. Matching is a pure function of stored
  findings, so a skill file from another campaign or machine can never run anything here (a trigger
  written as code would need the sandbox on every retrieval; the findings already carry the
  diagnostics' thresholds, so a declarative trigger is both safer and enough).
- **intervention template**: an Intervention `change` dict (one factor) plus its hypothesis,
  target metric, success criterion and rollback plan. A data change's `source_version` is dropped
  (None = the parent), so the template fits any parent.
- **expected outcome**: the hypothesis' "then" with the success criterion.
- **validation record**: every use of the skill, appended: campaign, domain, version, intervention,
  backtest verdict, the gate's Δ / CI / p-value, the outcome and who decided it. A use is keyed by
  (campaign dir, version); a later record with the same key (a person's completion-gate override)
  supersedes the earlier one, which stays in the file.
- **domain applicability**: the domains where it worked (an effective "promote"). The status is
  "in_domain" until it has worked in >= 2 domains, then "cross_domain".

**Creation and uses** (`sync_campaign`, called by the controller after each judgement and before each
proposal): a judged version whose intervention's change equals a skill's template is a use of that
skill, whatever its outcome (promote / reject / inconclusive / vetoed), so failed uses are recorded
too. A promoted intervention with no skill yet creates one; its trigger is built from the parent's
findings that the intervention cites as evidence (else the parent's critical findings, else its
warnings). A later promotion of the same template adds its evidence to the trigger (any-of union).
The skill id is a content hash of the normalised template.

**Retrieval and transfer** (`SkillLibrary.retrieve`): skills whose trigger matches, minus what was
already tried on this parent. Skills that worked in the campaign's own domain come first. Skills
that worked only in *other* domains are a fallback, returned only after in-domain attempts failed,
which means concretely: the campaign's last `TRANSFER_AFTER_FAILURES` (3, PAPER-FACTS: "after 3
failed versions in a row ... look up other domains' skills") judged versions were not promoted
(`failures`), or the caller has no untried in-domain candidate left (`exhausted`). A returned skill
is a transfer when `skill.is_transfer(domain)`.

**Storage** (`<data dir>/skills/`, `paths.data_dir()`): `<skill_id>.json` (a frozen `Skill` document
with schema_version, written atomically under a lock; an update may only append uses and add
trigger conditions, which the writer checks) and `SKILL-<skill_id>.md` beside it (human-readable,
regenerated on every update). A file that cannot be read raises `SkillError` naming the file and
the fix; nothing is written over it.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from . import paths
from .errors import EvoTrainerError
from .schema import (
    SCHEMA_VERSION,
    Change,
    Document,
    Finding,
    Frozen,
    HealthReport,
    Hypothesis,
    Intervention,
    Severity,
    SuccessCriterion,
    is_probe,
    utc_now,
)
from .store import Store, atomic_write_bytes

TRANSFER_AFTER_FAILURES = 3  # consecutive non-promoted versions before other domains' skills are offered
CROSS_DOMAIN_AFTER = 2  # domains a skill must have worked in to be "cross_domain"
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
_ID_RE = re.compile(r"^sk-[0-9a-f]{12}$")
_CHANGE = TypeAdapter(Change)
CATEGORY = {"reward": "reward design", "filter": "filter mechanism", "data": "data selection",
            "hparam": "training stability", "env": "environment hygiene", "diagnostic": "evaluation protocol",
            "procedure": "evaluation protocol"}
Outcome = Literal["promote", "reject", "inconclusive", "vetoed"]


class SkillError(EvoTrainerError):
    """A skill file cannot be read or an update would break the library's append-only rule."""


# --------------------------------------------------------------------------- templates


def normalise_change(change: Mapping[str, Any] | Any) -> dict[str, Any]:
    """A change (dict or typed Change) as a canonical dict; data selections lose their source version."""
    raw = change.model_dump(mode="json") if hasattr(change, "model_dump") else dict(change)
    try:
        typed = _CHANGE.validate_python(raw)
    except ValidationError as exc:
        raise SkillError(f"not an intervention change: {exc.errors()[0]['msg']} ({raw})") from exc
    out = typed.model_dump(mode="json")
    if out.get("factor") == "data":
        out["data_selection"] = {**out["data_selection"], "source_version": None}
    return out


def skill_id_for(change: Mapping[str, Any] | Any) -> str:
    blob = json.dumps(normalise_change(change), sort_keys=True, separators=(",", ":"))
    return "sk-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def describe_change(change: Mapping[str, Any] | Any) -> str:
    from .interventions import describe

    return describe(SimpleNamespace(change=_CHANGE.validate_python(normalise_change(change))))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- trigger


class FindingCondition(Frozen):
    """A finding with this code (or raised by this rule), at or above `min_severity`."""

    code: str | None = None
    rule: str | None = None
    min_severity: Severity = "warning"

    @model_validator(mode="after")
    def _something(self) -> FindingCondition:
        if not self.code and not self.rule:
            raise ValueError("a finding condition names a finding code or a rule id")
        return self

    def matches(self, f: Finding) -> bool:
        if _SEVERITY_RANK[f.severity] < _SEVERITY_RANK[self.min_severity]:
            return False
        return bool((self.code and f.code == self.code) or (self.rule and f.rule == self.rule))

    def describe(self) -> str:
        what = f"finding `{self.code}`" if self.code else f"rule {self.rule}"
        return f"{what} (severity >= {self.min_severity})"


class MetricCondition(Frozen):
    """A health-report metric ("<diagnostic>/<metric>") compared with a threshold."""

    metric: str = Field(min_length=1)
    op: Literal[">", ">=", "<", "<="]
    value: float

    def holds(self, metrics: Mapping[str, float | None]) -> bool:
        v = metrics.get(self.metric)
        if v is None:
            return False
        return {">": v > self.value, ">=": v >= self.value, "<": v < self.value, "<=": v <= self.value}[self.op]

    def describe(self) -> str:
        return f"`{self.metric}` {self.op} {self.value:g}"


class Trigger(Frozen):
    """Declarative: any one of `any_finding` is present AND every one of `all_metrics` holds."""

    any_finding: tuple[FindingCondition, ...] = ()
    all_metrics: tuple[MetricCondition, ...] = ()

    @model_validator(mode="after")
    def _not_empty(self) -> Trigger:
        if not self.any_finding and not self.all_metrics:
            raise ValueError("a trigger needs at least one finding or metric condition")
        return self

    def match(self, findings: Iterable[Finding], metrics: Mapping[str, float | None] | None = None
              ) -> tuple[str, ...] | None:
        """The ids of the findings that satisfy it (possibly empty for a metric-only trigger), or None."""
        findings = tuple(findings)
        hit = tuple(f.finding_id for f in findings if any(c.matches(f) for c in self.any_finding))
        if self.any_finding and not hit:
            return None
        if self.all_metrics and not all(m.holds(metrics or {}) for m in self.all_metrics):
            return None
        return hit

    def merged(self, other: Trigger) -> Trigger:
        return Trigger(any_finding=tuple(dict.fromkeys((*self.any_finding, *other.any_finding))),
                       all_metrics=self.all_metrics)

    def describe(self) -> str:
        parts = []
        if self.any_finding:
            parts.append("any of: " + "; ".join(c.describe() for c in self.any_finding))
        if self.all_metrics:
            parts.append("all of: " + "; ".join(m.describe() for m in self.all_metrics))
        return " AND ".join(parts)

    def codes(self) -> list[str]:
        return [c.code or c.rule or "?" for c in self.any_finding]


# --------------------------------------------------------------------------- the document


class GateSummary(Frozen):
    n_items: int
    mean_delta: float
    ci_low: float
    ci_high: float
    p_wilcoxon: float | None = None


class SkillUse(Frozen):
    """One use of a skill: a judged version whose intervention's change is the skill's template."""

    campaign: str
    campaign_dir: str
    domain: str
    version: str
    parent: str | None = None
    intervention_id: str
    author: str = ""  # who proposed the intervention
    outcome: Outcome
    decided_by: str = "gate"  # the gate, or the person who overrode it
    reason: str = ""
    decision_id: str | None = None
    backtest_id: str | None = None
    backtest_verdict: str | None = None
    gate: GateSummary | None = None
    vetoes: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()  # the parent's alert codes when it was used (an evidence snapshot)
    retrieved: bool = False  # the intervention came from retrieving this skill (its rationale cites it)
    transfer: bool = False  # the skill had not worked in this domain yet
    time: str = Field(default_factory=utc_now)

    @property
    def key(self) -> tuple[str, str]:
        return (self.campaign_dir, self.version)


class Skill(Document):
    kind: Literal["skill"] = "skill"
    skill_id: str
    title: str
    category: str
    trigger: Trigger
    template: dict[str, Any]  # an Intervention `change`
    hypothesis: Hypothesis
    target_metric: str
    success_criterion: SuccessCriterion
    rollback_plan: str
    expected_outcome: str
    created_at: str = Field(default_factory=utc_now)
    uses: tuple[SkillUse, ...] = ()

    @model_validator(mode="after")
    def _template_is_its_id(self) -> Skill:
        if normalise_change(self.template) != self.template:
            raise ValueError("template is not a normalised intervention change")
        if skill_id_for(self.template) != self.skill_id:
            raise ValueError(f"skill_id {self.skill_id} is not the content id of its template ({skill_id_for(self.template)})")
        return self

    # ---- derived from the validation record

    def effective_uses(self) -> list[SkillUse]:
        """The last record of each (campaign, version), in the order first seen."""
        last: dict[tuple[str, str], SkillUse] = {}
        for u in self.uses:
            last[u.key] = u
        return list(last.values())

    @property
    def domains(self) -> tuple[str, ...]:
        """Domains where it worked (an effective promote), in the order it first worked there."""
        return tuple(dict.fromkeys(u.domain for u in self.effective_uses() if u.outcome == "promote"))

    @property
    def status(self) -> Literal["in_domain", "cross_domain"]:
        return "cross_domain" if len(self.domains) >= CROSS_DOMAIN_AFTER else "in_domain"

    def successes(self, domain: str | None = None) -> int:
        return sum(1 for u in self.effective_uses() if u.outcome == "promote" and domain in (None, u.domain))

    def failures(self, domain: str | None = None) -> int:
        return sum(1 for u in self.effective_uses() if u.outcome != "promote" and domain in (None, u.domain))

    def is_transfer(self, domain: str) -> bool:
        """Using it in `domain` borrows from other domains: it has not worked there yet."""
        return domain not in self.domains

    def matched(self, findings: Iterable[Finding] | HealthReport | None,
                metrics: Mapping[str, float | None] | None = None) -> tuple[str, ...] | None:
        fs, ms = _findings_and_metrics(findings, metrics)
        return self.trigger.match(fs, ms)

    def markdown(self) -> str:
        return _markdown(self)


# --------------------------------------------------------------------------- the library


def _findings_and_metrics(findings, metrics):
    if isinstance(findings, HealthReport):
        return findings.findings, (metrics if metrics is not None else findings.metrics)
    out = []
    for f in findings or ():
        out.append(f if isinstance(f, Finding) else Finding.model_validate(f))
    return tuple(out), (metrics or {})


def _tried_keys(tried: Iterable[Any]) -> tuple[set[str], set[str]]:
    """(skill ids, describe strings) of what was tried: ids, Interventions, change dicts or describe() strings."""
    ids, texts = set(), set()
    for t in tried or ():
        if isinstance(t, Intervention):
            t = t.change
        if isinstance(t, str):
            (ids if _ID_RE.match(t) else texts).add(t)
            continue
        try:
            ids.add(skill_id_for(t))
        except SkillError:
            continue
    return ids, texts


class SkillLibrary:
    """The skills under one directory (default `<data dir>/skills`)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def open(cls, root: str | Path | None = None) -> SkillLibrary:
        return cls(Path(root) if root is not None else paths.data_dir() / "skills")

    # ---- files

    def path(self, skill_id: str) -> Path:
        if not _ID_RE.match(skill_id):
            raise SkillError(f"not a skill id: {skill_id!r} (expected sk- and 12 hex digits)")
        return self.root / f"{skill_id}.json"

    def markdown_path(self, skill_id: str) -> Path:
        return self.path(skill_id).with_name(f"SKILL-{skill_id}.md")

    def _read(self, path: Path) -> Skill:
        fix = (f"nothing was changed; restore {path} from a backup, or move it aside "
               f"(mv {path} {path}.corrupt) to go on without that skill")
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SkillError(f"skill file {path} is not readable JSON ({type(exc).__name__}: {exc}); {fix}") from exc
        if not isinstance(raw, dict):
            raise SkillError(f"skill file {path} is not a JSON object; {fix}")
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise SkillError(f"skill file {path} has schema_version {raw.get('schema_version')!r}, this release reads "
                             f"{SCHEMA_VERSION}; open it with the release that wrote it, or {fix}")
        try:
            skill = Skill.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            raise SkillError(f"skill file {path} is not a valid skill (field '{loc}': {err['msg']}); {fix}") from exc
        if path.stem != skill.skill_id:
            raise SkillError(f"skill file {path} holds skill {skill.skill_id}; {fix}")
        return skill

    def get(self, skill_id: str) -> Skill | None:
        path = self.path(skill_id)
        return self._read(path) if path.exists() else None

    def all(self) -> list[Skill]:
        """Every skill, oldest first. One unreadable file raises SkillError (naming it); nothing is skipped silently."""
        if not self.root.exists():
            return []
        skills, bad = [], []
        for p in sorted(self.root.glob("sk-*.json")):
            try:
                skills.append(self._read(p))
            except SkillError as exc:
                bad.append(exc)
        if bad:
            more = f" ({len(bad) - 1} more unreadable skill file(s))" if len(bad) > 1 else ""
            raise SkillError(f"{bad[0]}{more}")
        return sorted(skills, key=lambda s: (s.created_at, s.skill_id))

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _write(self, old: Skill | None, new: Skill) -> Skill:
        if old is not None:
            if new.uses[: len(old.uses)] != old.uses:
                raise SkillError(f"update of {new.skill_id} would rewrite its validation record; uses are append-only")
            if not set(old.trigger.any_finding) <= set(new.trigger.any_finding):
                raise SkillError(f"update of {new.skill_id} would drop trigger conditions; triggers only grow")
        path = self.path(new.skill_id)
        atomic_write_bytes(path, (json.dumps(new.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode())
        atomic_write_bytes(self.markdown_path(new.skill_id), new.markdown().encode())
        return new

    def rewrite_markdown(self) -> list[Path]:
        """Regenerate every SKILL-<id>.md from its JSON (e.g. after restoring a file)."""
        out = []
        for s in self.all():
            atomic_write_bytes(self.markdown_path(s.skill_id), s.markdown().encode())
            out.append(self.markdown_path(s.skill_id))
        return out

    # ---- updates

    def learn(self, change: Mapping[str, Any] | Any, *, trigger: Trigger, hypothesis: Hypothesis | Mapping,
              target_metric: str, success_criterion: SuccessCriterion | Mapping, rollback_plan: str,
              use: SkillUse, title: str | None = None) -> Skill:
        """Create the skill of `change` from a promoted use, or add the promotion (and its trigger) to it."""
        if use.outcome != "promote":
            raise SkillError(f"a skill is learned from a promoted version, not a {use.outcome} one; use record_use")
        template = normalise_change(change)
        sid = skill_id_for(template)
        with self._lock():
            old = self.get(sid)
            if old is not None:
                uses = old.uses if _same_use(old, use) else (*old.uses, _with_transfer(old, use))
                return self._write(old, old.model_copy(update={"trigger": old.trigger.merged(trigger), "uses": uses}))
            hyp = hypothesis if isinstance(hypothesis, Hypothesis) else Hypothesis.model_validate(hypothesis)
            crit = (success_criterion if isinstance(success_criterion, SuccessCriterion)
                    else SuccessCriterion.model_validate(success_criterion))
            what = describe_change(template)
            skill = Skill(
                skill_id=sid, title=title or f"{what} on {', '.join(trigger.codes()) or trigger.describe()}",
                category=CATEGORY.get(template["factor"], template["factor"]), trigger=trigger, template=template,
                hypothesis=hyp, target_metric=target_metric, success_criterion=crit, rollback_plan=rollback_plan,
                expected_outcome=f"{hyp.then} (success criterion: {crit.text()})",
                uses=(use.model_copy(update={"transfer": False}),))
            return self._write(None, skill)

    def record_use(self, skill_id: str, use: SkillUse) -> Skill:
        """Append a use (any outcome). A repeat of the last record of the same version changes nothing."""
        with self._lock():
            old = self.get(skill_id)
            if old is None:
                raise SkillError(f"no skill {skill_id} in {self.root}")
            if _same_use(old, use):
                return old
            return self._write(old, old.model_copy(update={"uses": (*old.uses, _with_transfer(old, use))}))

    def create_from_promotion(self, store: Store, version: str, *, outcome: Outcome = "promote",
                              decided_by: str = "gate", reason: str = "") -> Skill | None:
        """The skill of `version`'s intervention, created or updated from its promotion (None: no trigger)."""
        use, iv = _use_of(store, version, outcome=outcome, decided_by=decided_by, reason=reason)
        trigger = trigger_from_evidence(store, iv)
        if trigger is None:
            return None
        return self.learn(iv.change, trigger=trigger, hypothesis=iv.hypothesis, target_metric=iv.target_metric,
                          success_criterion=iv.success_criterion, rollback_plan=iv.rollback_plan, use=use)

    # ---- retrieval

    def retrieve(self, findings: Iterable[Finding] | HealthReport | None, domain: str, *, tried: Iterable[Any] = (),
                 failures: int = 0, exhausted: bool = False,
                 metrics: Mapping[str, float | None] | None = None) -> list[Skill]:
        """Skills whose trigger matches, not yet tried: in-domain first; other domains' only as a fallback.

        `tried`: what was already tried on this parent (skill ids, Interventions, change dicts, or
        `interventions.describe` strings). `failures`: the campaign's consecutive non-promoted versions;
        `exhausted`: the caller has no untried in-domain candidate. Other domains' skills are returned
        (after the in-domain ones) only when failures >= TRANSFER_AFTER_FAILURES or exhausted.
        """
        fs, ms = _findings_and_metrics(findings, metrics)
        ids, texts = _tried_keys(tried)
        matching = []
        for s in self.all():
            if s.skill_id in ids or describe_change(s.template) in texts:
                continue
            if s.trigger.match(fs, ms) is not None:
                matching.append(s)
        own = sorted((s for s in matching if not s.is_transfer(domain)),
                     key=lambda s: (-s.successes(domain), s.failures(domain), s.skill_id))
        if not transfer_allowed(failures, exhausted):
            return own
        other = sorted((s for s in matching if s.is_transfer(domain)),
                       key=lambda s: (s.failures(domain), -len(s.domains), -s.successes(), s.skill_id))
        return own + other


def transfer_allowed(failures: int, exhausted: bool = False) -> bool:
    """Other domains' skills are a fallback: after TRANSFER_AFTER_FAILURES non-promoted versions in a row, or
    when no untried in-domain candidate is left."""
    return exhausted or failures >= TRANSFER_AFTER_FAILURES


def _same_use(skill: Skill, use: SkillUse) -> bool:
    last = next((u for u in reversed(skill.uses) if u.key == use.key), None)
    return last is not None and (last.outcome, last.decided_by, last.intervention_id) == (
        use.outcome, use.decided_by, use.intervention_id)


def _with_transfer(skill: Skill, use: SkillUse) -> SkillUse:
    """Mark the use as a transfer when the skill had not worked in its domain (other versions' records)."""
    worked = {u.domain for u in skill.effective_uses() if u.outcome == "promote" and u.key != use.key}
    return use.model_copy(update={"transfer": use.domain not in worked})


# --------------------------------------------------------------------------- from a campaign


def trigger_from_evidence(store: Store, iv: Intervention) -> Trigger | None:
    """The parent's findings the intervention cites; else its critical findings; else its warnings."""
    report = store.read_health_report(iv.parent)
    findings = report.findings if report else ()
    chosen = [f for f in findings if f.finding_id in iv.evidence]
    if not chosen:
        chosen = [f for f in findings if f.severity == "critical"] or [f for f in findings if f.severity == "warning"]
    conds = []
    for f in chosen:
        cond = FindingCondition(code=f.code, min_severity="info" if f.severity == "info" else "warning")
        if cond not in conds:
            conds.append(cond)
    return Trigger(any_finding=tuple(conds)) if conds else None


def _use_of(store: Store, version: str, *, outcome: str | None = None, decided_by: str | None = None,
            reason: str | None = None, state=None, decisions: Mapping[str, Any] | None = None,
            skill_id: str | None = None) -> tuple[SkillUse, Intervention]:
    from .loopstate import derive

    spec = store.read_version(version)
    if spec.intervention is None:
        raise SkillError(f"{version} has no intervention; only an intervention can become a skill")
    iv = store.read_intervention(spec.intervention)
    state = state or derive(store.ledger.events(), store.campaign.name)
    lp = state.loop(version)
    decisions = decisions if decisions is not None else {d.decision_id: d for d in store.decisions()}
    decision = decisions.get(lp.judged.decision_id) if lp.judged else None
    who, why = lp.decided_by
    gate = None
    if decision is not None and decision.stats is not None:
        st = decision.stats
        gate = GateSummary(n_items=st.n_items, mean_delta=st.mean_delta, ci_low=st.ci_low, ci_high=st.ci_high,
                           p_wilcoxon=st.p_wilcoxon)
    bt_id, verdict = lp.selected_backtest, None
    if iv.intervention_id in lp.backtests:
        bt_id, verdict = lp.backtests[iv.intervention_id]
    report = store.read_health_report(iv.parent)
    use = SkillUse(
        campaign=store.campaign.name, campaign_dir=str(store.root.resolve()), domain=spec.data.domain,
        version=version, parent=spec.parent, intervention_id=iv.intervention_id, author=iv.author,
        outcome=outcome or lp.outcome or "inconclusive", decided_by=decided_by or who, reason=(reason or why)[:300],
        decision_id=decision.decision_id if decision else None, backtest_id=bt_id, backtest_verdict=verdict,
        gate=gate, vetoes=decision.vetoes if decision else (),
        evidence=tuple(dict.fromkeys(f.code for f in (report.alerts if report else ()))),
        retrieved=bool(skill_id and skill_id in iv.rationale))
    return use, iv


def sync_campaign(store: Store, library: SkillLibrary | None = None) -> list[str]:
    """Bring the library up to date with a campaign's judged versions (idempotent). Returns log lines.

    Each judged full version with an intervention: its effective outcome (a person's completion-gate
    override wins) is appended to the skill whose template is its change; a promotion with no skill
    yet creates one."""
    from .loopstate import derive

    lib = library or SkillLibrary.open()
    state = derive(store.ledger.events(), store.campaign.name)
    decisions = {d.decision_id: d for d in store.decisions()}
    lines: list[str] = []
    for name in sorted(state.versions):
        lp = state.versions[name]
        if is_probe(name) or lp.judged is None or lp.outcome is None or name not in store.versions():
            continue
        spec = store.read_version(name)
        if spec.intervention is None or spec.role == "probe":
            continue
        iv = store.read_intervention(spec.intervention)
        sid = skill_id_for(iv.change)
        skill = lib.get(sid)
        if skill is None and lp.outcome != "promote":
            continue
        use, _ = _use_of(store, name, state=state, decisions=decisions, skill_id=sid)
        if skill is not None and _same_use(skill, use):
            continue
        if skill is None:
            trigger = trigger_from_evidence(store, iv)
            if trigger is None:
                lines.append(f"skills: {name} promoted {iv.intervention_id}, but its parent has no finding to "
                             "trigger on; not stored as a skill")
                continue
            made = lib.learn(iv.change, trigger=trigger, hypothesis=iv.hypothesis, target_metric=iv.target_metric,
                             success_criterion=iv.success_criterion, rollback_plan=iv.rollback_plan, use=use)
            lines.append(f"skills: new skill {made.skill_id} '{made.title}' from {name} ({made.status}, "
                         f"{lib.markdown_path(made.skill_id)})")
        elif use.outcome == "promote":
            made = lib.learn(iv.change, trigger=trigger_from_evidence(store, iv) or skill.trigger,
                             hypothesis=iv.hypothesis, target_metric=iv.target_metric,
                             success_criterion=iv.success_criterion, rollback_plan=iv.rollback_plan, use=use)
            lines.append(f"skills: {name} promoted skill {sid}; it has worked in {', '.join(made.domains)} "
                         f"({made.status})")
        else:
            made = lib.record_use(sid, use)
            lines.append(f"skills: {name} used skill {sid}{' (transfer)' if made.uses[-1].transfer else ''}: "
                         f"{use.outcome}")
    return lines


# --------------------------------------------------------------------------- markdown


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown(s: Skill) -> str:
    effective = {id(u) for u in s.effective_uses()}
    domains = s.domains
    lines = [
        f"# Skill {s.skill_id}: {s.title}", "",
        (f"- **Status:** {s.status} (worked in {len(domains)} domain(s): {', '.join(domains) or 'none'}; "
         f"cross_domain after {CROSS_DOMAIN_AFTER})"),
        f"- **Category:** {s.category}",
        f"- **Created:** {s.created_at}",
        f"- **Uses:** {s.successes()} promoted, {s.failures()} not", "",
        "## Trigger condition", "",
        s.trigger.describe(), "",
        ("Declarative: matched against a version's health report (finding codes, rule ids, metric thresholds); "
         "no code runs."), "",
        "## Intervention", "",
        "```json", json.dumps(s.template, indent=2, sort_keys=True), "```", "",
        f"- **Hypothesis:** {s.hypothesis.text()}",
        f"- **Target metric:** {s.target_metric}; success criterion {s.success_criterion.text()}",
        f"- **Rollback:** {s.rollback_plan}", "",
        "## Expected outcome", "",
        s.expected_outcome, "",
        "## Validation", "",
        "Every use, appended (a superseded record is struck through).", "",
        ("| # | time | campaign | domain | version | intervention | backtest | gate Δ [95% CI] p | outcome | decided by "
         "| transfer |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, u in enumerate(s.uses, 1):
        g = (f"{u.gate.mean_delta:+.3f} [{u.gate.ci_low:+.3f}, {u.gate.ci_high:+.3f}] p={u.gate.p_wilcoxon:.3g}"
             if u.gate and u.gate.p_wilcoxon is not None else
             f"{u.gate.mean_delta:+.3f} [{u.gate.ci_low:+.3f}, {u.gate.ci_high:+.3f}]" if u.gate else "-")
        outcome = u.outcome if id(u) in effective else f"~~{u.outcome}~~"
        who = u.decided_by + (f": {u.reason}" if u.decided_by != "gate" and u.reason else "")
        lines.append(f"| {i} | {u.time} | {_md(u.campaign)} (`{_md(u.campaign_dir)}`) | {u.domain} | {u.version} | "
                     f"{u.intervention_id} by {_md(u.author)} | {u.backtest_verdict or '-'} | {g} | {outcome} | "
                     f"{_md(who)} | {'yes' if u.transfer else 'no'}{' (retrieved)' if u.retrieved else ''} |")
    lines += ["", "## Domain applicability", ""]
    seen = list(dict.fromkeys(u.domain for u in s.effective_uses()))
    for d in seen:
        ok, bad = s.successes(d), s.failures(d)
        via = " (reached by transfer)" if any(u.transfer for u in s.effective_uses() if u.domain == d) else ""
        lines.append(f"- {d}: {'worked' if ok else 'not yet worked'} ({ok} promoted, {bad} not){via}")
    lines.append("")
    return "\n".join(lines)
