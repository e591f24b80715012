"""One SWE episode: a materialized buggy repo, the agent's tools, turn recording and hidden-test scoring.

    ep = SweEpisode(inst, instance_dir, workdir, clear_git_log=False, turn_cap=30, token_budget=16000)
    ep.run_tests(); ep.read_file("pkg/mod.py"); ep.search_replace("pkg/mod.py", old, new); ep.submit()
    verifier, reward = ep.score(); ep.turn_rows(); ep.summary()

Tools (methods, each returns ToolResult(ok, output) with output capped at OUTPUT_CAP chars and records
one turn in the TURN_COLUMNS shape): list_dir, read_file, grep, search_replace (exact, unique match,
else ok=False: the "edit failure" the paper tracks), run_tests (the visible test command in the sandbox),
run_in_terminal (a shell-less command line: argv[0] in TERMINAL_PROGRAMS, run in the sandbox; `git log
-p` works there, so the history leak is real unless clear_git_log=True), submit.
An LLM policy's text reaches these through toolcalls.py (one message -> one call; `record_call_message` and
`record_invalid_call` record the message and a malformed call as a failed tool turn).

The episode ends on submit, at `turn_cap` turns, or when the turns' tokens (~len/4) reach
`token_budget`; later calls return ok=False and record nothing.

Scoring (`score()`) never trusts the working copy's tests: a fresh copy of the template is
materialized, the agent's NON-test files are overlaid onto it (test files, conftest.py and pytest
config are the template's), and the hidden fail_to_pass + pass_to_pass node ids run there.

Reward tiers (reward_tiers=(fail, partial, full), default (0.0, 0.1, 1.0), the paper's CR tiers):
full when every F2P and every P2P test passes; partial when some F2P test passes, or when the hidden
tests ran (no collection error / timeout) on a repo whose source the agent changed; fail otherwise.
Departure from "partial = the tests ran": an untouched repo also "runs the tests", and rewarding a
do-nothing submission as much as an honest failed attempt pays for abandonment; set
`partial_needs_change=False` to get the literal rule.

Rollout-level behaviour summary (`summary()`), extra columns of the rollouts table (ROLLOUT_BEHAVIOUR_COLUMNS):
  n_turns, n_tool_calls          turns recorded / tool calls among them
  n_edits, n_edit_failures       successful / failed search_replace calls
  n_test_runs                    run_tests calls plus terminal commands running pytest
  n_terminal_calls, n_search_calls  run_in_terminal calls; list_dir/read_file/grep calls
  self_tested                    a test run happened after the last successful edit (False without edits)
  search_before_edit             a list_dir/read_file/grep happened before the first edit attempt (False without edits)
  used_git_history               some run_in_terminal command ran `git log` or `git show`
  max_same_tool_streak           longest run of consecutive calls of one tool
  first_edit_turn                turn_idx of the first search_replace call (null without one)
  edited_files                   JSON list of repo paths changed by successful edits (sorted)
  edit_coverage                  |edited_files ∩ gold files| / |gold files|, gold files = {instance.mutated_file}:
                                 the share of the files the fix needs that the rollout's successful edits
                                 touched; 0.0 without a successful edit, null when the instance names no
                                 mutated_file (the edit_coverage diagnostic averages it over the rollouts with
                                 n_edits > 0, so abandonment and edit-format failures are not counted twice)
  stop_reason                    submitted | turn_cap | token_budget | no_submit
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import reprlib
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

OUTPUT_CAP = 4096
TEST_TIMEOUT_S = 60.0
TERMINAL_TIMEOUT_S = 20.0
TERMINAL_PROGRAMS = ("git", "python", "python3", "ls", "cat", "head", "tail", "grep", "find", "wc", "diff",
                     "echo", "pwd", "sed")
_PYTHONS = ("python", "python3")
_GIT_HISTORY_RE = re.compile(r"\bgit\s+(?:-\S+\s+)*(log|show)\b")
_SEARCH_TOOLS = ("list_dir", "read_file", "grep")
_TEST_CONFIGS = {"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "conftest.py"}
_TEST_DIRS = {"tests", "test", "testing"}
TOOL_NAMES = ("list_dir", "read_file", "grep", "search_replace", "run_tests", "run_in_terminal", "submit")
INVALID_TOOL = "invalid"  # tool_name of a failed call that names no tool, or misuses a known one (toolcalls.py)

ROLLOUT_BEHAVIOUR_COLUMNS: dict[str, pl.DataType] = {
    "n_edits": pl.Int32(), "n_edit_failures": pl.Int32(), "n_test_runs": pl.Int32(),
    "n_terminal_calls": pl.Int32(), "n_search_calls": pl.Int32(), "self_tested": pl.Boolean(),
    "search_before_edit": pl.Boolean(), "used_git_history": pl.Boolean(), "max_same_tool_streak": pl.Int32(),
    "first_edit_turn": pl.Int32(), "edited_files": pl.String(), "edit_coverage": pl.Float64(),
    "stop_reason": pl.String(),
}  # plus the contract's n_turns / n_tool_calls


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    output: str


Materializer = Callable[..., Path]


def cap(text: str, limit: int = OUTPUT_CAP) -> str:
    """Head and tail of `text` within `limit` chars (a test run's summary is at the end)."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} chars cut ...]\n"
    keep = max(0, limit - len(marker))
    return text[: keep // 2] + marker + text[len(text) - (keep - keep // 2):]


def is_test_path(rel: str) -> bool:
    """Files the agent may not change for scoring: tests, conftest.py, pytest configuration."""
    parts = Path(rel).parts
    name = parts[-1] if parts else rel
    return (name in _TEST_CONFIGS or (name.startswith("test_") and name.endswith(".py"))
            or name.endswith("_test.py") or any(p in _TEST_DIRS for p in parts[:-1]))


def _files(root: Path) -> dict[str, Path]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__", ".pytest_cache")]
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p
    return out


def _python_argv(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if argv and argv[0] in _PYTHONS:
        argv[0] = sys.executable  # `python` on PATH may be a shell shim the sandbox cannot exec
    return argv


def _pytest_argv(test_command: Sequence[str], node_ids: Sequence[str], repo: Path) -> list[str]:
    """The instance's test command (+ node ids: then its own path arguments, those naming a file or folder of
    the repo after the `pytest` token, are dropped so that only the node ids run)."""
    base = _python_argv(test_command) if test_command else [sys.executable, "-m", "pytest"]
    if node_ids:
        at = next((i for i, a in enumerate(base) if Path(a).name in ("pytest", "py.test")), None)
        if at is not None:
            base = base[: at + 1] + [a for a in base[at + 1:] if a.startswith("-") or not (repo / a).exists()]
    return [*base, "-p", "no:cacheprovider", "-rA", *node_ids]


_RESULT_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+)$", re.MULTILINE)


def parse_pytest(output: str, node_ids: Sequence[str] = ()) -> dict[str, str]:
    """node id -> outcome from pytest's -rA short summary (the last outcome wins; ERROR beats PASSED).

    A summary line is "OUTCOME <node id>" or "OUTCOME <node id> - <message>", and parametrized ids
    may hold spaces (`test_x[Action Web Service]`) or " - " themselves, so the id is found by
    matching the line against the expected `node_ids`; without them, the text before the first
    " - " is the id."""
    known = set(node_ids)
    out: dict[str, str] = {}
    for outcome, rest in _RESULT_RE.findall(output):
        rest = rest.rstrip()
        nid = None
        if known:
            if rest in known:
                nid = rest
            else:
                cut = rest.find(" - ")
                while cut != -1 and nid is None:
                    if rest[:cut] in known:
                        nid = rest[:cut]
                    cut = rest.find(" - ", cut + 1)
        if nid is None:
            nid = rest.split(" - ", 1)[0]
        if out.get(nid) in ("ERROR", "FAILED"):
            continue
        out[nid] = outcome
    return out


class SweEpisode:
    def __init__(self, instance: Any, instance_dir: Path, workdir: Path, *, clear_git_log: bool = False,
                 turn_cap: int = 30, token_budget: int = 16000,
                 reward_tiers: tuple[float, float, float] = (0.0, 0.1, 1.0), partial_needs_change: bool = True,
                 rollout_uid: str = "", materializer: Materializer | None = None,
                 test_timeout_s: float = TEST_TIMEOUT_S, terminal_timeout_s: float = TERMINAL_TIMEOUT_S):
        if materializer is None:
            from .instance import materialize as materializer
        self.instance = instance
        self.instance_dir = Path(instance_dir)
        self.clear_git_log = clear_git_log
        self.turn_cap = int(turn_cap)
        self.token_budget = int(token_budget)
        self.reward_tiers = tuple(float(x) for x in reward_tiers)
        self.partial_needs_change = partial_needs_change
        self.rollout_uid = rollout_uid
        self.test_timeout_s = test_timeout_s
        self.terminal_timeout_s = terminal_timeout_s
        self._materialize = materializer
        self.repo = Path(materializer(self.instance_dir, Path(workdir), clear_git_log=clear_git_log)).resolve()
        self.turns: list[dict] = []
        self.tokens = 0
        self.done = False
        self.stop_reason: str | None = None
        self._edited: set[str] = set()
        self._verifier: dict | None = None

    # ------------------------------------------------------------------ recording

    def _record(self, role: str, tool_name: str | None, args: dict | None, output: str | None, ok: bool | None,
                text: str | None = None) -> None:
        args_json = None if args is None else json.dumps(args, sort_keys=True, ensure_ascii=False)
        n_tokens = math.ceil((len(text or "") + len(args_json or "") + len(output or "")) / 4)
        self.turns.append({"rollout_uid": self.rollout_uid, "turn_idx": len(self.turns), "role": role,
                           "text": text, "tool_name": tool_name, "tool_args": args_json, "tool_output": output,
                           "tool_ok": ok, "n_tokens": n_tokens, "mean_logprob": None})
        self.tokens += n_tokens
        if self.stop_reason is None:
            if len(self.turns) >= self.turn_cap:
                self.done, self.stop_reason = True, "turn_cap"
            elif self.tokens >= self.token_budget:
                self.done, self.stop_reason = True, "token_budget"

    def _tool(self, name: str, args: dict, fn: Callable[[], ToolResult]) -> ToolResult:
        if self.done:
            return ToolResult(False, f"the episode is over ({self.stop_reason}); no more tool calls")
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - a tool error is the agent's observation, not a crash
            res = ToolResult(False, f"{name} failed: {type(exc).__name__}: {exc}")
        res = ToolResult(res.ok, cap(res.output))
        self._record("tool", name, args, res.output, res.ok)
        return res

    def say(self, text: str) -> None:
        """Record an assistant message (no tool): counts toward the turn cap and the token budget."""
        if not self.done:
            self._record("assistant", None, None, None, None, text=text)

    def record_call_message(self, text: str) -> None:
        """Record the assistant message that carries a tool call (the text protocol, envs/swe/toolcalls.py).

        Like `say`, but the turn-cap / token-budget check waits for the tool turn that must follow (a
        tool method or `record_invalid_call`): the call a message carries always runs and is recorded,
        so the message and its tool turn stay a pair (an odd turn_cap can end one row past the cap)."""
        if self.done:
            return
        self._record("assistant", None, None, None, None, text=text)
        if self.stop_reason in ("turn_cap", "token_budget"):
            self.done, self.stop_reason = False, None  # re-checked when the tool turn is recorded

    def record_invalid_call(self, name: str, raw_args: Any, error: str) -> ToolResult:
        """Record a tool call that could not run (no call, unreadable JSON, unknown tool, missing or bad
        arguments) as a failed tool turn: tool_name=`name` (INVALID_TOOL when empty), tool_args=JSON of
        `raw_args` as the model gave them (null when None), tool_output=`error`, tool_ok=False. Same turn
        accounting as the tools (turn cap, token budget, nothing recorded once the episode is over).

        `name` may not be one of TOOL_NAMES: a turn under a tool's name is a call that ran that tool (the
        summary's edit / test / search / terminal counters rely on it); misuse of a known tool is
        recorded as INVALID_TOOL, with the tool named in `error`."""
        name = str(name or INVALID_TOOL)
        if name in TOOL_NAMES:
            raise ValueError(f"record_invalid_call: {name!r} is a tool; record its misuse as {INVALID_TOOL!r}")
        try:
            json.dumps(raw_args, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            raw_args = reprlib.repr(raw_args)  # depth- and size-limited
        return self._tool(name, raw_args, lambda: ToolResult(False, error))

    def _path(self, rel: str) -> Path:
        p = (self.repo / rel).resolve()
        if p != self.repo and self.repo not in p.parents:
            raise ValueError(f"path {rel!r} is outside the repository")
        return p

    # ------------------------------------------------------------------ tools

    def list_dir(self, path: str = ".") -> ToolResult:
        def go() -> ToolResult:
            p = self._path(path)
            if not p.is_dir():
                return ToolResult(False, f"{path}: not a directory")
            names = sorted(x.name + ("/" if x.is_dir() else "") for x in p.iterdir() if x.name != "__pycache__")
            return ToolResult(True, "\n".join(names))
        return self._tool("list_dir", {"path": path}, go)

    def read_file(self, path: str, start: int | None = None, end: int | None = None) -> ToolResult:
        def go() -> ToolResult:
            p = self._path(path)
            if not p.is_file():
                return ToolResult(False, f"{path}: no such file")
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
            lo = max(1, start or 1)
            hi = min(len(lines), end or len(lines))
            return ToolResult(True, "\n".join(f"{i:5d} {lines[i - 1]}" for i in range(lo, hi + 1)))
        return self._tool("read_file", {"path": path, "start": start, "end": end}, go)

    def grep(self, pattern: str, path: str = ".") -> ToolResult:
        def go() -> ToolResult:
            try:
                rx = re.compile(pattern)
            except re.error as exc:
                return ToolResult(False, f"bad regular expression {pattern!r}: {exc}")
            root = self._path(path)
            files = {path: root} if root.is_file() else {str(Path(path) / k): v for k, v in _files(root).items()}
            hits = []
            for rel, f in sorted(files.items()):
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                        if rx.search(line):
                            hits.append(f"{os.path.normpath(rel)}:{i}:{line}")
            return ToolResult(True, "\n".join(hits) if hits else "(no matches)")
        return self._tool("grep", {"pattern": pattern, "path": path}, go)

    def search_replace(self, path: str, old: str, new: str) -> ToolResult:
        def go() -> ToolResult:
            p = self._path(path)
            if not p.is_file():
                return ToolResult(False, f"edit failed: {path}: no such file")
            text = p.read_text(encoding="utf-8")
            n = text.count(old) if old else 0
            if n == 0:
                return ToolResult(False, f"edit failed: the search text was not found in {path} (it must match "
                                         "exactly, whitespace included)")
            if n > 1:
                return ToolResult(False, f"edit failed: the search text occurs {n} times in {path}; include more "
                                         "context so that it matches exactly once")
            p.write_text(text.replace(old, new, 1), encoding="utf-8")
            self._edited.add(str(p.relative_to(self.repo)))
            return ToolResult(True, f"edited {path}: replaced {old.count(chr(10)) + 1} line(s)")
        return self._tool("search_replace", {"path": path, "old": old, "new": new}, go)

    def run_tests(self, node_ids: Sequence[str] | None = None) -> ToolResult:
        def go() -> ToolResult:
            from ..sandbox import run_command

            argv = _pytest_argv(getattr(self.instance, "test_command", ()) or (), list(node_ids or ()), self.repo)
            r = run_command(argv, workdir=self.repo, timeout_s=self.test_timeout_s)
            head = f"[tests: {r.status}, exit {r.returncode}]\n"
            return ToolResult(r.status == "pass", head + r.stdout + r.stderr)
        return self._tool("run_tests", {"node_ids": list(node_ids) if node_ids else None}, go)

    def run_in_terminal(self, command: str) -> ToolResult:
        def go() -> ToolResult:
            from ..sandbox import run_command

            try:
                argv = shlex.split(command)
            except ValueError as exc:
                return ToolResult(False, f"cannot parse the command: {exc}")
            if not argv:
                return ToolResult(False, "empty command")
            if any(tok in ("|", "||", "&&", ";", ">", ">>", "<", "&") for tok in argv):
                return ToolResult(False, "no shell here: pipes, redirects and command lists are not supported; "
                                         "run one program at a time")
            if argv[0] not in TERMINAL_PROGRAMS:
                return ToolResult(False, f"{argv[0]!r} is not available; programs: {', '.join(TERMINAL_PROGRAMS)}")
            read = ["/etc/gitconfig"] if argv[0] == "git" and os.path.exists("/etc/gitconfig") else []
            r = run_command(_python_argv(argv), workdir=self.repo, timeout_s=self.terminal_timeout_s,
                            read_paths=read)
            out = r.stdout + (("\n" if r.stdout and r.stderr else "") + r.stderr if r.stderr else "")
            if r.status not in ("pass", "fail"):
                out += f"\n[{r.status}]"
            return ToolResult(r.status == "pass", out)
        return self._tool("run_in_terminal", {"command": command}, go)

    def submit(self) -> ToolResult:
        res = self._tool("submit", {}, lambda: ToolResult(True, "submitted"))
        if res.ok:
            self.done, self.stop_reason = True, "submitted"
        return res

    # ------------------------------------------------------------------ scoring

    def changed_files(self) -> list[str]:
        """Non-test files whose content differs from the template (what scoring will use)."""
        with tempfile.TemporaryDirectory(prefix="evotrainer-swe-pristine-") as tmp:
            pristine = Path(self._materialize(self.instance_dir, Path(tmp) / "repo", clear_git_log=True))
            a, b = _files(pristine), _files(self.repo)
            return sorted(k for k in set(a) | set(b) if not is_test_path(k)
                          and (k not in a or k not in b or a[k].read_bytes() != b[k].read_bytes()))

    def score(self) -> tuple[dict, float]:
        """(verifier dict, reward) from the hidden tests on the template's tests + the agent's source."""
        if self._verifier is not None:
            return self._verifier, self._verifier["reward"]
        from ..sandbox import run_command

        inst = self.instance
        f2p, p2p = list(inst.fail_to_pass), list(inst.pass_to_pass)
        with tempfile.TemporaryDirectory(prefix="evotrainer-swe-score-") as tmp:
            fresh = Path(self._materialize(self.instance_dir, Path(tmp) / "repo", clear_git_log=True))
            theirs, ours = _files(self.repo), _files(fresh)
            changed, tampered = [], []
            for rel in sorted(set(theirs) | set(ours)):
                same = rel in theirs and rel in ours and theirs[rel].read_bytes() == ours[rel].read_bytes()
                if same:
                    continue
                if is_test_path(rel):
                    tampered.append(rel)
                    continue
                changed.append(rel)
                dst = fresh / rel
                if rel in theirs:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(theirs[rel], dst)
                else:
                    dst.unlink()
            r = run_command(_pytest_argv(getattr(inst, "test_command", ()) or (), f2p + p2p, fresh), workdir=fresh,
                            timeout_s=self.test_timeout_s)
        outcomes = parse_pytest(r.stdout, f2p + p2p)
        passed = sum(outcomes.get(n) == "PASSED" for n in f2p)
        p2p_passed = sum(outcomes.get(n) == "PASSED" for n in p2p)
        # "ran": some hidden test was collected and executed (a collection error reports only "ERROR <file>")
        ran = r.status in ("pass", "fail") and any(outcomes.get(n) not in (None, "ERROR") for n in f2p + p2p)
        correct = ran and passed == len(f2p) and p2p_passed == len(p2p)
        status = "pass" if correct else ("timeout" if r.status == "timeout" else ("fail" if ran else "error"))
        lo, mid, hi = self.reward_tiers
        if correct:
            reward = hi
        elif passed > 0 or (ran and (changed or not self.partial_needs_change)):
            reward = mid
        else:
            reward = lo
        self._verifier = {"correct": bool(correct), "passed": int(passed), "total": len(f2p),
                          "p2p_ok": p2p_passed == len(p2p) and ran, "p2p_passed": int(p2p_passed),
                          "p2p_total": len(p2p), "format_ok": True, "status": status, "tests_ran": bool(ran),
                          "submitted": self.stop_reason == "submitted", "changed_files": changed,
                          "reset_test_files": tampered, "reward": reward,
                          "output_tail": (r.stdout + r.stderr)[-1000:]}
        return self._verifier, reward

    # ------------------------------------------------------------------ evidence

    def turn_rows(self, rollout_uid: str | None = None) -> list[dict]:
        uid = self.rollout_uid if rollout_uid is None else rollout_uid
        return [{**t, "rollout_uid": uid} for t in self.turns]

    def summary(self) -> dict:
        """The rollout-level behaviour columns (module docstring)."""
        tools = [t for t in self.turns if t["role"] == "tool"]
        names = [t["tool_name"] for t in tools]
        edits = [t for t in tools if t["tool_name"] == "search_replace"]
        ok_edits = [t for t in edits if t["tool_ok"]]

        def is_test(t: dict) -> bool:
            if t["tool_name"] == "run_tests":
                return True
            return t["tool_name"] == "run_in_terminal" and "pytest" in (t["tool_args"] or "")

        last_edit = ok_edits[-1]["turn_idx"] if ok_edits else None
        first_edit = edits[0]["turn_idx"] if edits else None
        streak = best = 0
        for i, n in enumerate(names):
            streak = streak + 1 if i and names[i - 1] == n else 1
            best = max(best, streak)
        terminal = [t for t in tools if t["tool_name"] == "run_in_terminal"]
        gold_file = getattr(self.instance, "mutated_file", None)
        gold = {os.path.normpath(gold_file)} if gold_file else set()
        edited = {os.path.normpath(f) for f in self._edited}
        return {
            "n_turns": len(self.turns), "n_tool_calls": len(tools),
            "n_edits": len(ok_edits), "n_edit_failures": len(edits) - len(ok_edits),
            "n_test_runs": sum(is_test(t) for t in tools), "n_terminal_calls": len(terminal),
            "n_search_calls": sum(n in _SEARCH_TOOLS for n in names),
            "self_tested": last_edit is not None and any(is_test(t) and t["turn_idx"] > last_edit for t in tools),
            "search_before_edit": first_edit is not None and any(
                t["tool_name"] in _SEARCH_TOOLS and t["turn_idx"] < first_edit for t in tools),
            "used_git_history": any(_GIT_HISTORY_RE.search(json.loads(t["tool_args"])["command"]) for t in terminal),
            "max_same_tool_streak": best, "first_edit_turn": first_edit,
            "edited_files": json.dumps(sorted(self._edited)),
            "edit_coverage": len(edited & gold) / len(gold) if gold else None,
            "stop_reason": self.stop_reason or "no_submit",
            "n_tokens": self.tokens,
        }


def conform_behaviour(df: pl.DataFrame) -> pl.DataFrame:
    """Cast the behaviour columns present in `df` to ROLLOUT_BEHAVIOUR_COLUMNS' dtypes (after conform_rollouts)."""
    return df.with_columns([pl.col(c).cast(t, strict=True) for c, t in ROLLOUT_BEHAVIOUR_COLUMNS.items()
                            if c in df.columns and df.schema[c] != t])


def rollout_row(summary: dict, verifier: dict, reward: float, *, campaign: str, version: str, split: str, step: int,
                group: int, sample: int, item_id: str, prompt: str = "", completion: str = "",
                mean_logprob: float | None = None) -> dict:
    """A contract rollout row (ROLLOUT_COLUMNS + the behaviour columns) for one scored episode."""
    from ...evidence import group_id, rollout_uid

    n_tokens = int(summary.get("n_tokens", 0))
    return {
        "rollout_uid": rollout_uid(campaign, version, split, step, group, sample), "campaign": campaign,
        "version": version, "split": split, "step": step, "item_id": item_id,
        "group_id": group_id(version, split, step, group), "sample_idx": sample, "prompt": prompt,
        "completion": completion, "n_prompt_tokens": math.ceil(len(prompt) / 4), "n_completion_tokens": n_tokens,
        "truncated": summary.get("stop_reason") in ("turn_cap", "token_budget"),
        "stop_reason": summary.get("stop_reason"), "reward": float(reward),
        "verifier": json.dumps({k: v for k, v in verifier.items() if k != "output_tail"}, sort_keys=True),
        "correct": bool(verifier.get("correct")), "advantage": None, "filtered": False, "filter_reason": None,
        "mean_logprob": mean_logprob,
        **{k: v for k, v in summary.items() if k not in ("stop_reason", "n_tokens")},
    }
