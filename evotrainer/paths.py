"""Where EvoTrainer keeps models and campaigns by default.

`EVOTRAINER_DATA` wins; otherwise a source checkout uses its own `data/` folder (the README's
commands run there), and an installed package uses `~/.cache/evotrainer`.
"""
from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    env = os.environ.get("EVOTRAINER_DATA")
    if env:
        return Path(env).expanduser().resolve()
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").exists() and (checkout / "data").is_dir():
        return checkout / "data"
    return Path.home() / ".cache" / "evotrainer"


def models_dir() -> Path:
    return data_dir() / "models"


def campaigns_dir() -> Path:
    return data_dir() / "campaigns"
