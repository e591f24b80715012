"""Errors a user can act on. Each message is one line naming the problem and the fix."""
from __future__ import annotations


class EvoTrainerError(Exception):
    """Base class: the CLI prints `evotrainer: error: <message>` and exits 2."""


class ConfigError(EvoTrainerError):
    """A run configuration or preset is invalid."""


class StoreError(EvoTrainerError):
    """The store refused an operation or found something it cannot read safely."""


class SchemaVersionError(StoreError):
    """A saved document was written under a schema this version cannot read or migrate."""


class CorruptTableError(StoreError):
    """A table file cannot be read (truncated, not parquet, wrong columns)."""


class ModelNotFoundError(EvoTrainerError):
    """The configured policy cannot be found."""
