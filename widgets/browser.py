"""RolloutBrowser: filter and page over millions of rollouts (lazy scan + slice), open a group with
all its samples side by side, step through a rollout's turns, and follow one item across versions."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import polars as pl
import traitlets as t

from evotrainer import evidence

from ._base import EvoWidget, clean, esm

TABLE_COLUMNS = ["rollout_uid", "version", "split", "step", "item_id", "group_id", "sample_idx", "reward", "correct",
                 "advantage", "filtered", "filter_reason", "truncated", "n_completion_tokens", "mean_logprob"]
GROUP_COLUMNS = ["rollout_uid", "sample_idx", "completion", "reward", "correct", "advantage", "filtered",
                 "filter_reason", "mean_logprob", "truncated", "stop_reason", "n_completion_tokens", "verifier"]
PREVIEW = 120
FILTER_KEYS = ("versions", "split", "step_min", "step_max", "reward_min", "reward_max", "correct", "finding_id",
               "text", "item_id", "uids")
DEFAULT_FILTERS: dict[str, Any] = {"versions": [], "split": None, "step_min": None, "step_max": None,
                                   "reward_min": None, "reward_max": None, "correct": "any", "finding_id": None,
                                   "text": "", "item_id": None, "uids": None}
VIEWS = ("table", "group", "turns", "item")
ITEM_ROLLOUT_CAP = 64


def _parse_uid(uid: str) -> tuple[str, str, int] | None:
    """(version, split, step) from `campaign/version/split/step/group/sample`, for file pruning."""
    parts = uid.split("/")
    if len(parts) < 6:
        return None
    try:
        return parts[-5], parts[-4], int(parts[-3])
    except ValueError:
        return None


def _parse_group(gid: str) -> tuple[str, str, int] | None:
    parts = gid.split("/")
    if len(parts) != 4:
        return None
    try:
        return parts[0], parts[1], int(parts[2])
    except ValueError:
        return None


class RolloutBrowser(EvoWidget):
    """Root element: `.evo-rollout-browser` (group view: `.evo-group-view`, turns: `.evo-turns-view`,
    item history: `.evo-item-view`).

    Synced traits: `filters`, `options` (versions, splits, findings), `page`, `page_size`, `total`,
    `n_pages`, `rows`, `columns`, `cursor`, `view`, `group`, `rollout`, `turns`, `turn_index`,
    `item_history`, `message`. Intents (data-action): set_filters, clear_filters, next_page,
    prev_page, select_group, select_rollout, follow_item, move, open_selected, back, turn, set_view.
    """

    _esm = esm("browser.js")
    _ACTIONS: ClassVar[dict[str, str]] = {"set_filters": "set_filters", "clear_filters": "clear_filters", "next_page": "next_page",
                "prev_page": "prev_page", "go_page": "go_page", "select_group": "select_group",
                "select_rollout": "select_rollout", "follow_item": "follow_item", "move": "move",
                "open_selected": "open_selected", "back": "back", "turn": "step_turn", "set_view": "set_view",
                "select_row": "select_row"}

    filters = t.Dict().tag(sync=True)
    options = t.Dict().tag(sync=True)
    page = t.Int(0).tag(sync=True)
    page_size = t.Int(20).tag(sync=True)
    total = t.Int(0).tag(sync=True)
    n_pages = t.Int(0).tag(sync=True)
    columns = t.List().tag(sync=True)
    rows = t.List().tag(sync=True)
    cursor = t.Int(0).tag(sync=True)
    view = t.Unicode("table").tag(sync=True)
    group = t.Dict().tag(sync=True)
    rollout = t.Dict().tag(sync=True)
    turns = t.List().tag(sync=True)
    turn_index = t.Int(0).tag(sync=True)
    item_history = t.Dict().tag(sync=True)

    def __init__(self, lab, page_size: int = 20, **kwargs):
        super().__init__(lab, page_size=max(1, int(page_size)), **kwargs)
        self.filters = dict(DEFAULT_FILTERS)
        self.columns = TABLE_COLUMNS + ["prompt_tail", "completion_head"]
        self.refresh_options()
        self._load_page()

    # ---- read-only views of what is shown

    @property
    def group_rows(self) -> list[dict]:
        return list(self.group.get("samples", [])) if self.group else []

    # ---- options

    def refresh_options(self) -> None:
        store = self.lab.store
        findings = []
        for v in store.versions():
            rep = store.read_health_report(v)
            if rep is None:
                continue
            for f in rep.findings:
                if f.rollout_uids:
                    findings.append({"finding_id": f.finding_id, "version": v, "code": f.code, "severity": f.severity,
                                     "message": f.message, "n": len(f.rollout_uids)})
        lf = store.rollouts()
        names = lf.collect_schema().names()
        self.options = clean({"versions": store.versions(), "splits": list(evidence.SPLITS), "findings": findings,
                              "reward_columns": evidence.reward_columns(names)})

    # ---- filtering and paging

    def _finding_uids(self, finding_id: str) -> list[str]:
        store = self.lab.store
        for v in store.versions():
            rep = store.read_health_report(v)
            if rep is None:
                continue
            for f in rep.findings:
                if f.finding_id == finding_id:
                    return list(f.rollout_uids)
        raise ValueError(f"no health report holds finding {finding_id}")

    def filtered(self) -> pl.LazyFrame:
        """The lazy frame the current filters select (file pruning by version, split and step)."""
        f = self.filters
        versions = f.get("versions") or None
        split = f.get("split") or None
        lo, hi = f.get("step_min"), f.get("step_max")
        uids = list(f["uids"]) if f.get("uids") is not None else None
        if f.get("finding_id"):
            found = self._finding_uids(f["finding_id"])
            uids = found if uids is None else [u for u in uids if u in set(found)]
        if uids is not None and not versions:
            parsed = {p[0] for u in uids if (p := _parse_uid(u))}
            known = set(self.lab.store.versions())
            if parsed and parsed <= known:
                versions = sorted(parsed)
        if versions:
            bad = [v for v in versions if v not in set(self.lab.store.versions())]
            if bad:
                raise ValueError(f"unknown version(s) {bad}; the campaign has {self.lab.store.versions()}")
        steps = (lo, hi) if (lo is not None or hi is not None) else None
        lf = self.lab.store.rollouts(versions, split, steps)
        preds = []
        if lo is not None:
            preds.append(pl.col("step") >= int(lo))
        if hi is not None:
            preds.append(pl.col("step") <= int(hi))
        if f.get("reward_min") is not None:
            preds.append(pl.col("reward") >= float(f["reward_min"]))
        if f.get("reward_max") is not None:
            preds.append(pl.col("reward") <= float(f["reward_max"]))
        correct = f.get("correct", "any")
        if correct in (True, "yes"):
            preds.append(pl.col("correct") == True)
        elif correct in (False, "no"):
            preds.append(pl.col("correct") == False)
        if f.get("item_id"):
            preds.append(pl.col("item_id") == f["item_id"])
        if uids is not None:
            preds.append(pl.col("rollout_uid").is_in(uids))
        text = f.get("text") or ""
        if text:
            preds.append(pl.col("prompt").str.contains(text, literal=True).fill_null(False)
                         | pl.col("completion").str.contains(text, literal=True).fill_null(False))
        for p in preds:
            lf = lf.filter(p)
        return lf

    def set_filters(self, **kw) -> None:
        """Change filters (None clears one): versions (or version), split, step_min, step_max,
        reward_min, reward_max, correct ('any'|'yes'|'no'|True|False), finding_id, text, item_id, uids."""
        if "version" in kw:
            v = kw.pop("version")
            kw["versions"] = [] if v in (None, "") else ([v] if isinstance(v, str) else list(v))
        unknown = set(kw) - set(FILTER_KEYS)
        if unknown:
            raise ValueError(f"unknown filter(s) {sorted(unknown)}; known: {', '.join(FILTER_KEYS)}")
        new = dict(self.filters)
        for k, v in kw.items():
            if v == "" and k not in ("text",):
                v = None
            if k == "versions":
                v = [v] if isinstance(v, str) else list(v or [])
            elif k in ("step_min", "step_max") and v is not None:
                v = int(v)
            elif k in ("reward_min", "reward_max") and v is not None:
                v = float(v)
            elif k == "correct":
                v = {True: "yes", False: "no", None: "any"}.get(v, v)
                if v not in ("any", "yes", "no"):
                    raise ValueError("correct must be 'any', 'yes' or 'no'")
            elif k == "uids" and v is not None:
                v = list(v)
            elif k == "text":
                v = v or ""
            new[k] = v if v is not None or k not in DEFAULT_FILTERS else DEFAULT_FILTERS[k]
        old = self.filters
        self.filters = new
        try:
            self.page = 0
            self.cursor = 0
            self._load_page()
        except Exception:
            self.filters = old
            self._load_page()
            raise
        if self.view != "table":
            self.view = "table"

    def clear_filters(self) -> None:
        self.filters = dict(DEFAULT_FILTERS)
        self.page = 0
        self.cursor = 0
        self._load_page()
        self.view = "table"

    def _load_page(self) -> None:
        lf = self.filtered()
        total = int(lf.select(pl.len()).collect().item())
        self.total = total
        self.n_pages = (total + self.page_size - 1) // self.page_size
        self.page = max(0, min(self.page, max(0, self.n_pages - 1)))
        have = set(lf.collect_schema().names())
        cols = [c for c in TABLE_COLUMNS if c in have]
        df = (lf.slice(self.page * self.page_size, self.page_size)
              .select([*cols,
                       pl.col("prompt").str.slice(-PREVIEW).alias("prompt_tail") if "prompt" in have else pl.lit(None).alias("prompt_tail"),
                       pl.col("completion").str.slice(0, PREVIEW).alias("completion_head") if "completion" in have else pl.lit(None).alias("completion_head")])
              .collect())
        self.rows = clean(df.to_dicts())
        self.cursor = max(0, min(self.cursor, len(self.rows) - 1))
        f = self.filters
        desc = f"{total:,} rollouts" + (f" · page {self.page + 1} of {self.n_pages}" if self.n_pages else "")
        if f.get("finding_id"):
            desc += f" · finding {f['finding_id']}"
        self._say(desc, "info")

    def next_page(self) -> None:
        if self.page + 1 < self.n_pages:
            self.page += 1
            self.cursor = 0
            self._load_page()

    def prev_page(self) -> None:
        if self.page > 0:
            self.page -= 1
            self.cursor = 0
            self._load_page()

    def go_page(self, page: int) -> None:
        self.page = max(0, min(int(page), max(0, self.n_pages - 1)))
        self.cursor = 0
        self._load_page()

    def select_row(self, index: int) -> None:
        self.cursor = max(0, min(int(index), len(self.rows) - 1))

    # ---- group view

    def select_group(self, group_id: str) -> dict:
        """Show every sample of one group side by side (completion, reward, each r.<component>,
        advantage, filtered + reason, mean_logprob, truncated), as stored."""
        where = _parse_group(group_id)
        lf = self.lab.store.rollouts(*([where[0], where[1], (where[2], where[2])] if where else []))
        df = lf.filter(pl.col("group_id") == group_id).sort("sample_idx").collect()
        if df.height == 0:
            raise ValueError(f"no rollouts in group {group_id}")
        comps = [c for c in evidence.reward_columns(df.columns) if df[c].null_count() < df.height]
        first = df.row(0, named=True)
        samples = df.select([c for c in GROUP_COLUMNS if c in df.columns] + comps).to_dicts()
        for smp in samples:  # display text made here, so the view shows exactly Python's numbers
            adv = smp.get("advantage")
            smp["advantage_text"] = f"{adv:+.3f}" if isinstance(adv, float) and not math.isnan(adv) else "–"
        rewards = df["reward"].drop_nulls().drop_nans() if df["reward"].dtype.is_float() else df["reward"].drop_nulls()
        std = float(rewards.std(ddof=0)) if rewards.len() > 1 else None
        self.group = clean({
            "group_id": group_id, "version": first["version"], "split": first["split"], "step": first["step"],
            "item_id": first["item_id"], "prompt": first["prompt"], "components": comps, "samples": samples,
            "n": df.height, "reward_mean": float(rewards.mean()) if rewards.len() else None, "reward_std": std,
            "dead": (std is not None and std < 1e-3), "n_correct": int(df["correct"].fill_null(False).sum()),
            "n_filtered": int(df["filtered"].fill_null(False).sum()),
        })
        self.view = "group"
        return self.group

    # ---- turn-by-turn view

    def select_rollout(self, uid: str) -> list[dict]:
        """Step through one rollout turn by turn (store.turns); single-turn rollouts show the
        prompt and the completion as two turns."""
        where = _parse_uid(uid)
        args = [where[0], where[1], (where[2], where[2])] if where else []
        row = self.lab.store.rollouts(*args).filter(pl.col("rollout_uid") == uid).collect()
        if row.height == 0:
            raise ValueError(f"no rollout {uid}")
        r = row.row(0, named=True)
        turns = self.lab.store.turns(*args).filter(pl.col("rollout_uid") == uid).sort("turn_idx").collect()
        if turns.height:
            tl = turns.to_dicts()
        else:
            tl = [{"turn_idx": 0, "role": "prompt", "text": r["prompt"], "tool_name": None, "tool_args": None,
                   "tool_output": None, "tool_ok": None, "n_tokens": r.get("n_prompt_tokens"), "mean_logprob": None},
                  {"turn_idx": 1, "role": "completion", "text": r["completion"], "tool_name": None, "tool_args": None,
                   "tool_output": None, "tool_ok": None, "n_tokens": r.get("n_completion_tokens"),
                   "mean_logprob": r.get("mean_logprob")}]
        self.rollout = clean({k: v for k, v in r.items() if k not in ("prompt", "completion")})
        self.turns = clean(tl)
        self.turn_index = 0
        self.view = "turns"
        return self.turns

    def step_turn(self, delta: int = 1) -> None:
        if self.turns:
            self.turn_index = max(0, min(self.turn_index + int(delta), len(self.turns) - 1))

    # ---- one item across versions

    def follow_item(self, item_id: str) -> dict:
        """All rollouts of `item_id`, grouped by version, with each version's share correct."""
        cols = ["rollout_uid", "version", "split", "step", "item_id", "group_id", "sample_idx", "reward", "correct", "completion"]
        df = (self.lab.store.rollouts(columns=cols).filter(pl.col("item_id") == item_id)
              .sort(["version", "split", "step", "sample_idx"]).collect())
        per = []
        for (version,), part in df.group_by(["version"], maintain_order=True):
            per.append({
                "version": version, "n": part.height,
                "n_train": int((part["split"] == "train").sum()), "n_val": int((part["split"] == "val").sum()),
                "share_correct": float(part["correct"].cast(pl.Float64).mean()) if part["correct"].null_count() < part.height else None,
                "reward_mean": float(part["reward"].mean()) if part["reward"].null_count() < part.height else None,
                "rollouts": part.head(ITEM_ROLLOUT_CAP).with_columns(pl.col("completion").str.slice(0, PREVIEW))
                .to_dicts(),
                "truncated_list": part.height > ITEM_ROLLOUT_CAP,
            })
        self.item_history = clean({"item_id": item_id, "n": df.height, "versions": per})
        self.view = "item"
        return self.item_history

    # ---- keyboard intents

    def move(self, delta: int = 1) -> None:
        """j/k or arrows: next/previous row (table) or group (group view) or turn (turns view)."""
        delta = int(delta)
        if self.view == "turns":
            self.step_turn(delta)
            return
        if self.view == "group":
            gids = list(dict.fromkeys(r["group_id"] for r in self.rows))
            cur = self.group.get("group_id")
            if cur not in gids:
                return
            i = gids.index(cur) + delta
            if 0 <= i < len(gids):
                self.select_group(gids[i])
            elif i >= len(gids) and self.page + 1 < self.n_pages:
                self.next_page()
                self.select_group(self.rows[0]["group_id"])
            elif i < 0 and self.page > 0:
                self.prev_page()
                self.select_group(self.rows[-1]["group_id"])
            return
        if self.view != "table" or not self.rows:
            return
        i = self.cursor + delta
        if i >= len(self.rows):
            if self.page + 1 < self.n_pages:
                self.next_page()
        elif i < 0:
            if self.page > 0:
                self.prev_page()
                self.cursor = len(self.rows) - 1
        else:
            self.cursor = i

    def open_selected(self) -> None:
        """Enter: open the selected row's group."""
        if self.view == "table" and self.rows:
            self.select_group(self.rows[self.cursor]["group_id"])

    def back(self) -> None:
        self.view = "table"

    def set_view(self, view: str) -> None:
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}")
        self.view = view
