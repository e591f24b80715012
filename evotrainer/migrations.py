"""Migrations of saved documents and ledger events between schema versions.

A document written under an older schema is upgraded step by step by the functions registered
here (old files are migrated, never silently misread). A document from a newer release, or an
older one with no migration path, is refused with an error that says which release to use.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import SchemaVersionError
from .schema import SCHEMA_VERSION

# from_version -> function turning a dict of that version into a dict of from_version + 1
DOCUMENT_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
EVENT_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def _migrate(raw: dict[str, Any], table: dict, what: str) -> dict[str, Any]:
    found = raw.get("schema_version")
    if not isinstance(found, int):
        raise SchemaVersionError(f"{what} has no integer schema_version; it was not written by EvoTrainer")
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{what} has schema_version {found}, newer than this release's {SCHEMA_VERSION}; "
            "upgrade evotrainer to read it"
        )
    while found < SCHEMA_VERSION:
        step = table.get(found)
        if step is None:
            raise SchemaVersionError(
                f"{what} has schema_version {found} and no migration to {SCHEMA_VERSION} exists; "
                f"open it with the EvoTrainer release that wrote it"
            )
        raw = step(dict(raw))
        found = raw["schema_version"]
    return raw


def migrate_document(raw: dict[str, Any], path: Path | str) -> dict[str, Any]:
    return _migrate(raw, DOCUMENT_MIGRATIONS, str(path))


def migrate_event(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("schema_version") == SCHEMA_VERSION:
        return raw
    return _migrate(raw, EVENT_MIGRATIONS, f"ledger event {raw.get('kind', '?')}")
