"""The SWE domain: real small Python projects with injected bugs (AST mutants), fixed by an agent.

instance.py is the data model and on-disk layout; build.py builds instances from PyPI sdists.
"""
from __future__ import annotations

from .instance import SweInstance, instance_dir, load_instance, materialize

__all__ = ["SweInstance", "instance_dir", "load_instance", "materialize"]
