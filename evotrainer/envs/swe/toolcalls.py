"""The text protocol between an LLM policy and a SweEpisode: one assistant message -> one tool call.

    prompt = tools_prompt()                      # for the system prompt
    res = step(episode, assistant_text)          # records the turns, runs the call (or records the failure)
    messages.append(observation_message(res))    # the next user message: "[tool read_file ok]\\n<output>"

The call format (what `tools_prompt()` teaches): exactly one tool call per message, a JSON object between tags,
optionally after some free text:

    <tool_call>{"name": "read_file", "arguments": {"path": "pkg/mod.py"}}</tool_call>

Lenient fallbacks, tried in this order when a message has no `<tool_call>` tag (they are not advertised in the
prompt; they rescue near misses of small models):
  1. a fenced block holding the object: ```json {...} ``` (or a plain ``` fence whose content starts with "{");
  2. a bare JSON object (or array) as the whole message;
  3. a JSON object starting `{"name":` anywhere in the message.
An unterminated `<tool_call>` (or fence) runs to the end of the message; a fence inside the tag is stripped; JSON
strings may hold raw newlines (json's strict=False: models write multi-line `old`/`new` that way); text after
the object is ignored. Only the FIRST call of a message runs; the observation says how many were ignored.
`step` records the message as given, except that characters UTF-8 cannot encode (lone surrogates) become "?".
"arguments" may be left out for a tool without required arguments; an optional argument given as null counts
as not given. Otherwise checking is strict: "arguments" must be an object, string arguments must be strings,
integer ones integers (not bools, not numeric strings), node_ids a list of strings, no unknown argument names.

`parse_tool_call(text)` returns a ParsedCall, or a ParseError whose `kind` is one of
  no_tool_call       no tag, fence or JSON object in the message
  bad_json           the call is not valid JSON, or not a JSON object
  unknown_tool       "name" is missing, not a string, or not a tool (the message lists the tools)
  missing_arguments  a required argument is missing ('read_file needs argument "path"')
  bad_arguments      "arguments" is not an object, an argument has the wrong type, or an argument is unknown
It never raises, whatever the text.

Recording (`step`), one model message = one PAIR of turns:
  - an assistant turn (role "assistant", text = the raw message, `SweEpisode.record_call_message`), then
  - a tool turn: the call's own turn when it parsed (tool_ok = the tool's verdict: an edit that does not apply
    or a failing test run is ok=False, as with the scripted policies), else a FAILED tool turn
    (`SweEpisode.record_invalid_call`): tool_name = the name the model gave for an unknown tool, "invalid"
    otherwise (no call, bad JSON, no name, or bad/missing arguments for a known tool: the error message names
    the tool), tool_args = the arguments as given (their JSON; the raw call text, capped, when it was not JSON;
    null when there was none), tool_output = the error message, tool_ok = False.
  A message with no call at all also gets the failed "invalid" tool turn: under this protocol every message
  must be a call, so a message without one is a protocol failure, and recording it as a failed call keeps
  every message a pair and makes the failure visible where tool failures are counted.
  The turn cap and token budget count rows (both turns), checked after the pair: the call a message carries
  always runs, so a text-protocol episode gets turn_cap / 2 messages (an odd cap lets the last pair end one
  row past it). Once the episode is over, `step` records nothing.

What the behaviour summary (`SweEpisode.summary()`) then counts:
  n_turns            2 per message (scripted policies record tool turns only: compare with care)
  n_tool_calls       one per message, failed protocol calls included (they are tool turns with tool_ok False)
  n_edits / n_edit_failures, n_test_runs, n_search_calls, n_terminal_calls, self_tested, search_before_edit,
  used_git_history, first_edit_turn
                     only calls that reached a tool: a turn under a tool's name always ran that tool, so a
                     malformed search_replace is a protocol failure ("invalid"), not an edit failure, and a
                     malformed run_tests is no test run
  max_same_tool_streak  counts "invalid" like a tool name: a model stuck emitting broken calls shows as a streak
The protocol failures of a rollout are its tool turns with tool_name not in TOOL_NAMES (`protocol_failures`).

Observations go back as role "user" messages (`observation_message`): SmolLM2's chat template is ChatML
(`<|im_start|>role`) with no guaranteed "tool" role, so the result is framed in the content instead:
"[tool NAME ok]" / "[tool NAME failed]" / "[invalid tool call: KIND]" on the first line, then the output or
error (an invalid call also gets a one-line reminder of the format), and "[episode over: REASON]" at the end.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .env import INVALID_TOOL, OUTPUT_CAP, TOOL_NAMES, SweEpisode, ToolResult, cap

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
FENCE = "```"
ERROR_KINDS = ("no_tool_call", "bad_json", "unknown_tool", "missing_arguments", "bad_arguments")
NAME_CAP = 64  # an unknown tool name longer than this is recorded cut
_DECODER = json.JSONDecoder(strict=False)
_EMBEDDED_RE = re.compile(r'\{\s*"name"\s*:')
_LANG_RE = re.compile(r"[A-Za-z0-9_+.-]*")
_TYPE_WORDS = {"str": "a string", "int": "an integer", "list[str]": "a list of strings"}


@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: str  # "str" | "int" | "list[str]"
    required: bool
    doc: str
    default: Any = None


@dataclass(frozen=True)
class ToolSpec:
    name: str
    doc: str
    args: tuple[ArgSpec, ...] = ()

    def signature(self) -> str:
        """read_file(path: str, start?: int, end?: int)"""
        parts = [f"{a.name}{'' if a.required else '?'}: {a.type}" for a in self.args]
        return f"{self.name}({', '.join(parts)})"


TOOL_SPECS: dict[str, ToolSpec] = {s.name: s for s in (
    ToolSpec("list_dir", "list a directory of the repository (folders end with /)",
             (ArgSpec("path", "str", False, "folder relative to the repository root", "."),)),
    ToolSpec("read_file", "show a file with line numbers, optionally only lines start..end (1-based, inclusive)",
             (ArgSpec("path", "str", True, "file relative to the repository root"),
              ArgSpec("start", "int", False, "first line to show"),
              ArgSpec("end", "int", False, "last line to show"))),
    ToolSpec("grep", "search files for a Python regular expression; prints path:line:text per match",
             (ArgSpec("pattern", "str", True, "Python regular expression"),
              ArgSpec("path", "str", False, "file or folder to search", "."))),
    ToolSpec("search_replace", "replace the text `old` with `new` in a file; `old` must occur exactly once, "
                               "whitespace and indentation included",
             (ArgSpec("path", "str", True, "file relative to the repository root"),
              ArgSpec("old", "str", True, "exact text to replace"),
              ArgSpec("new", "str", True, "replacement text"))),
    ToolSpec("run_tests", "run the repository's test suite, or only the given pytest node ids",
             (ArgSpec("node_ids", "list[str]", False, 'e.g. ["tests/test_mod.py::test_name"]'),)),
    ToolSpec("run_in_terminal", "run one program (no shell: no pipes or redirects), e.g. `python -c ...`, "
                                "`git diff`, `ls`, `cat`, `grep`, `find`",
             (ArgSpec("command", "str", True, "the command line"),)),
    ToolSpec("submit", "submit your fix; the episode ends"),
)}  # same names, order, arguments and required-ness as SweEpisode's methods (tests check it)

EXAMPLE_CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "pkg/mod.py"}}</tool_call>'
FORMAT_REMINDER = f"Answer with exactly one tool call, e.g. {EXAMPLE_CALL}"


def tools_prompt() -> str:
    """The protocol instructions and the tool list, for a system prompt."""
    lines = [
        ("You act only through tools. Answer every message with exactly one tool call: a JSON object with the "
        "tool's \"name\" and its \"arguments\", between <tool_call> and </tool_call>. For example:"),
        EXAMPLE_CALL,
        ("You may write a short thought before the call. Only the first call in a message runs. Arguments are JSON: "
        "write newlines in strings as \\n and quotes as \\\". The result comes back in the next message, "
        "starting [tool NAME ok] or [tool NAME failed]."),
        "",
        "Tools (arg?: optional):",
    ]
    for s in TOOL_SPECS.values():
        lines.append(f"- {s.signature()}: {s.doc}")
        for a in s.args:
            default = f" (default {json.dumps(a.default)})" if a.default is not None else ""
            lines.append(f"    {a.name}: {a.doc}{default}")
    lines.append("Call submit when the failing tests pass; the episode ends there.")
    return "\n".join(lines)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict = field(default_factory=dict)  # validated; optional arguments given as null are dropped
    source: str = "tag"  # tag | fence | bare | embedded
    ignored: int = 0  # further tool-call blocks in the message, not run


@dataclass(frozen=True)
class ParseError:
    kind: str  # one of ERROR_KINDS
    message: str
    name: str | None = None  # the tool name as given, when it was a string
    raw_args: Any = None  # the arguments as given (a JSON value), the raw call text when not JSON, else None
    source: str | None = None


@dataclass(frozen=True)
class StepResult:
    ok: bool  # the call ran and the tool said ok
    observation: str  # the tool output or the error message (as recorded in tool_output)
    done: bool  # the episode is over (after this step)
    tool_name: str | None = None  # the recorded tool turn's tool_name (None when nothing was recorded)
    error_kind: str | None = None  # a ParseError kind; "episode_over" when the episode had already ended
    ignored: int = 0  # further calls in the message that were not run
    stop_reason: str | None = None


# --------------------------------------------------------------------------- extraction


def _strip_fence(s: str) -> str:
    s = s.strip()
    if s.startswith(FENCE):
        s = s[len(FENCE):]
        s = s[_LANG_RE.match(s).end():]
        end = s.rfind(FENCE)
        if end != -1:
            s = s[:end]
    return s


def _fenced(text: str) -> str | None:
    """The content of the first ```json fence (or plain ``` fence starting with "{"), else None (linear)."""
    pos = text.find(FENCE)
    while pos != -1:
        start = pos + len(FENCE)
        lang_end = _LANG_RE.match(text, start).end()
        lang = text[start:lang_end].lower()
        close = text.find(FENCE, lang_end)
        content = text[lang_end:] if close == -1 else text[lang_end:close]
        if lang == "json" or (lang == "" and content.lstrip().startswith("{")):
            return content
        if close == -1:
            return None
        pos = text.find(FENCE, close + len(FENCE))
    return None


def _extract(text: str) -> tuple[str, str, int] | None:
    """(call text, source, ignored calls) of the first call-looking block of `text`, else None."""
    at = text.find(OPEN_TAG)
    if at != -1:
        start = at + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, start)
        body = text[start:] if end == -1 else text[start:end]
        rest = "" if end == -1 else text[end + len(CLOSE_TAG):]
        return _strip_fence(body), "tag", rest.count(OPEN_TAG)
    body = _fenced(text)
    if body is not None:
        return body, "fence", 0
    stripped = text.strip()
    if stripped.startswith("{"):
        return stripped, "bare", 0
    if stripped.startswith("["):  # e.g. [{"name": ...}]: a JSON array is a (bad) call, "[tool ...]" prose is not
        try:
            _DECODER.raw_decode(stripped)
            return stripped, "bare", 0
        except (ValueError, RecursionError):
            pass
    m = _EMBEDDED_RE.search(text)
    if m:
        return text[m.start():], "embedded", 0
    return None


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _short(v: Any, limit: int = 60) -> str:
    try:
        s = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        s = "..."
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _q(s: str, limit: int = NAME_CAP) -> str:
    """`s` as a JSON string literal, cut to `limit` chars."""
    return json.dumps(s[:limit], ensure_ascii=False) + ("..." if len(s) > limit else "")


def _recordable(v: Any) -> Any:
    """`v` when its JSON fits OUTPUT_CAP, else its JSON (or repr) as a capped string."""
    try:
        s = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return v if len(s) <= OUTPUT_CAP else cap(s)


def _type_ok(v: Any, t: str) -> bool:
    if t == "str":
        return isinstance(v, str)
    if t == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "list[str]":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return False


def _tool_list() -> str:
    return ", ".join(TOOL_NAMES)


def _check_arguments(spec: ToolSpec, obj: dict, source: str) -> ParsedCall | ParseError:
    name = spec.name
    has_args = "arguments" in obj
    args = obj.get("arguments")
    raw = _recordable(args) if has_args else None

    def err(kind: str, msg: str) -> ParseError:
        return ParseError(kind, msg, name, raw, source)

    if args is None:
        args = {}
    if not isinstance(args, dict):
        return err("bad_arguments", f'{name}: "arguments" must be a JSON object, got {_type_name(args)}')
    known = {a.name: a for a in spec.args}
    unexpected = [k for k in args if k not in known]
    missing = [a.name for a in spec.args if a.required and args.get(a.name) is None]
    wrong = [f'"{a.name}" must be {_TYPE_WORDS[a.type]}, got {_type_name(args[a.name])} ({_short(args[a.name])})'
             for a in spec.args if args.get(a.name) is not None and not _type_ok(args[a.name], a.type)]
    problems = []
    if missing:
        s = "s" if len(missing) > 1 else ""
        msg = f"{name} needs argument{s} " + ", ".join(f'"{m}"' for m in missing)
        if not has_args and any(m in obj for m in missing):
            msg += ' (arguments go inside "arguments": {...}, not next to "name")'
        problems.append(msg)
    if unexpected:
        accepted = ", ".join(a.name + ("" if a.required else "?") for a in spec.args) or "none"
        bad = ", ".join(_q(k) for k in unexpected[:5]) + (", ..." if len(unexpected) > 5 else "")
        problems.append(f"{name} got unexpected argument{'s' if len(unexpected) > 1 else ''} {bad}; "
                        f"its arguments are: {accepted}")
    if wrong:
        problems.append(f"{name}: " + "; ".join(wrong))
    if problems:
        return err("missing_arguments" if missing else "bad_arguments", "; ".join(problems))
    clean = {k: v for k, v in args.items() if v is not None}
    return ParsedCall(name, clean, source)


def parse_tool_call(text: Any) -> ParsedCall | ParseError:
    """The first tool call of an assistant message, validated against TOOL_SPECS; never raises."""
    try:
        return _parse(text)
    except Exception as exc:  # noqa: BLE001 - model text must never crash a rollout
        return ParseError("bad_json", f"the tool call could not be read ({type(exc).__name__})")


def _parse(text: Any) -> ParsedCall | ParseError:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    found = _extract(text)
    if found is None:
        return ParseError("no_tool_call", "no tool call found in the message. " + FORMAT_REMINDER)
    body, source, ignored = found
    body = body.lstrip()
    where = {"tag": "the <tool_call> block", "fence": "the fenced block", "bare": "the message",
             "embedded": "the tool call"}[source]
    if not body.strip():
        return ParseError("bad_json", f"{where} is empty; it must hold a JSON object like "
                                      '{"name": "read_file", "arguments": {"path": "pkg/mod.py"}}', None, None, source)
    try:
        obj, _ = _DECODER.raw_decode(body)
    except json.JSONDecodeError as exc:
        return ParseError("bad_json", f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                          None, cap(body), source)
    except RecursionError:
        return ParseError("bad_json", f"{where} is nested too deeply to read", None, cap(body), source)
    if not isinstance(obj, dict):
        return ParseError("bad_json", f'{where} must be a JSON object {{"name": ..., "arguments": {{...}}}}, got '
                                      f"{_type_name(obj)}", None, _recordable(obj), source)
    name = obj.get("name")
    raw = _recordable(obj.get("arguments"))
    if not isinstance(name, str):
        what = "has no \"name\"" if "name" not in obj else f'has a "name" that is {_type_name(name)}, not a string'
        return ParseError("unknown_tool", f"the tool call {what}; tools are: {_tool_list()}", None, raw, source)
    spec = TOOL_SPECS.get(name)
    if spec is None:
        return ParseError("unknown_tool", f"unknown tool {_q(name)}; tools are: {_tool_list()}",
                          name, raw, source)
    res = _check_arguments(spec, obj, source)
    if isinstance(res, ParsedCall) and ignored:
        res = ParsedCall(res.name, res.arguments, res.source, ignored)
    return res


# --------------------------------------------------------------------------- stepping


def _recorded_name(err: ParseError) -> str:
    """tool_name of a failed call's turn: an unknown tool's name as given (cut to NAME_CAP), else "invalid"."""
    if err.kind == "unknown_tool" and err.name and err.name.strip() and err.name not in TOOL_NAMES:
        return err.name[:NAME_CAP]
    return INVALID_TOOL


def _clean(text: Any) -> str:
    """`text` as a str that UTF-8 can encode (lone surrogates become "?": the turns table must stay writable)."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def step(episode: SweEpisode, text: Any) -> StepResult:
    """Record one assistant message on `episode` and run its tool call, or record the failed call; never raises
    on model text. Records nothing once the episode is over."""
    if episode.done:
        return StepResult(False, f"the episode is over ({episode.stop_reason}); no more tool calls", True, None,
                          "episode_over", 0, episode.stop_reason)
    msg = _clean(text)
    parsed = parse_tool_call(msg)
    episode.record_call_message(msg)
    n_before = len(episode.turns)
    if isinstance(parsed, ParsedCall):
        try:
            res: ToolResult = getattr(episode, parsed.name)(**parsed.arguments)
            name, kind, ignored = parsed.name, None, parsed.ignored
        except Exception as exc:  # noqa: BLE001 - belt and braces: the tools catch their own errors
            error = f"{parsed.name} could not be called: {type(exc).__name__}: {exc}"
            if len(episode.turns) > n_before:  # its turn is recorded already: report, record nothing more
                return StepResult(False, error, episode.done, parsed.name, None, 0, episode.stop_reason)
            parsed = ParseError("bad_arguments", error, parsed.name, _recordable(parsed.arguments), parsed.source)
    if isinstance(parsed, ParseError):
        name, kind, ignored = _recorded_name(parsed), parsed.kind, 0
        res = episode.record_invalid_call(name, parsed.raw_args, parsed.message)
    return StepResult(res.ok, res.output, episode.done, name, kind, ignored, episode.stop_reason)


def observation_message(result: StepResult) -> dict:
    """The chat message carrying `result` to the model's next turn: role "user" (ChatML has no sure "tool"
    role), the tool name and verdict on the first line, then the output."""
    if result.error_kind == "episode_over":
        head, body = "[episode over]", result.observation
    elif result.error_kind is not None:
        head, body = f"[invalid tool call: {result.error_kind}]", result.observation
        if result.error_kind != "no_tool_call":  # the no-call message already carries the reminder
            body += "\n" + FORMAT_REMINDER
    else:
        head = f"[tool {result.tool_name} {'ok' if result.ok else 'failed'}]"
        body = result.observation
        if result.ignored:
            body += f"\n[{result.ignored} more tool call(s) in your message were not run: one call per message]"
    content = f"{head}\n{body}"
    if result.done and result.error_kind != "episode_over":
        content += f"\n[episode over: {result.stop_reason}]"
    return {"role": "user", "content": content}


def protocol_failures(turns: list[dict]) -> int:
    """Tool turns that were not calls of a tool (no call, bad JSON, unknown tool, bad/missing arguments)."""
    return sum(t.get("role") == "tool" and t.get("tool_name") not in TOOL_NAMES for t in turns)
