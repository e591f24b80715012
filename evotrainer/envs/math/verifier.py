"""Answer extraction and checking for the math domain.

Extraction prefers the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``) in the completion, else
the last plain number. Plain numbers are compared exactly (``8.0 == 8``, ``1,200 == 1200``);
anything else (``\\frac{16}{2}``, ``8 \\text{ apples}``) goes through math-verify.

Thread safety: math-verify's own timeouts use ``signal.alarm``, which only works in the main
thread, so they are turned off (``parsing_timeout=None``, ``timeout_seconds=None``). Instead,
expressions that could make sympy run for ever (towers of powers, factorials, very long input)
are refused before math-verify sees them and count as not correct.
"""
from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Literal

Extraction = Literal["boxed", "last_number", "none"]

_MAX_MV_CHARS = 80  # longest answer handed to math-verify
_MAX_BOXED_CHARS = 2000  # longest \boxed{...} content scanned for
_MAX_BOXED_TRIES = 8  # unbalanced \boxed occurrences to skip before giving up

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(\s*)")
_NUMBER_RE = re.compile(
    r"(?:(?<![0-9A-Za-z)\]}.])[-\u2212])?"  # a minus sign that is not a binary operator
    r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?"
    r"|(?:(?<![0-9A-Za-z)\]}.])[-\u2212])?(?<![0-9])\.[0-9]+"
)
_PLAIN_NUM_RE = re.compile(r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)?(?:\.[0-9]*)?")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # pragma: no cover - logging plumbing
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def _boxed_content(text: str) -> str | None:
    """Content of the last balanced \\boxed{...}; None if there is none."""
    found = list(_BOXED_RE.finditer(text))[-_MAX_BOXED_TRIES:]
    for bm in reversed(found):
        pos = bm.end()
        if pos < len(text) and text[pos] == "{":
            depth, i, end = 0, pos, min(len(text), pos + _MAX_BOXED_CHARS + 2)
            while i < end:
                ch = text[i]
                if ch == "\\" and i + 1 < end:  # skip escaped chars such as \{ and \}
                    i += 2
                    continue
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        content = text[pos + 1 : i].strip()
                        if content:
                            return content
                        break
                i += 1
        elif bm.group(1):  # "\boxed 42" form
            m = re.match(r"[^\s$]+", text[pos : pos + 100])
            if m:
                return m.group(0)
    return None


_TAIL = 4096
_NUM_CHARS = frozenset("0123456789,.-\u2212")


def _last_number(text: str) -> str | None:
    # Look in the tail first (long completions); never start the window inside a number.
    start = max(0, len(text) - _TAIL)
    while start > 0 and text[start - 1] in _NUM_CHARS:
        start -= 1
    for pos in ((start, 0) if start else (0,)):
        last = None
        for last in _NUMBER_RE.finditer(text, pos):
            pass
        if last is not None:
            return last.group(0).replace("\u2212", "-")
    return None


def extract_answer(completion: str) -> tuple[str | None, Extraction]:
    """(pred, how): the last \\boxed{} content, else the last number, else (None, "none")."""
    if not isinstance(completion, str):
        return None, "none"
    boxed = _boxed_content(completion)
    if boxed is not None:
        return boxed, "boxed"
    num = _last_number(completion)
    if num is not None:
        return num, "last_number"
    return None, "none"


def to_decimal(s: str) -> Decimal | None:
    """Parse a plain number ("8", "8.0", "-3", "1,200", "$1,200.", "\\$5", "1{,}200") or None."""
    t = s.strip()
    t = _TEXT_RE.sub(lambda m: m.group(1), t).strip()
    for a, b in (("\\$", ""), ("$", ""), ("{,}", ","), ("\\!", ""), ("\\,", ""), ("\u2212", "-"), (" ", "")):
        t = t.replace(a, b)
    t = t.rstrip(".")
    if not t or len(t) > 60 or not _PLAIN_NUM_RE.fullmatch(t) or not any(c.isdigit() for c in t):
        return None
    try:
        return Decimal(t.replace(",", ""))
    except (InvalidOperation, ValueError):
        return None


def _safe_for_math_verify(s: str) -> bool:
    if len(s) > _MAX_MV_CHARS or "!" in s or "**" in s:
        return False
    carets = s.count("^")
    if carets > 1:
        return False
    if carets == 1:  # allow only a short literal exponent: x^2, 10^{3}
        return re.search(r"\^\s*(?:-?[0-9]{1,2}|\{\s*-?[0-9]{1,2}\s*\})", s) is not None
    return True


@lru_cache(maxsize=4096)
def _mv_parse(s: str) -> tuple:
    from math_verify import parse  # imported lazily: pulls in sympy

    try:
        return tuple(parse("\\boxed{" + s + "}", parsing_timeout=None))
    except Exception:  # pragma: no cover - parse() already swallows errors
        return ()


def _mv_equal(gold: str, pred: str) -> bool:
    if not (_safe_for_math_verify(gold) and _safe_for_math_verify(pred)):
        return False
    try:
        from math_verify import verify

        g, p = _mv_parse(gold), _mv_parse(pred)
        if not g or not p:
            return False
        return bool(verify(list(g), list(p), timeout_seconds=None))
    except Exception:
        return False


def answers_match(gold: str, pred: str | None) -> bool:
    if pred is None:
        return False
    g, p = to_decimal(gold), to_decimal(pred)
    if g is not None and p is not None:
        return g == p
    return _mv_equal(gold.strip(), pred.strip())


def verify_completion(gold: str, completion: str) -> dict[str, Any]:
    """JSON-serialisable outcome; never raises."""
    try:
        pred, how = extract_answer(completion)
        correct = answers_match(str(gold), pred)
    except Exception:  # pragma: no cover - last line of defence
        pred, how, correct = None, "none", False
    return {
        "pred": pred,
        "gold": str(gold),
        "correct": bool(correct),
        "format_ok": how == "boxed",
        "extraction": how,
    }
