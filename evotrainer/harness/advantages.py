"""Group-relative advantages (GRPO), the same arithmetic TRL's GRPOTrainer applies.

    A_i = (r_i - mean(r_group)) / (std + eps)      scale = "group": std of the group
                                                   scale = "batch": std over the whole batch
                                                   scale = "none":  no division

TRL uses the unbiased std (torch.std default, N-1) and eps = 1e-4; so do we, so that a
backtest's advantages match what training computed (tests compare them on stored rollouts).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

EPS = 1e-4


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[object], scale: Literal["group", "batch", "none"] = "group"
) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(group_ids, dtype=object)
    adv = np.empty_like(r)
    std_batch = r.std(ddof=1) if r.size > 1 else 0.0
    for g in dict.fromkeys(groups.tolist()):
        mask = groups == g
        rg = r[mask]
        centred = rg - rg.mean()
        if scale == "group":
            std = rg.std(ddof=1) if rg.size > 1 else 0.0
            centred = centred / (std + EPS)
        elif scale == "batch":
            centred = centred / (std_batch + EPS)
        adv[mask] = centred
    return adv


def group_std(rewards: Sequence[float], group_ids: Sequence[object]) -> dict[object, float]:
    r = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(group_ids, dtype=object)
    return {g: float(r[groups == g].std(ddof=1)) if (groups == g).sum() > 1 else 0.0
            for g in dict.fromkeys(groups.tolist())}
