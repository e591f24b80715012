"""Shared plumbing for the EvoTrainer widgets: the anywidget base class, intents, JSON cleaning.

A widget is a thin view over `evotrainer.lab.Lab`. Python computes every number and list the view
shows and sends plain JSON through synced traitlets; the JavaScript only renders and sends user
intents back as `{"action": name, "args": {...}}` custom messages. Each action maps to a public
Python method of the widget (listed in `_ACTIONS`), so a click and a cell do the same thing.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anywidget
import traitlets as t

STATIC = Path(__file__).resolve().parent / "static"


def esm(name: str) -> str:
    """The widget's ES module: the shared helpers followed by the widget's own file (no build step)."""
    return (STATIC / "common.js").read_text() + "\n" + (STATIC / name).read_text()


def css() -> str:
    return (STATIC / "widgets.css").read_text()


def clean(value: Any) -> Any:
    """Plain JSON: NaN/inf -> None, numpy scalars -> Python, tuples -> lists, dates -> ISO text."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [clean(v) for v in value]
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return clean(value.item())
    if hasattr(value, "model_dump"):
        return clean(value.model_dump(mode="json"))
    return str(value)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The kernel's asyncio loop when one is running (ipykernel has one), else None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except Exception:  # noqa: BLE001 - a view must never take the kernel down
        return None
    return loop if loop.is_running() else None


class EvoWidget(anywidget.AnyWidget):
    """Base: a status line (`message`, `message_kind`) and intent dispatch from the browser."""

    _css = css()
    message = t.Unicode("").tag(sync=True)
    message_kind = t.Unicode("info").tag(sync=True)  # info | ok | error

    # action name (sent by JS) -> method name; only these can be called from the browser
    _ACTIONS: ClassVar[dict[str, str]] = {}

    def __init__(self, lab, **kwargs):
        super().__init__(**kwargs)
        self.lab = lab
        self.on_msg(self._on_custom_msg)

    # -- intents from the browser

    def _on_custom_msg(self, _widget, content, _buffers=None) -> None:
        if not isinstance(content, dict) or "action" not in content:
            return
        self.handle_intent(content["action"], content.get("args") or {})

    def handle_intent(self, action: str, args: Mapping[str, Any] | None = None) -> Any:
        """What a click does: call the mapped method; an error becomes the widget's message, never a crash."""
        method: Callable | None = getattr(self, self._ACTIONS[action], None) if action in self._ACTIONS else None
        if method is None:
            self._say(f"unknown action {action!r}", "error")
            return None
        try:
            return method(**dict(args or {}))
        except Exception as exc:  # noqa: BLE001 - a view must never take the kernel down  # a widget must never take the kernel down
            self._say(f"{action}: {exc}", "error")
            return None

    def _say(self, text: str, kind: str = "info") -> None:
        self.message_kind = kind
        self.message = text
