"""ProposalQueue (= GateReview): the pending human gate with its evidence, the agent's proposals,
and APPROVE / REVISE / REJECT / ABORT, each recorded in the ledger with who and why."""
from __future__ import annotations

import contextlib
import getpass
import json
from typing import Any, ClassVar

import traitlets as t

from evotrainer import interventions
from evotrainer.errors import EvoTrainerError

from ._base import EvoWidget, clean, esm

_NOT_EDITABLE = ("intervention_id", "created_at", "kind", "schema_version")
OUTCOMES = ("promote", "reject", "inconclusive")


def intervention_json(iv) -> str:
    """The editable JSON of an intervention (without its id, time and kind)."""
    data = iv.model_dump(mode="json", by_alias=True, exclude=set(_NOT_EDITABLE))
    return json.dumps(data, indent=2, sort_keys=False)


def _template(parent: str | None, author: str) -> str:
    return json.dumps({
        "parent": parent,
        "change": {"factor": "hparam", "name": "temperature", "value": 0.8},
        "hypothesis": {"if": "we sample colder", "then": "format violations fall", "because": "less noise"},
        "target_metric": "avg_at_k",
        "success_criterion": {"metric": "avg_at_k", "op": ">", "threshold": 0},
        "rollback_plan": "set the temperature back",
        "evidence": [],
        "author": author,
    }, indent=2)


class ProposalQueue(EvoWidget):
    """Root element: `.evo-proposal-queue`; one `.evo-proposal` per proposal.

    Synced traits: `gate` ({version, gate, subject} or None), `proposals` (one dict each with its
    editable `json`), `findings` (cited findings of the parent's health report), `decision` (at
    the completion gate), `alerts` (of the version at the completion gate), `history` (answers so
    far), `rejected` (indices marked rejected in this view), `draft` (template for your own
    intervention), `who`, `auto_resume`, `message`. Buttons (data-action): approve, revise, reject,
    abort, write (your own intervention), promote/reject-outcome/inconclusive via
    answer_completion, refresh, resume.
    """

    _esm = esm("proposals.js")
    _ACTIONS: ClassVar[dict[str, str]] = {"approve": "approve", "revise": "revise", "reject": "reject", "abort": "abort",
                "answer_completion": "answer_completion", "write": "write_own", "refresh": "refresh",
                "resume": "resume"}

    gate = t.Dict(allow_none=True, default_value=None).tag(sync=True)
    proposals = t.List().tag(sync=True)
    findings = t.List().tag(sync=True)
    decision = t.Dict(allow_none=True, default_value=None).tag(sync=True)
    alerts = t.List().tag(sync=True)
    history = t.List().tag(sync=True)
    rejected = t.List().tag(sync=True)
    draft = t.Unicode("").tag(sync=True)
    who = t.Unicode("").tag(sync=True)
    auto_resume = t.Bool(False).tag(sync=True)

    def __init__(self, lab, who: str | None = None, auto_resume: bool = False, **kwargs):
        super().__init__(lab, **kwargs)
        self.who = who if who is not None else _user()
        self.auto_resume = auto_resume
        self.refresh()

    # ---- reading

    def refresh(self) -> None:
        lab, store = self.lab, self.lab.store
        gate = lab.gate
        self.gate = None if gate is None else {"version": gate.version, "gate": gate.gate,
                                               "subject": list(gate.subject)}
        props = lab.proposals
        reports = {b.backtest_id: b for b in store.backtests()}
        rows, cited = [], {}
        for i, p in enumerate(props):
            bt = reports.get(p.backtest_id) if p.backtest_id else None
            iv = p.intervention
            for fid in iv.evidence:
                cited.setdefault(fid, []).append(iv.intervention_id)
            rows.append({
                "index": i, "version": p.version, "rank": p.rank, "intervention_id": iv.intervention_id,
                "parent": iv.parent, "factor": iv.change.factor, "description": p.description,
                "hypothesis": iv.hypothesis.text(), "target_metric": iv.target_metric,
                "success_criterion": iv.success_criterion.text(), "rollback_plan": iv.rollback_plan,
                "evidence": list(iv.evidence), "author": iv.author, "rationale": iv.rationale,
                "backtest_id": p.backtest_id, "verdict": p.verdict, "reasons": list(bt.reasons) if bt else [],
                "dgr_before": bt.before.get("dgr") if bt else None, "dgr_after": bt.after.get("dgr") if bt else None,
                "selected": p.selected, "json": intervention_json(iv),
                "actionable": gate is not None and gate.version == p.version and gate.gate != "completion",
            })
        self.proposals = clean(rows)
        # evidence: the parent's findings the proposals cite (and any finding the gate asks about)
        parent = props[0].intervention.parent if props else None
        subject = set(gate.subject) if gate else set()
        found = []
        for v in dict.fromkeys([parent] + ([gate.version] if gate else [])):
            if v is None:
                continue
            with contextlib.suppress(Exception):
                rep = store.read_health_report(v)
                for f in (rep.findings if rep else ()):
                    if f.finding_id in cited or f.finding_id in subject:
                        found.append({"finding_id": f.finding_id, "version": v, "severity": f.severity, "code": f.code,
                                      "message": f.message, "cited_by": cited.get(f.finding_id, []),
                                      "n_examples": len(f.rollout_uids), "veto": f.veto})
        self.findings = clean(found)
        decision, alerts = None, []
        if gate is not None and gate.gate == "completion":
            decs = {d.decision_id: d for d in store.decisions()}
            d = next((decs[s] for s in gate.subject if s in decs), None)
            if d is None:
                d = next((x for x in decs.values() if x.candidate == gate.version), None)
            if d is not None:
                decision = {"decision_id": d.decision_id, "candidate": d.candidate, "baseline": d.baseline,
                            "outcome": d.outcome, "reason": d.reason, "rule": d.rule, "vetoes": list(d.vetoes),
                            "stats": d.stats.model_dump(mode="json") if d.stats else None}
            with contextlib.suppress(Exception):
                rep = store.read_health_report(gate.version)
                alerts = [{"finding_id": f.finding_id, "severity": f.severity, "code": f.code, "message": f.message,
                           "veto": f.veto} for f in (rep.alerts if rep else ())]
        self.decision = clean(decision)
        self.alerts = clean(alerts)
        self.history = clean([{"version": e.version, "gate": e.gate, "answer": e.answer, "actor": e.actor,
                               "reason": e.reason, "time": e.time, "intervention_id": e.intervention_id,
                               "outcome": e.outcome}
                              for e in store.ledger.events() if e.kind == "gate_answered"])
        if not self.draft:
            with contextlib.suppress(Exception):
                self.draft = _template(lab.loop_state().best() or (store.versions() or [None])[-1], self.who or "me")
        valid = {p["index"] for p in rows}
        self.rejected = [i for i in self.rejected if i in valid]

    # ---- checks shared by every answer

    def _check(self, reason: str | None, who: str | None) -> tuple[str, str] | None:
        who = (who if who is not None else self.who) or ""
        if not (reason or "").strip():
            self._say("a reason is required: the ledger records who decided and why", "error")
            return None
        if not who.strip():
            self._say("who is required: the ledger records who decided and why", "error")
            return None
        if self.lab.gate is None:
            self._say("the campaign is not waiting at a gate; nothing to answer", "error")
            return None
        return reason.strip(), who.strip()

    def _done(self, text: str) -> bool:
        self._say(text, "ok")
        if self.auto_resume:
            self.lab.resume()
        self.refresh()
        return True

    def _fail(self, exc: Exception) -> bool:
        self._say(str(exc), "error")
        self.refresh()
        return False

    # ---- answers (each button calls one of these)

    def approve(self, index: int | None = None, reason: str = "", who: str | None = None) -> bool:
        """APPROVE: with an index, carry that proposal on (Proposal.approve); without, approve the gate as is."""
        checked = self._check(reason, who)
        if checked is None:
            return False
        reason, who = checked
        gate = self.lab.gate
        try:
            if index is None:
                gate.approve(reason=reason, who=who)
                return self._done(f"{gate.version}: {gate.gate} gate approved by {who}")
            props = self.lab.proposals
            if not 0 <= int(index) < len(props):
                raise EvoTrainerError(f"no proposal #{index} (there are {len(props)})")
            p = props[int(index)]
            p.approve(reason=reason, who=who)
            return self._done(f"{p.version}: {p.intervention.intervention_id} approved by {who}")
        except EvoTrainerError as exc:
            return self._fail(exc)

    def revise(self, index: int | None = None, intervention_json: str | dict | None = None, reason: str = "",
               who: str | None = None) -> bool:
        """REVISE: the (edited) intervention JSON replaces the agent's candidates. It is validated with
        interventions.new and interventions.apply first; an invalid one stores nothing."""
        checked = self._check(reason, who)
        if checked is None:
            return False
        reason, who = checked
        gate = self.lab.gate
        if gate.gate == "completion":
            self._say("the campaign waits at the completion gate: use answer_completion (promote/reject/inconclusive)",
                      "error")
            return False
        try:
            iv = self.validate(intervention_json if intervention_json is not None else
                               (self.proposals[int(index)]["json"] if index is not None else None), who)
        except (EvoTrainerError, ValueError, TypeError, IndexError) as exc:
            self._say(f"not stored: {exc}", "error")
            return False
        try:
            gate.revise(iv, reason=reason, who=who)
        except EvoTrainerError as exc:
            return self._fail(exc)
        return self._done(f"{gate.version}: {gate.gate} gate revised by {who} with {iv.intervention_id}")

    def write_own(self, intervention_json: str | dict | None = None, reason: str = "", who: str | None = None) -> bool:
        """Your own intervention (the draft textarea): the same path as revise without a proposal."""
        return self.revise(None, intervention_json if intervention_json is not None else self.draft, reason, who)

    def validate(self, intervention_json: str | dict | None, who: str | None = None):
        """Parse and validate an intervention (JSON text or dict) without storing anything."""
        if intervention_json is None:
            raise ValueError("no intervention given")
        if isinstance(intervention_json, str):
            try:
                fields: Any = json.loads(intervention_json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"the intervention is not valid JSON: {exc}") from exc
        else:
            fields = dict(intervention_json)
        if not isinstance(fields, dict):
            raise TypeError("the intervention must be one JSON object")
        for k in _NOT_EDITABLE:
            fields.pop(k, None)
        if fields.get("parent") in (None, ""):
            fields.pop("parent", None)
        fields.setdefault("author", who or self.who or _user())
        iv = self.lab.intervention(**fields)
        parent = self.lab.store.read_version(iv.parent)
        interventions.apply(iv, parent.harness, parent.train)
        return iv

    def reject(self, index: int, reason: str = "", who: str | None = None) -> bool:
        """REJECT one proposal: the ledger has no per-proposal rejection, so it is marked here and the
        gate stays open: approve another proposal or revise with your own intervention."""
        props = self.proposals
        if not 0 <= int(index) < len(props):
            self._say(f"no proposal #{index}", "error")
            return False
        if int(index) not in self.rejected:
            self.rejected = [*self.rejected, int(index)]
        self._say(f"{props[int(index)]['intervention_id']} marked rejected (not recorded): approve another "
                  "proposal or revise with your own intervention to answer the gate", "info")
        return True

    def abort(self, reason: str = "", who: str | None = None) -> bool:
        """ABORT: end the campaign (recorded with who and why)."""
        checked = self._check(reason, who)
        if checked is None:
            return False
        reason, who = checked
        gate = self.lab.gate
        try:
            gate.abort(reason=reason, who=who)
        except EvoTrainerError as exc:
            return self._fail(exc)
        return self._done(f"campaign aborted at {gate.version}'s {gate.gate} gate by {who}")

    def answer_completion(self, outcome: str | None = None, reason: str = "", who: str | None = None) -> bool:
        """At the completion gate: None approves the gate's decision; an outcome overrides it."""
        checked = self._check(reason, who)
        if checked is None:
            return False
        reason, who = checked
        gate = self.lab.gate
        if gate.gate != "completion":
            self._say(f"the campaign waits at the {gate.gate} gate, not the completion gate", "error")
            return False
        if outcome is not None and outcome not in OUTCOMES:
            self._say(f"outcome must be one of {OUTCOMES} (or None to approve)", "error")
            return False
        try:
            if outcome is None:
                gate.approve(reason=reason, who=who)
            else:
                gate.revise(reason=reason, who=who, outcome=outcome)
        except EvoTrainerError as exc:
            return self._fail(exc)
        return self._done(f"{gate.version}: completion gate answered "
                          f"{'APPROVE' if outcome is None else outcome.upper()} by {who}")

    def resume(self) -> None:
        self.lab.resume()
        self._say("campaign resumed", "ok")
        self.refresh()


GateReview = ProposalQueue


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - a view must never take the kernel down
        return ""
