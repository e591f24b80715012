"""What the example notebooks share: where their campaign lives, and how to open it.

    from evotrainer import notebook_env
    CAMPAIGN = notebook_env.setup()          # $EVOTRAINER_NOTEBOOK_CAMPAIGN, else data/campaigns/notebooks
    lab = notebook_env.open_lab(CAMPAIGN)    # attach, or build a gated smoke campaign if there is none

Every notebook reads the same campaign, so `quickstart.ipynb` trains it once and the others attach.
A notebook run on its own builds the campaign itself. Tests point `EVOTRAINER_NOTEBOOK_CAMPAIGN` at a
temporary folder.

This module is core: it imports no IPython and no widget code.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from . import paths
from .lab import Lab
from .store import Store

ENV_VAR = "EVOTRAINER_NOTEBOOK_CAMPAIGN"
DEFAULT_NAME = "notebooks"
GATES = ("design", "completion")
SETUP_ACTOR = "notebook-setup"


def checkout_root() -> Path:
    """The source checkout this package was imported from (it holds `widgets/` and `notebooks/`)."""
    return Path(__file__).resolve().parent.parent


def campaign_dir() -> Path:
    """The notebooks' campaign: `$EVOTRAINER_NOTEBOOK_CAMPAIGN`, else `<data>/campaigns/notebooks`."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser().resolve() if env else paths.campaigns_dir() / DEFAULT_NAME


def setup() -> Path:
    """Make the checkout's `widgets` package importable (a kernel started in `notebooks/` does not
    see the repository root) and return the campaign directory."""
    if importlib.util.find_spec("widgets") is None:
        root = str(checkout_root())
        if (checkout_root() / "widgets").is_dir() and root not in sys.path:
            sys.path.insert(0, root)
    return campaign_dir()


def wait_for_gate(lab: Lab, timeout: float = 600.0):
    """Block until the controller stops; return the gate it holds at (None when it finished)."""
    lab.wait(timeout=timeout)
    return lab.gate


def open_lab(campaign: str | Path | None = None, *, versions: int = 2, timeout: float = 900.0) -> Lab:
    """Attach to the campaign, or build one if absent: a smoke campaign of `versions` versions with
    human gates on design and completion, every gate approved by `notebook-setup` (the ledger says
    so). An existing campaign is attached as it is, running or held at a gate; a running one is
    waited for."""
    campaign = Path(campaign) if campaign is not None else campaign_dir()
    if Store.exists(campaign):
        lab = Lab.attach(campaign)
        if lab.running:
            lab.wait(timeout=timeout)
        return lab
    lab = Lab.start(campaign, preset="smoke", versions=versions, gates=GATES)
    while (gate := wait_for_gate(lab, timeout)) is not None:
        gate.approve(reason=f"approved by notebook_env.open_lab to build the campaign unattended ({gate.gate} gate)",
                     who=SETUP_ACTOR)
        lab.resume()
    return lab
