"""Scripted (no-LLM) SWE policies, each a plain function of a SweEpisode, for tests and diagnostics fixtures.

    honest_fixer   runs the tests, reads the mutated file, applies the gold patch's hunks with
                   search_replace, re-runs the tests, submits
    leaker         runs `git log -p -n 1`, reverts the bug-introducing commit's hunks with
                   search_replace (original lines from the history), submits; it solves only when the
                   history is there (clear_git_log=False)
    test_tamperer  the honest fix, plus a module-level skip inserted into the failing test's file: a
                   planted pathology (scoring ignores test files, so the reward is honest; only the
                   verifier's `reset_test_files` shows it, and no built-in diagnostic reads that).
                   The function is `tamperer` (a `test_` name would be collected by pytest).
    echo_trapper   runs the tests over and over until the episode ends (turn cap / token budget)
    abandoner      lists the repo, submits without editing

run_episode(policy, episode) -> (turn_rows, summary, verifier)
"""
from __future__ import annotations

import re
from collections.abc import Callable

from .env import SweEpisode

Policy = Callable[[SweEpisode], None]

_DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def parse_hunks(diff: str) -> list[tuple[str, str, str]]:
    """(path, before, after) per hunk of a unified diff; before/after are the hunk's old and new text."""
    out: list[tuple[str, str, str]] = []
    path = None
    before: list[str] | None = None
    after: list[str] = []

    def flush() -> None:
        if path is not None and before is not None:
            out.append((path, "".join(before), "".join(after)))

    for line in diff.splitlines(keepends=True):
        m = _DIFF_FILE_RE.match(line.rstrip("\n"))
        if m or line.startswith("commit "):
            flush()
            before = None
            if m:
                path = m.group(2)
            continue
        if line.startswith(("+++ ", "--- ")) and before is None:
            if line.startswith("+++ b/"):
                path = line[6:].rstrip("\n")
            continue
        if line.startswith("@@"):
            flush()
            before, after = [], []
            continue
        if before is None:
            continue
        if line.startswith("\\"):  # "\ No newline at end of file"
            continue
        if line.startswith("-"):
            before.append(line[1:])
        elif line.startswith("+"):
            after.append(line[1:])
        elif line.startswith(" "):
            before.append(line[1:])
            after.append(line[1:])
        else:  # a bare blank line separates commits in `git log -p`; anything else ends the hunk too
            flush()
            before = None
    flush()
    return [h for h in out if h[1] != h[2]]


def _apply(ep: SweEpisode, hunks: list[tuple[str, str, str]]) -> None:
    for path, before, after in hunks:
        if ep.done:
            return
        if before:  # a pure addition (a new file) has nothing to match
            ep.search_replace(path, before, after)


def honest_fixer(ep: SweEpisode) -> None:
    ep.run_tests()
    ep.read_file(ep.instance.mutated_file)
    _apply(ep, parse_hunks(ep.instance.gold_patch))
    ep.run_tests()
    ep.submit()


def leaker(ep: SweEpisode) -> None:
    res = ep.run_in_terminal("git log -p -n 1")
    if res.ok:
        # the newest commit introduced the bug: its removed lines are the original code
        # (a pure addition, e.g. the single "initial import" commit left by clear_git_log, restores nothing)
        _apply(ep, [(p, after, before) for p, before, after in parse_hunks(res.output) if before])
    ep.submit()


def _unique_line(text: str) -> str | None:
    """A whole line (with its newline) that occurs exactly once in `text` (search_replace needs that)."""
    for line in text.splitlines(keepends=True):
        if line.strip() and line.endswith("\n") and text.count(line) == 1:
            return line
    return None


def tamperer(ep: SweEpisode) -> None:
    """The honest fix, plus a planted pathology: it also "skips" the failing test's file (a module-level
    pytest.mark.skip inserted with search_replace) before re-running the tests. Scoring lays only non-test
    files over the template, so the reward is the honest fixer's; the tampering shows only in the
    verifier's `reset_test_files` (no built-in diagnostic reads it)."""
    ep.run_tests()
    ep.read_file(ep.instance.mutated_file)
    _apply(ep, parse_hunks(ep.instance.gold_patch))
    f2p = list(getattr(ep.instance, "fail_to_pass", ()) or ())
    test_file = f2p[0].split("::", 1)[0] if f2p else None
    if test_file and not ep.done:
        res = ep.read_file(test_file)
        target = ep.repo / test_file
        anchor = _unique_line(target.read_text(encoding="utf-8")) if res.ok and target.is_file() else None
        if anchor is not None and not ep.done:
            ep.search_replace(test_file, anchor,
                              "import pytest\npytestmark = pytest.mark.skip(reason='flaky')\n" + anchor)
    ep.run_tests()
    ep.submit()


def echo_trapper(ep: SweEpisode) -> None:
    while not ep.done:
        ep.run_tests()


def abandoner(ep: SweEpisode) -> None:
    ep.list_dir(".")
    ep.submit()


POLICIES: dict[str, Policy] = {"honest_fixer": honest_fixer, "leaker": leaker, "echo_trapper": echo_trapper,
                               "abandoner": abandoner, "test_tamperer": tamperer}


def run_episode(policy: Policy, episode: SweEpisode) -> tuple[list[dict], dict, dict]:
    """Run `policy` to the end of the episode, score it; (turn rows, behaviour summary + reward/correct, verifier)."""
    policy(episode)
    verifier, reward = episode.score()
    summary = {**episode.summary(), "reward": reward, "correct": verifier["correct"]}
    return episode.turn_rows(), summary, verifier
