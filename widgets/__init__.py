"""EvoTrainer notebook widgets: thin views over `evotrainer.lab.Lab` (Python computes, JS renders).

    from widgets import workbench
    workbench(lab)            # a tab per view
"""
from __future__ import annotations

from .backtests import BacktestCompare
from .browser import RolloutBrowser
from .campaign import CampaignView
from .diagnostics import DiagnosticEditor
from .proposals import GateReview, ProposalQueue

__all__ = ["BacktestCompare", "CampaignView", "DiagnosticEditor", "GateReview", "ProposalQueue", "RolloutBrowser",
           "workbench"]


def workbench(lab, refresh_s: float = 2.0):
    """A tabbed view with all five widgets (the editor's findings open in the browser tab)."""
    import ipywidgets as ipw

    browser = RolloutBrowser(lab)
    editor = DiagnosticEditor(lab).link(browser)
    views = [("Campaign", CampaignView(lab, refresh_s=refresh_s)), ("Rollouts", browser),
             ("Backtests", BacktestCompare(lab)), ("Gate", ProposalQueue(lab)), ("Diagnostics", editor)]
    tab = ipw.Tab(children=[w for _, w in views])
    tab.titles = tuple(name for name, _ in views)
    tab.add_class("evo-workbench")
    tab.views = dict(views)
    return tab
