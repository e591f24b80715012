"""Diagnostics: registry, built-in analyzers, the paper's rules R1-R4, and the health report.

Importing the package registers the built-ins and the rules.
"""
from . import builtins as _builtins  # noqa: F401  (registers the built-in diagnostics)
from . import rules as _rules  # noqa: F401  (registers R1-R4)
from . import behaviour as _behaviour  # noqa: F401  (SWE behaviour diagnostics, Git% veto, R5, R6)
from .registry import (
    DIMENSIONS,
    DiagnosticInfo,
    DiagnosticResult,
    Evidence,
    default_thresholds,
    get,
    known,
    register,
    run,
    unregister,
)

__all__ = [
    "DIMENSIONS",
    "DiagnosticInfo",
    "DiagnosticResult",
    "Evidence",
    "default_thresholds",
    "format_health",
    "get",
    "health_report",
    "health_report_for",
    "known",
    "register",
    "run",
    "unregister",
]


def __getattr__(name):  # report imports the store; keep `import evotrainer.diagnostics` light
    if name in ("health_report", "health_report_for", "format_health"):
        from . import report

        return getattr(report, name)
    raise AttributeError(name)
