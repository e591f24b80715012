"""Campaign memory: the version ledger summary, case memory, notes and the search trace.

PAPER-FACTS lists four kinds of memory: the version ledger (versions, configs, lineage), case memory
(evidence snapshots and outcomes), the skill library (`evotrainer.skills`, global) and the search
trace (queries, sources, retrieved artifacts). Here:

- `ledger_summary(store)`: one dict per version (parent, Avg@k, effective outcome and who decided,
  the intervention), replayed from the ledger;
- `cases(store)`: one dict per child version: the parent's key findings (the evidence snapshot),
  the intervention with its hypothesis and rationale, the other candidates, the selected backtest's
  verdict, and the decision with its statistics;
- `add_note` / `notes`: free-text notes by a person or an agent (append-only, timed);
- `record_search` / `search_trace`: what an agent looked up, where, and what it found;
- `compact(store, max_chars)`: all of it as text that fits an agent's context (newest first when cut);
- `memory_frame(store)`: the cases as a polars DataFrame, for notebooks.

Files (inside the campaign directory; the ledger summary and cases are derived from the store, so
only what exists nowhere else is written):

    <campaign>/memory/notes.jsonl      {"time", "author", "text", "version"}
    <campaign>/memory/search.jsonl     {"time", "author", "tool", "query", "where", "found"}

Both are append-only JSON lines written like the ledger (flock, O_APPEND, fsync; a line torn by a
killed writer is ended by the next append and skipped when read).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from .errors import EvoTrainerError
from .schema import utc_now
from .store import Store, append_line

NOTES = "notes.jsonl"
SEARCH = "search.jsonl"


class MemoryRecordError(EvoTrainerError):
    """A memory record was refused (empty text, no author, a query that is not JSON)."""


def memory_dir(store: Store) -> Path:
    return Path(store.root) / "memory"


# --------------------------------------------------------------------------- append-only JSON lines


def _append(path: Path, record: dict) -> None:
    try:
        line = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        raise MemoryRecordError(f"memory record is not JSON-serialisable ({exc}); pass plain dicts, lists and strings") from exc
    append_line(path, line)


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a torn line: its write never completed
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _latest_version(store: Store) -> str | None:
    versions = [v for v in store.versions() if len(v) == 4]
    return versions[-1] if versions else None


# --------------------------------------------------------------------------- notes and the search trace


def add_note(store: Store, text: str, author: str) -> None:
    """Append a note (what someone learned or decided and why); notes are never edited."""
    if not isinstance(text, str) or not text.strip():
        raise MemoryRecordError("a memory note needs text")
    if not isinstance(author, str) or not author.strip():
        raise MemoryRecordError("a memory note needs an author (who wrote it)")
    _append(memory_dir(store) / NOTES, {"time": utc_now(), "author": author.strip(), "text": text.strip(),
                                        "version": _latest_version(store)})


def notes(store: Store) -> list[dict]:
    """Every note, oldest first: {"time", "author", "text", "version"}."""
    return _read(memory_dir(store) / NOTES)


def record_search(store: Store, tool: str, query: dict, where: str, author: str, *, found: Any = None) -> None:
    """Append one look-up to the search trace: which tool, the query, where it looked, and (optionally)
    what it found (ids, counts)."""
    if not tool or not author:
        raise MemoryRecordError("a search record needs the tool and the author")
    _append(memory_dir(store) / SEARCH, {"time": utc_now(), "author": author, "tool": tool,
                                         "query": query if isinstance(query, dict) else {"query": query},
                                         "where": str(where), "found": found})


def search_trace(store: Store) -> list[dict]:
    """Every look-up, oldest first: {"time", "author", "tool", "query", "where", "found"}."""
    return _read(memory_dir(store) / SEARCH)


# --------------------------------------------------------------------------- derived: ledger summary and cases


def _describe(iv) -> str:
    from .interventions import describe

    try:
        return describe(iv)
    except Exception:  # noqa: BLE001 - memory must read any stored intervention
        return json.dumps(iv.change.model_dump(mode="json"), sort_keys=True)


def _loop(store: Store):
    from .loopstate import derive

    return derive(store.ledger.events(), store.campaign.name)


def ledger_summary(store: Store) -> list[dict]:
    """One dict per version (probes included, marked), chronological."""
    state = _loop(store)
    out = []
    for name in store.versions():
        spec = store.read_version(name)
        st = state.status.versions.get(name)
        lp = state.loop(name)
        iv = store.read_intervention(spec.intervention) if spec.intervention else None
        who, why = lp.decided_by
        out.append({
            "version": name, "parent": spec.parent, "role": spec.role,
            "state": st.state.value if st else "created",
            "avg_at_k": st.final_avg_at_k if st else None,
            "outcome": lp.outcome, "gate_outcome": lp.judged.outcome if lp.judged else None,
            "decided_by": who or None, "override_reason": why if lp.judged and lp.outcome != lp.judged.outcome else None,
            "intervention_id": iv.intervention_id if iv else None,
            "change": _describe(iv) if iv else None, "author": iv.author if iv else None,
        })
    return out


def cases(store: Store) -> list[dict]:
    """Case memory: per child version, the evidence it started from, what was tried, and how it ended."""
    state = _loop(store)
    decisions = {d.decision_id: d for d in store.decisions()}
    backtests = {b.backtest_id: b for b in store.backtests()}
    out = []
    for name in store.versions():
        spec = store.read_version(name)
        if spec.intervention is None or spec.role == "probe":
            continue
        iv = store.read_intervention(spec.intervention)
        lp = state.loop(name)
        report = store.read_health_report(iv.parent)
        alerts = sorted(report.alerts if report else (), key=lambda f: (f.severity != "critical", f.code))
        bt_id = lp.backtests.get(iv.intervention_id, (lp.selected_backtest, None))[0]
        bt = backtests.get(bt_id) if bt_id else None
        d = decisions.get(lp.judged.decision_id) if lp.judged else None
        st = d.stats if d else None
        who, why = lp.decided_by
        parent_st = state.status.versions.get(iv.parent)
        own_st = state.status.versions.get(name)
        others = []
        for other in lp.proposed:
            if other == iv.intervention_id:
                continue
            try:
                oiv = store.read_intervention(other)
            except EvoTrainerError:
                continue
            others.append({"intervention_id": other, "change": _describe(oiv),
                           "backtest_verdict": lp.backtests.get(other, (None, None))[1]})
        out.append({
            "version": name, "parent": iv.parent,
            "parent_findings": [{"finding_id": f.finding_id, "code": f.code, "severity": f.severity,
                                 "rule": f.rule, "veto": f.veto, "message": f.message[:200]} for f in alerts],
            "intervention_id": iv.intervention_id, "factor": iv.change.factor, "change": _describe(iv),
            "author": iv.author, "hypothesis": iv.hypothesis.text(), "criterion": iv.success_criterion.text(),
            "rationale": iv.rationale, "evidence": list(iv.evidence), "alternatives": others,
            "backtest_id": bt.backtest_id if bt else bt_id, "backtest_verdict": bt.verdict if bt else None,
            "backtest_reasons": list(bt.reasons) if bt else [],
            "parent_avg_at_k": parent_st.final_avg_at_k if parent_st else None,
            "avg_at_k": own_st.final_avg_at_k if own_st else None,
            "outcome": lp.outcome, "gate_outcome": lp.judged.outcome if lp.judged else None,
            "decided_by": who or None, "decision_reason": why or None,
            "mean_delta": st.mean_delta if st else None, "ci_low": st.ci_low if st else None,
            "ci_high": st.ci_high if st else None, "p_wilcoxon": st.p_wilcoxon if st else None,
            "n_items": st.n_items if st else None, "vetoes": list(d.vetoes) if d else [],
        })
    return out


_FRAME_COLUMNS = ["version", "parent", "factor", "change", "author", "evidence_codes", "backtest_verdict",
                  "parent_avg_at_k", "avg_at_k", "outcome", "decided_by", "mean_delta", "ci_low", "ci_high",
                  "p_wilcoxon", "n_items", "hypothesis", "rationale"]


def memory_frame(store: Store) -> pl.DataFrame:
    """The cases as one row per child version (for notebooks)."""
    rows = []
    for c in cases(store):
        row = {k: c.get(k) for k in _FRAME_COLUMNS if k != "evidence_codes"}
        row["evidence_codes"] = ", ".join(f"{f['code']}({f['severity'][0]})" for f in c["parent_findings"])
        rows.append(row)
    schema = {"version": pl.Utf8, "parent": pl.Utf8, "factor": pl.Utf8, "change": pl.Utf8, "author": pl.Utf8,
              "evidence_codes": pl.Utf8, "backtest_verdict": pl.Utf8, "parent_avg_at_k": pl.Float64,
              "avg_at_k": pl.Float64, "outcome": pl.Utf8, "decided_by": pl.Utf8, "mean_delta": pl.Float64,
              "ci_low": pl.Float64, "ci_high": pl.Float64, "p_wilcoxon": pl.Float64, "n_items": pl.Int64,
              "hypothesis": pl.Utf8, "rationale": pl.Utf8}
    return pl.DataFrame(rows, schema=schema).select(_FRAME_COLUMNS)


# --------------------------------------------------------------------------- compact text for an agent


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _version_line(v: dict) -> str:
    who = f" by {v['decided_by']}" if v["decided_by"] and v["decided_by"] != "gate" else ""
    change = f" {v['intervention_id']}: {v['change']}" if v["intervention_id"] else " (base harness)"
    role = " [probe]" if v["role"] == "probe" else ""
    return (f"{v['version']}{role} <- {v['parent'] or '-'} Avg@k {_f(v['avg_at_k'])} "
            f"{v['outcome'] or v['state']}{who};{change}")


def _case_line(c: dict) -> str:
    ev = ", ".join(f"{f['code']}({f['severity']})" for f in c["parent_findings"][:6]) or "no alerts"
    stats = (f" Δ{c['mean_delta']:+.3f} CI [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] p={_f(c['p_wilcoxon'], '.3g')}"
             if c["mean_delta"] is not None else "")
    who = f" (decided by {c['decided_by']}: {c['decision_reason']})" if c["decided_by"] not in (None, "gate") else ""
    tried = "; also proposed: " + ", ".join(f"{a['change']} [{a['backtest_verdict'] or '-'}]"
                                           for a in c["alternatives"][:3]) if c["alternatives"] else ""
    return (f"{c['version']} from {c['parent']}: evidence {ev} -> {c['change']} by {c['author']} "
            f"({c['hypothesis'][:200]}) -> backtest {c['backtest_verdict'] or '-'} -> "
            f"{c['outcome'] or 'not judged'}{stats}{who}{tried}"
            + (f"; rationale: {c['rationale'][:200]}" if c["rationale"] else ""))


def _note_line(n: dict) -> str:
    return f"[{n.get('time', '?')[:19]}] {n.get('author', '?')}{' @' + n['version'] if n.get('version') else ''}: " \
           f"{n.get('text', '')[:400]}"


def _trace_line(t: dict) -> str:
    found = t.get("found")
    if isinstance(found, list):
        found = ", ".join(str(x.get("skill_id", x) if isinstance(x, dict) else x) for x in found[:5]) or "nothing"
    q = json.dumps(t.get("query"), sort_keys=True, default=str)[:200]
    return (f"[{t.get('time', '?')[:19]}] {t.get('author', '?')} {t.get('tool', '?')} in {t.get('where', '?')} "
            f"{q}" + (f" -> {str(found)[:200]}" if found is not None else ""))


def _fit(lines: list[str], budget: int, newest_first: bool = True) -> tuple[list[str], int]:
    """As many lines as fit in budget (newest kept when cut), in chronological order; and how many were left out."""
    picked, used = [], 0
    order = list(reversed(lines)) if newest_first else list(lines)
    for line in order:
        if used + len(line) + 1 > budget:
            break
        picked.append(line)
        used += len(line) + 1
    if newest_first:
        picked.reverse()
    return picked, len(lines) - len(picked)


def compact(store: Store, max_chars: int = 6000) -> str:
    """The campaign's memory as text of at most max_chars: header, versions, cases, notes, search trace.

    When it does not fit, the oldest versions, cases, notes and look-ups are left out first (and counted)."""
    state = _loop(store)
    spec = store.campaign
    summary = ledger_summary(store)
    best = state.best()
    head = [(f"campaign {spec.name}: domain {spec.data.domain}, policy {spec.policy}, agent {spec.agent}; "
             f"best so far {best or '-'}; {state.consecutive_failures()} version(s) in a row not promoted")]
    sections = [
        ("versions (ledger, oldest first)", [_version_line(v) for v in summary], 0.35),
        ("cases (parent evidence -> change -> backtest -> decision)", [_case_line(c) for c in cases(store)], 0.6),
        ("notes", [_note_line(n) for n in notes(store)], 0.6),
        ("search trace", [_trace_line(t) for t in search_trace(store)], 1.0),
    ]
    out = list(head)
    remaining = max_chars - sum(len(x) + 1 for x in head)
    for title, lines, share in sections:
        if not lines:
            continue
        budget = int(max(0, remaining) * share) - len(title) - 4
        picked, left = _fit(lines, budget)
        if not picked:
            block = [f"{title}: {len(lines)} entries left out (no room)"]
        else:
            block = [f"{title}:" + (f" ({left} older left out)" if left else "")] + [f"  {x}" for x in picked]
        out += block
        remaining -= sum(len(x) + 1 for x in block)
    text = "\n".join(out)
    if len(text) > max_chars:
        text = text[: max(0, max_chars - 14)] + "\n[memory cut]"
    return text
