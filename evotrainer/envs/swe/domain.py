"""The SWE domain as a source of items: one built instance (data/swe/instances/<id>/) per item.

Train and held-out items are disjoint by construction: the instances are ordered by a hash of
(seed, instance id), the first n_val are held out and the next n_train are trained on. Without
enough built instances the error says how to build more (`evotrainer swe build`).

A rollout here is a multi-turn episode (envs/swe/env.py), not one completion, so `verify` on a text
completion does not apply: episodes are scored by `SweEpisode.score()` (hidden tests).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ... import paths
from ..base import Item
from .build import load_all
from .instance import SweInstance, instance_dir

DEFAULT_SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Use the tools to explore the code, "
    "edit it and run the tests; submit when the failing tests pass. Do not modify the tests."
)


def swe_root(swe_dir: str | None) -> Path:
    """The built instances' root: `swe_dir`, else <data dir>/swe."""
    return Path(swe_dir).expanduser().resolve() if swe_dir else paths.data_dir() / "swe"


def item_of(inst: SweInstance, root: Path) -> Item:
    return Item(item_id=inst.instance_id, question=inst.problem_statement, answer=inst.mutated_file,
                source=f"swe:{inst.project}=={inst.version}",
                meta={"instance_dir": str(instance_dir(root, inst.instance_id)), "project": inst.project})


class SweDomain:
    name = "swe"

    def __init__(self, swe_dir: str | None = None, system_prompt: str | None = None):
        self.root = swe_root(swe_dir)
        if system_prompt is None:
            from .toolcalls import tools_prompt

            system_prompt = DEFAULT_SYSTEM_PROMPT + "\n\n" + tools_prompt()
        self.system_prompt = system_prompt
        self._instances: dict[str, SweInstance] | None = None

    def instances(self) -> dict[str, SweInstance]:
        if self._instances is None:
            self._instances = {i.instance_id: i for i in load_all(self.root)}
        return self._instances

    def _ordered(self, seed: int) -> list[SweInstance]:
        def key(i: SweInstance) -> str:
            return hashlib.sha256(f"{seed}:{i.instance_id}".encode()).hexdigest()
        return sorted(self.instances().values(), key=key)

    def _take(self, n_val: int, n_train: int, seed: int) -> tuple[list[Item], list[Item]]:
        ordered = self._ordered(seed)
        if len(ordered) < n_val + 1:
            raise ValueError(f"swe: {len(ordered)} instance(s) under {self.root / 'instances'}, need at least "
                             f"n_val + 1 = {n_val + 1}; build them with `evotrainer swe build --out {self.root}`")
        val = [item_of(i, self.root) for i in ordered[:n_val]]
        train = [item_of(i, self.root) for i in ordered[n_val:n_val + n_train]]
        return train, val

    def split_items(self, n_train: int, n_val: int, seed: int) -> tuple[list[Item], list[Item]]:
        return self._take(n_val, n_train, seed)

    def train_items(self, n: int, seed: int, n_val: int = 0) -> list[Item]:
        return self._take(n_val, n, seed)[0]

    def val_items(self, n: int, seed: int) -> list[Item]:
        return self._take(n, 0, seed)[1]

    def instance(self, item: Item) -> tuple[SweInstance, Path]:
        inst = self.instances().get(item.item_id)
        if inst is None:
            raise ValueError(f"swe: no built instance {item.item_id} under {self.root / 'instances'}")
        return inst, instance_dir(self.root, inst.instance_id)

    def messages(self, item: Item) -> list[dict[str, str]]:
        """System: the default prompt plus the tool protocol (envs/swe/toolcalls.py), or the harness's
        own system_prompt verbatim (it then has to teach the protocol itself). User: "Task <instance id>"
        (how a rollout finds its instance), then the problem statement."""
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Task {item.item_id}\n\n{item.question}"}]

    def verify(self, item: Item, completion: str) -> dict[str, Any]:
        raise NotImplementedError("SWE rollouts are multi-turn episodes scored by SweEpisode.score(), "
                                  "not single completions")
