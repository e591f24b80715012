"""The campaign loop: creates versions and trains each one in a subprocess.

The controller only reads and writes the store; training runs as
`python -m evotrainer.train VERSION_DIR`, so a crash or an out-of-memory kill is a recorded
status, not a dead notebook kernel. State is derived from the ledger, so `resume` is a replay.

For now the chain uses a fixed harness (every version trains the base policy under the
campaign's harness with its own seed); the agent loop that proposes interventions builds on this.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import paths, policy
from .config import RunConfig
from .envs import build_domain, load_items
from .errors import ConfigError, CorruptTableError, EvoTrainerError, StoreError
from .harness import rewards as reward_mod
from .schema import CampaignSpec, VersionCreated, VersionFailed, VersionSpec, version_name
from .status import CampaignStatus, VersionState, format_status, from_ledger
from .store import Store

Log = Callable[[str], None]


class TrainingFailed(EvoTrainerError):
    pass


def campaign_spec(config: RunConfig, name: str, preset: str | None) -> CampaignSpec:
    return CampaignSpec(
        name=name, preset=preset, policy=config.policy, data=config.data, train=config.train,
        harness=config.harness, seed=config.seed, warm_start=config.warm_start,
    )


def open_or_create(campaign_dir: Path, config: RunConfig | None, preset: str | None, resume: bool) -> Store:
    campaign_dir = Path(campaign_dir)
    if resume:
        if not Store.exists(campaign_dir):
            raise StoreError(f"no campaign at {campaign_dir} to resume; drop --resume to start a new one there")
        store = Store.open(campaign_dir)
        bad = store.scan_for_corruption()  # refuse to build on evidence that cannot be read
        if bad:
            names = ", ".join(str(p.relative_to(store.root)) for p, _ in bad[:3])
            raise CorruptTableError(
                f"{len(bad)} unreadable table file(s) in {store.root}: {names}; move them aside with "
                f"`evotrainer doctor {store.root} --quarantine`, then resume"
            )
        return store
    if Store.exists(campaign_dir):
        # Opening first validates its schema version, so a foreign campaign gets that error instead.
        Store.open(campaign_dir)
        raise StoreError(f"{campaign_dir} already holds a campaign; add --resume to continue it or pick another --campaign")
    assert config is not None
    validate_config(config)  # before anything is written: a bad config leaves no trace
    return Store.create(campaign_dir, campaign_spec(config, config.name or campaign_dir.name, preset))


def validate_config(config: RunConfig) -> None:
    """Checks that need more than the schema: the policy exists, the data can supply the items."""
    policy.check(config.policy, paths.models_dir())
    for name in (n for n in (config.data.train_jsonl, config.data.val_jsonl) if n):
        if not Path(name).is_file():
            raise ConfigError(f"data file {name} does not exist; fix data.train_jsonl / data.val_jsonl")
    try:
        load_items(config.data, build_domain(config.data, config.harness.system_prompt))
    except ValueError as exc:
        raise ConfigError(f"data: {exc}; change data.n_train / data.n_val / data.tiers") from exc
    for c in config.harness.rewards:
        if c.name not in reward_mod.known():
            raise ConfigError(f"harness: unknown reward component {c.name!r}; known: {', '.join(reward_mod.known())}")


def next_version_spec(store: Store, index: int) -> VersionSpec:
    spec = store.campaign
    name = version_name(index)
    parent = version_name(index - 1) if index > 0 else None
    warm = bool(spec.warm_start and parent is not None)
    base_policy = str(store.final_dir(parent)) if warm else spec.policy
    return VersionSpec(
        version=name, parent=parent, policy=base_policy, warm_start=warm, confounded=warm,
        harness=spec.harness, data=spec.data, train=spec.train, seed=spec.seed + index,
        note="fixed harness chain" + ("; warm-started from the parent's final weights" if warm else ""),
    )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a SIGKILLed controller takes training down too
    except OSError:
        pass


def train_version(store: Store, version: str, log: Log = print, extra_env: dict | None = None) -> int:
    """Run the training subprocess for one version, echoing its progress lines. Returns its exit code."""
    env = dict(os.environ)
    env["EVOTRAINER_PARENT_PID"] = str(os.getpid())
    env.setdefault("EVOTRAINER_DATA", str(paths.data_dir()))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "evotrainer.train", str(store.version_dir(version))]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        preexec_fn=_die_with_parent, bufsize=1,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log(line.rstrip("\n"))
    return proc.wait()


def run_campaign(
    campaign_dir: Path, config: RunConfig | None, versions: int, resume: bool = False,
    preset: str | None = None, log: Log = print,
) -> CampaignStatus:
    store = open_or_create(campaign_dir, config, preset, resume)
    policy.check(store.campaign.policy, paths.models_dir())  # a resumed campaign's model may have moved
    log(f"campaign {store.campaign.name} at {store.root}")
    for index in range(versions):
        name = version_name(index)
        status = from_ledger(store)
        current = status.versions.get(name)
        if current is not None and current.state is VersionState.TRAINED:
            continue
        if current is None:
            spec = next_version_spec(store, index)
            store.write_version(spec)
            store.ledger.append(VersionCreated(version=name, parent=spec.parent, reason=spec.note))
        started = time.monotonic()
        log(f"== {name}: training (log: {store.train_log(name)})")
        rc = train_version(store, name, log)
        after = from_ledger(store).versions[name]
        if rc != 0 or after.state is not VersionState.TRAINED:
            why = after.error if after.state is VersionState.FAILED and after.error else (
                f"training process exited with code {rc}" + (" (killed)" if rc < 0 else "")
            )
            if after.state is not VersionState.FAILED:
                store.ledger.append(VersionFailed(version=name, error=why))
            raise TrainingFailed(
                f"{name} failed: {why}; see {store.train_log(name)}, then rerun with --resume"
            )
        log(f"== {name}: done in {time.monotonic() - started:.0f}s, Avg@k {after.final_avg_at_k:.3f}")
    final = from_ledger(store)
    log(format_status(final, store))
    log(f"results: {store.root}  (rollouts under versions/*/rollouts, ledger.jsonl; `evotrainer status {store.root}`)")
    return final
