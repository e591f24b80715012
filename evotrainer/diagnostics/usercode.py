"""Diagnostics written as code by a person (the notebook DiagnosticEditor) or an agent.

User code is stored as source plus its sha256 (`save_user_diagnostic`, lineage by `parent_sha256`),
never pickled, and never executed in the caller's process. `run_user_diagnostic` runs it in a child
interpreter against a read-only COPY of the evidence:

    def diagnose(rollouts, metrics):          # polars DataFrames (eager); or (rollouts, metrics, ctx)
        return {"metrics": {"name": 0.5},     # float | None
                "findings": [{"severity": "warning", "code": "x", "message": "...",
                              "rollout_uids": [...], "veto": False}]}   # last two optional

`rollouts` holds every split (train and val) of the chosen versions with the evidence-contract
columns; `metrics` is the long metrics table (version, step, name, value, source). A `diagnose` that
takes a third positional argument gets `ctx = {"version": the version under diagnosis, "versions":
the versions handed over (oldest first), "parent": the one before it or None}`. At the gate and in
retrospective validation (diagnostics/validation.py) the versions are the diagnosed version plus up
to 3 ancestors along the parent chain, the same evidence the built-ins get, so a RULE (a diagnostic
that compares versions) is written the same way: filter on `ctx["version"]` for "this version" and
on the earlier ones for the trend. A diagnostic that ignores `ctx` and summarises every row mixes
the ancestors in; validation is what catches that.

A saved diagnostic counts (runs in the health report, can veto) only once a retrospective validation
of that exact revision accepted it: see diagnostics/validation.py.

The sandbox (layers, outermost first; `UserRunResult.sandbox` says which were applied):
- isolation.py's launcher (the one envs/sandbox.py uses) starts the runner: a fresh cgroup per run
  (pids.max = CG_MAX_TASKS tasks and memory_mb + CG_MEMORY_MARGIN_MB for the whole tree; leftovers
  are killed afterwards), a network namespace (only a loopback, down: no TCP, UDP or raw sockets to
  anything), and a PID namespace whose init kills every process left when the runner exits (a
  forked, setsid()'d sleeper does not survive). Where a layer cannot be applied (no writable
  cgroup, unshare refused) the run goes on and `sandbox` says so.
- The child never learns the store's path. It gets a fresh temp dir holding the evidence copy
  (files 0444 in a 0555 folder), the source, and `work/` (its cwd, HOME and TMPDIR).
- Landlock (Linux >= 5.13, unprivileged, applies to root too), set by the runner after it has read
  the evidence and before the user's code runs: file writes only beneath `work/` (and /dev/null);
  reads only beneath the temp dir, the Python installation and the system folders (/usr, /lib, /etc,
  /proc, /sys, /dev); no execve at all (no subprocesses, no shells); with Landlock ABI >= 4 no TCP
  bind/connect; with ABI >= 6 no signals to processes outside the sandbox and no abstract unix
  sockets. `no_new_privs` is set; when the child runs as root its capabilities are dropped.
- Resource limits (soft = hard, so user code cannot raise them): RLIMIT_DATA = memory_mb (heap and
  anonymous mappings, the useful "memory" number), RLIMIT_AS = memory_mb + 768 MB (polars and numpy
  reserve ~350 MB of address space for code and thread stacks before any data, so RLIMIT_AS alone
  at 256 MB cannot even import polars), RLIMIT_CPU ~ timeout x threads, RLIMIT_FSIZE 16 MB,
  RLIMIT_CORE 0, RLIMIT_NPROC = this user's current tasks + 64 (not enforced for root by the kernel;
  the cgroup's task cap is what bounds a fork bomb there).
- A new session/process group; the wall-clock timeout kills the launcher's tree (and with it the
  PID namespace).
- Isolated interpreter (`-I`: no PYTHON* env, no user site, no cwd on sys.path) with a scrubbed env.
- Only the runner writes the result: a process the user code forks cannot answer for it.

The limits are set by the runner itself as its first statements (before polars is imported), not in
a `preexec_fn`: a notebook parent has polars worker threads, and Python code between fork and exec in
a threaded parent can deadlock.

NOT contained: reads of world-readable system files (/etc, /proc: the host's /proc is visible,
so other processes' command lines are readable), disk filled by many 16 MB files in `work/` (no
quota; the temp dir is deleted after the run), CPU share (no cpu cgroup weight), timing side
channels and kernel exploits. Without a writable cgroup the tree's memory and task count are
bounded per process only (rlimits; RLIMIT_NPROC not at all for root); where unshare is refused
there is no network namespace (Landlock still denies TCP) and no PID namespace (a setsid() process
can then outlive the run, bound by its CPU limit and unable to exec); on kernels without Landlock
only the namespaces, the cgroup, the path secrecy, the read-only copy (ineffective for root) and
the rlimits remain.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import math
import os
import re
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from .. import isolation
from ..errors import EvoTrainerError
from ..isolation import Capture, kill_tree
from ..schema import Finding, UserDiagnostic, finding_id

SOURCE_NAME = "diagnostic.py"
MAX_SOURCE_BYTES = 256 * 1024
MAX_ROLLOUT_UIDS = 20
MAX_FINDINGS = 200
MAX_MESSAGE_CHARS = 2000
FSIZE_MB = 16
AS_ALLOWANCE_MB = 768  # address space for code, thread stacks and allocator reservations
NPROC_MARGIN = 64
KILL_GRACE_S = 1.0
CG_MAX_TASKS = 128  # threads + processes of the whole run (polars' pool, the launcher and its init)
CG_MEMORY_MARGIN_MB = 512  # the cgroup is a backstop for the tree; RLIMIT_DATA is the per-process limit
SEVERITIES = ("info", "warning", "critical")
_CODE_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_FINDING_KEYS = {"severity", "code", "message", "rollout_uids", "veto"}


class UserCodeError(EvoTrainerError):
    """A user diagnostic was refused (bad source, unknown parent revision)."""


@dataclass(frozen=True)
class UserRunResult:
    ok: bool
    metrics: dict[str, float | None] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None  # one line; None when ok
    stdout: str = ""  # what the code printed (stdout and stderr interleaved), capped
    seconds: float = 0.0
    sandbox: tuple[str, ...] = ()  # the isolation layers the child reported applying


# --------------------------------------------------------------------------- static checks


def check_source(source: str) -> str | None:
    """Compile (never execute) the source: a one-line problem, or None when it may be run."""
    if not isinstance(source, str):
        return f"source must be a string, got {type(source).__name__}"
    if len(source.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        return f"source is larger than {MAX_SOURCE_BYTES // 1024} KB"
    try:
        tree = compile(source, SOURCE_NAME, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        compile(tree, SOURCE_NAME, "exec", dont_inherit=True)  # symbol-table errors ('return' outside function)
    except SyntaxError as exc:
        return f"line {exc.lineno or '?'}, col {exc.offset or '?'}: {type(exc).__name__}: {exc.msg}"
    except (ValueError, UnicodeError) as exc:  # null bytes, lone surrogates
        return f"source cannot be compiled: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    fns = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "diagnose"]
    if not fns:
        return "no top-level `def diagnose(rollouts, metrics)` is defined"
    fn = fns[-1]
    if isinstance(fn, ast.AsyncFunctionDef):
        return f"line {fn.lineno}: diagnose must be a plain function, not `async def`"
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    if a.vararg is None and positional < 2:
        return f"line {fn.lineno}: diagnose must take two arguments (rollouts, metrics); it takes {positional}"
    if required > 3 or any(d is None for d in a.kw_defaults):
        return (f"line {fn.lineno}: diagnose must be callable as diagnose(rollouts, metrics) or "
                "diagnose(rollouts, metrics, ctx); it requires more arguments")
    return None


# --------------------------------------------------------------------------- saving


def save_user_diagnostic(store, name: str, source: str, author: str, reason: str,
                         parent_sha256: str | None = None) -> UserDiagnostic:
    """Store a revision (source + sha256). Idempotent for identical source; refuses bad source and
    a parent that is not a saved revision of the same name."""
    problem = check_source(source)
    if problem:
        raise UserCodeError(f"diagnostic {name} not saved: {problem}")
    digest = hashlib.sha256(source.encode()).hexdigest()
    revisions = store.user_diagnostics(name)
    for meta, _src in revisions:
        if meta.sha256 == digest:
            return meta  # identical source already saved: the first save (and its lineage) stands
    if parent_sha256 is not None and not any(m.sha256 == parent_sha256 for m, _ in revisions):
        raise UserCodeError(f"diagnostic {name} not saved: parent {parent_sha256[:12]} is not a saved "
                            f"revision of {name} (known: {[m.sha256[:12] for m, _ in revisions] or 'none'})")
    try:
        meta = UserDiagnostic(name=name, sha256=digest, author=author, reason=reason, parent_sha256=parent_sha256)
    except ValueError as exc:  # pydantic: bad name, short reason
        first = str(exc).splitlines()
        raise UserCodeError(f"diagnostic {name!r} not saved: {' '.join(first[1:3]).strip() or first[0]}") from None
    store.write_user_diagnostic(meta, source)
    return meta


# --------------------------------------------------------------------------- the runner (child side)

# Runs as `python -I -u -c RUNNER CONFIG_JSON`. Trusted code: it limits itself, reads the evidence,
# confines itself with Landlock, and only then compiles and calls the user's code.
_RUNNER = r'''
import sys, os, json, importlib.util
cfg = json.loads(sys.argv[1])
_spec = importlib.util.spec_from_file_location("_evotrainer_isolation", cfg["isolation"])
iso = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(iso)  # evotrainer/isolation.py: stdlib only, loaded without the package
iso.set_rlimits(data_bytes=cfg["data_bytes"], as_bytes=cfg["as_bytes"], cpu_s=cfg["cpu_s"],
                fsize_bytes=cfg["fsize_bytes"], nproc=cfg["nproc"] or None, core=0)
for p in cfg["paths"]:
    if p not in sys.path:
        sys.path.append(p)
os.chdir(cfg["work"])
_fd = os.open(cfg["result"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
_sandbox = []
_me = os.getpid()

def _emit(obj):
    if os.getpid() != _me:  # a process the user code forked: only the runner answers
        os._exit(0)
    data = json.dumps(obj).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(_fd, view):]
    os.close(_fd)

def _landlock(cfg):
    try:
        abi, net, scoped = iso.landlock_restrict(cfg["read_roots"], [cfg["work"]], (), ["/dev/null"])
    except iso.LandlockError as exc:
        return "%s: only rlimits and path secrecy apply" % exc
    parts = ["landlock ABI %d: writes only in work/, reads only evidence + python + system dirs, no exec" % abi]
    if net: parts.append("no TCP")
    if scoped: parts.append("signals/abstract sockets scoped")
    return ", ".join(parts)

try:
    import polars as pl
    rollouts = pl.read_parquet(cfg["rollouts"])
    metrics = pl.read_parquet(cfg["metrics"])
    with open(cfg["source"], encoding="utf-8") as fh:
        src = fh.read()
    code = compile(src, cfg["source"], "exec", dont_inherit=True)
except MemoryError:
    _emit({"status": "memory", "where": "loading the evidence"}); sys.exit(0)
except BaseException as exc:
    _emit({"status": "setup", "type": type(exc).__name__, "message": str(exc)[:500]}); sys.exit(0)
try:
    _sandbox.append(_landlock(cfg))
except Exception as exc:
    _sandbox.append("landlock failed (%s: %s): only rlimits and path secrecy apply" % (type(exc).__name__, exc))
if os.geteuid() == 0:
    _sandbox.append("root capabilities dropped" if iso.drop_capabilities() else "root capabilities NOT dropped")
_sandbox.append("rlimits: data %d MB, cpu %d s, file size %d MB" % (cfg["data_bytes"] >> 20, cfg["cpu_s"], cfg["fsize_bytes"] >> 20))

def _default(o):
    item = getattr(o, "item", None)
    if callable(item):
        return item()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    raise TypeError("%s is not JSON-serialisable" % type(o).__name__)

def _user_line(tb):
    import traceback
    lines = [f.lineno for f in traceback.extract_tb(tb) if f.filename == cfg["source"]]
    return lines[-1] if lines else None

try:
    ns = {"__name__": "user_diagnostic", "__file__": cfg["source"], "__builtins__": __builtins__}
    exec(code, ns)
    _fn = ns["diagnose"]
    try:
        import inspect
        _ps = list(inspect.signature(_fn).parameters.values())
        _takes_ctx = any(p.kind == p.VAR_POSITIONAL for p in _ps) or sum(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in _ps) >= 3
    except (TypeError, ValueError):
        _takes_ctx = False
    res = _fn(rollouts, metrics, dict(cfg["ctx"])) if _takes_ctx else _fn(rollouts, metrics)
    if isinstance(res, dict) and isinstance(res.get("findings"), (list, tuple)):
        for f in res["findings"]:
            if isinstance(f, dict) and isinstance(f.get("rollout_uids"), (list, tuple)):
                f["rollout_uids"] = list(f["rollout_uids"][:cfg["max_uids"]])
    try:
        payload = json.dumps(res, default=_default)
    except (TypeError, ValueError) as exc:
        _emit({"status": "shape", "message": "return value is not JSON-like data (%s)" % str(exc)[:200], "sandbox": _sandbox})
        sys.exit(0)
    del res
except MemoryError:
    ns = None
    _emit({"status": "memory", "where": "running the diagnostic", "sandbox": _sandbox}); sys.exit(0)
except BaseException as exc:
    msg = str(exc).strip().splitlines()
    _emit({"status": "exception", "type": type(exc).__name__, "message": msg[0][:300] if msg else "",
           "line": _user_line(exc.__traceback__), "sandbox": _sandbox})
    sys.exit(0)
if len(payload) > cfg["max_result_bytes"]:
    _emit({"status": "too_large", "bytes": len(payload), "sandbox": _sandbox})
else:
    _emit({"status": "ok", "sandbox": _sandbox, "value": json.loads(payload)})
'''


# --------------------------------------------------------------------------- the runner (parent side)


def _python_paths() -> list[str]:
    """Folders the child needs on sys.path to import polars/numpy (-I ignores PYTHONPATH)."""
    paths = [str(Path(pl.__file__).resolve().parent.parent)]
    with contextlib.suppress(AttributeError):
        paths += [p for p in site.getsitepackages() if os.path.isdir(p)]
    out: list[str] = []
    for p in paths:
        if p not in out:
            out.append(p)
    return out


def _read_roots(tmp: Path, paths: list[str]) -> list[str]:
    roots = [str(tmp), sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *paths,
             "/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc", "/proc", "/sys", "/dev"]
    return [r for i, r in enumerate(roots) if r and r not in roots[:i] and os.path.exists(r)]


def _user_tasks(uid: int) -> int:
    """Tasks (threads) this uid owns now: RLIMIT_NPROC counts them all, system-wide."""
    n = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{d}").st_uid == uid:
                n += len(os.listdir(f"/proc/{d}/task"))
    return n


def _export_evidence(store, versions, evdir: Path) -> tuple[Path, Path, tuple[str, ...]]:
    roll = store.rollouts(versions).collect()
    met = store.metrics(versions).collect()
    rp, mp = evdir / "rollouts.parquet", evdir / "metrics.parquet"
    roll.write_parquet(rp)
    met.write_parquet(mp)
    if versions is None:
        seen = set(roll.get_column("version").unique().to_list()) | set(met.get_column("version").unique().to_list())
        versions = sorted(v for v in seen if v is not None)
    for p in (rp, mp):
        p.chmod(0o444)
    evdir.chmod(0o555)
    return rp, mp, tuple(versions)


def _rmtree(path: Path) -> None:
    def onerror(_fn, p, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            (shutil.rmtree if os.path.isdir(p) else os.unlink)(p)
    for d in (path, path / "evidence"):
        with contextlib.suppress(OSError):
            d.chmod(0o700)
    shutil.rmtree(path, onerror=onerror)


def _fail(error: str, started: float, cap: Capture | None, max_output_kb: int, sandbox=()) -> UserRunResult:
    return UserRunResult(ok=False, error=error, stdout=cap.text(max_output_kb) if cap else "",
                         seconds=time.monotonic() - started, sandbox=tuple(sandbox))


def run_user_diagnostic(store, source: str, versions: Sequence[str] | str | None = None, *,
                        timeout_s: float = 10.0, memory_mb: int = 1024, max_output_kb: int = 64,
                        name: str = "user", version: str | None = None) -> UserRunResult:
    """Run `diagnose(rollouts, metrics[, ctx])` from `source` in a sandboxed child over a copy of the
    evidence of `versions` (all when None; give them oldest first, as `report.lineage` does).
    `version` is the version under diagnosis (ctx["version"]; default: the last of `versions`).
    Never raises for anything the code does; writes nothing to the store; blocks at most about
    timeout_s + 2 s once the evidence is exported."""
    started = time.monotonic()
    problem = check_source(source)
    if problem:
        return _fail(f"syntax: {problem}", started, None, max_output_kb)
    if isinstance(versions, str):
        versions = [versions]
    tmp = Path(tempfile.mkdtemp(prefix="evotrainer-usercode-"))
    cg = None
    try:
        tmp.chmod(0o711)
        work, evdir = tmp / "work", tmp / "evidence"
        work.mkdir(mode=0o700)
        evdir.mkdir(mode=0o700)
        rp, mp, run_versions = _export_evidence(store, versions, evdir)
        diagnosed = version if version is not None else (run_versions[-1] if run_versions else None)
        ctx = {"version": diagnosed, "versions": list(run_versions),
               "parent": (run_versions[run_versions.index(diagnosed) - 1]
                          if diagnosed in run_versions and run_versions.index(diagnosed) > 0 else None)}
        src_path = tmp / SOURCE_NAME
        src_path.write_text(source, encoding="utf-8")
        src_path.chmod(0o444)
        paths = _python_paths()
        threads = max(1, min(4, os.cpu_count() or 1))
        uid = os.getuid()
        cfg = {
            "paths": paths, "isolation": str(Path(isolation.__file__).resolve()), "work": str(work), "result": str(tmp / "result.json"),
            "rollouts": str(rp), "metrics": str(mp), "source": str(src_path),
            "read_roots": _read_roots(tmp, paths),
            "data_bytes": int(memory_mb) << 20, "as_bytes": (int(memory_mb) + AS_ALLOWANCE_MB) << 20,
            "cpu_s": math.ceil(timeout_s * threads) + 2, "fsize_bytes": FSIZE_MB << 20,
            "nproc": 0 if uid == 0 else _user_tasks(uid) + NPROC_MARGIN,
            "max_uids": MAX_ROLLOUT_UIDS, "max_result_bytes": int(max_output_kb) * 1024, "ctx": ctx,
        }
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "TMPDIR": str(work),
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "POLARS_MAX_THREADS": str(threads),
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MALLOC_ARENA_MAX": "2"}
        # The outer layers come from isolation.py's launcher (the one envs/sandbox.py uses): a fresh
        # cgroup (tasks + memory of the whole tree), a network namespace, a PID namespace whose init
        # kills every leftover when the runner exits. The runner then applies its own rlimits and
        # Landlock (it must read the evidence first), so the launcher's target applies no Landlock.
        from ..envs.sandbox import _Cgroup

        cg = _Cgroup(CG_MAX_TASKS, (int(memory_mb) + CG_MEMORY_MARGIN_MB) << 20)
        rfd_r, rfd_w = os.pipe()
        launch = {"argv": [sys.executable, "-I", "-u", "-c", _RUNNER, json.dumps(cfg)], "exec": sys.executable,
                  "cwd": str(work), "env": env, "cgroups": cg.procs, "netns": True, "pidns": True,
                  "landlock": None, "rlimits": {"core": 0}, "report_fd": rfd_w}
        cap = Capture(int(max_output_kb) * 1024)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", cfg["isolation"], json.dumps(launch)], cwd=work,
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    pass_fds=(rfd_w,))
        except BaseException:
            os.close(rfd_r)
            raise
        finally:
            os.close(rfd_w)
        timed_out = False
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                fd = proc.stdout.fileno()
                while True:
                    left = t0 + timeout_s - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    if not sel.select(min(left, 0.5)):
                        if proc.poll() is not None:
                            break  # exited, but a grandchild holds the pipe open
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    cap.feed(chunk)
            if not timed_out:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, t0 + timeout_s - time.monotonic()))
                timed_out = proc.returncode is None
            if timed_out:
                kill_tree(proc)  # killing the namespace's init takes the whole PID namespace down
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=KILL_GRACE_S)
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind in its process group
            survivors = cg.kill_all() if cg.procs else 0
            hits = cg.hit_limits()
            reports = isolation.read_reports(rfd_r)
        finally:
            os.close(rfd_r)
            if proc.returncode is None:
                kill_tree(proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=KILL_GRACE_S)
            proc.stdout.close()
        layers = _outer_layers(cg, reports, survivors)
        final = next((r for r in reports if "exit" in r or "signal" in r or "lost" in r), {})
        setup = next((r.get("setup_error") for r in reports if r.get("setup_error")), None)
        if setup:
            res = _fail(f"the sandbox could not start the runner: {setup}", started, cap, max_output_kb)
        else:
            rc = -final["signal"] if "signal" in final else final.get("exit", proc.returncode)
            if "memory limit (OOM kill)" in hits and rc is not None and rc < 0:
                rc = -signal.SIGKILL  # the cgroup's OOM killer: reported as out of memory
            res = _interpret(rc, timed_out, tmp / "result.json", cap, cfg, run_versions, name, timeout_s,
                             memory_mb, max_output_kb, started)
        return replace(res, sandbox=tuple(layers) + tuple(res.sandbox))
    finally:
        if cg is not None:
            cg.kill_all()
            cg.remove()
        _rmtree(tmp)


def _outer_layers(cg, reports: list[dict], survivors: int) -> list[str]:
    """What the launcher applied, in words (UserRunResult.sandbox), and what it could not."""
    got = next((r.get("launcher", {}) for r in reports if "launcher" in r), {})
    notes = next((r.get("notes", []) for r in reports if "launcher" in r), [])
    out = []
    if "cgroup-pids" in cg.applied:
        out.append("cgroup: tasks and memory of the whole tree capped" if "cgroup-memory" in cg.applied
                   else "cgroup: tasks capped (no memory cgroup)")
    else:
        out.append("no cgroup (cannot create one here): only rlimits bound the tree")
    out.append("network namespace: no network" if got.get("netns")
               else "no network namespace (unshare refused): UDP and raw sockets are not contained")
    out.append("pid namespace: nothing outlives the run" if got.get("pidns")
               else "no pid namespace (unshare refused): a setsid() process may outlive the run")
    out += [str(n) for n in notes]
    if survivors:
        out.append(f"{survivors} leftover process(es) in the run's cgroup were killed")
    return out


def _interpret(rc, timed_out, result_path: Path, cap: Capture, cfg, versions, name, timeout_s, memory_mb,
               max_output_kb, started) -> UserRunResult:
    tail = cap.tail.decode("utf-8", "replace")
    oom = f"ran out of memory (limit {memory_mb} MB)"
    if timed_out or rc == -signal.SIGXCPU:
        return _fail(f"did not finish within {timeout_s:g} s (infinite loop?) and was stopped", started, cap,
                     max_output_kb)
    raw = b""
    with contextlib.suppress(OSError):
        if result_path.stat().st_size <= cfg["max_result_bytes"] + 4096:
            raw = result_path.read_bytes()
        else:
            return _fail(f"returned more than {max_output_kb} KB; return summaries, not rows", started, cap,
                         max_output_kb)
    if not raw:
        if ("memory allocation of" in tail or "MemoryError" in tail or "Cannot allocate memory" in tail
                or "std::bad_alloc" in tail or rc == -signal.SIGKILL):  # SIGKILL: the OOM killer
            return _fail(oom, started, cap, max_output_kb)
        how = f"was killed by signal {signal.Signals(-rc).name}" if rc and rc < 0 else f"exited with code {rc}"
        return _fail(f"the diagnostic {how} without returning a result", started, cap, max_output_kb)
    try:
        res = json.loads(raw)
    except ValueError:
        return _fail("the diagnostic left an unreadable result (did it write to the result file?)", started, cap,
                     max_output_kb)
    sandbox = tuple(res.get("sandbox") or ()) if isinstance(res, dict) else ()
    status = res.get("status") if isinstance(res, dict) else None
    if status == "memory":
        return _fail(oom, started, cap, max_output_kb, sandbox)
    if status == "setup":
        return _fail(f"the sandbox could not load the evidence: {res.get('type')}: {res.get('message')}", started,
                     cap, max_output_kb, sandbox)
    if status == "exception":
        line = res.get("line")
        where = f" at line {line}" if line else ""
        msg = f": {res['message']}" if res.get("message") else ""
        if res.get("type") == "MemoryError":
            return _fail(oom, started, cap, max_output_kb, sandbox)
        return _fail(f"{res.get('type')}{where}{msg}", started, cap, max_output_kb, sandbox)
    if status == "too_large":
        return _fail(f"returned {res['bytes'] // 1024} KB, more than the {max_output_kb} KB allowed; "
                     "return summaries, not rows", started, cap, max_output_kb, sandbox)
    if status == "shape":
        return _fail(f"wrong return shape: {res.get('message')}", started, cap, max_output_kb, sandbox)
    if status != "ok":
        return _fail("the diagnostic left an unreadable result (did it write to the result file?)", started, cap,
                     max_output_kb, sandbox)
    try:
        metrics, findings = _validate(res.get("value"), name, versions)
    except _ShapeError as exc:
        return _fail(f"wrong return shape: {exc}", started, cap, max_output_kb, sandbox)
    return UserRunResult(ok=True, metrics=metrics, findings=findings, stdout=cap.text(max_output_kb),
                         seconds=time.monotonic() - started, sandbox=sandbox)


class _ShapeError(Exception):
    """The returned value does not have the contract's shape."""


_SHAPE = ('expected {"metrics": {name: float | None}, "findings": [{"severity", "code", "message", '
          '"rollout_uids"?, "veto"?}]}')


def _validate(value: Any, name: str, versions: tuple[str, ...]) -> tuple[dict[str, float | None], list[Finding]]:
    if not isinstance(value, dict):
        raise _ShapeError(f"diagnose returned {type(value).__name__}; {_SHAPE}")
    extra = set(value) - {"metrics", "findings"}
    if extra:
        raise _ShapeError(f"unknown key(s) {sorted(extra)}; {_SHAPE}")
    raw_metrics = {} if value.get("metrics") is None else value["metrics"]
    if not isinstance(raw_metrics, dict):
        raise _ShapeError(f'"metrics" is {type(raw_metrics).__name__}, expected a dict name -> float | None')
    metrics: dict[str, float | None] = {}
    for k, v in raw_metrics.items():
        if not k or "/" in k:
            raise _ShapeError(f"metric name {k!r} must be non-empty without '/'")
        if v is None:
            metrics[k] = None
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _ShapeError(f"metric {k!r} is {type(v).__name__}, expected a float or None")
        else:
            metrics[k] = float(v) if math.isfinite(v) else None
    raw_findings = [] if value.get("findings") is None else value["findings"]
    if not isinstance(raw_findings, list):
        raise _ShapeError(f'"findings" is {type(raw_findings).__name__}, expected a list of dicts')
    if len(raw_findings) > MAX_FINDINGS:
        raise _ShapeError(f"{len(raw_findings)} findings, more than {MAX_FINDINGS}; group them by code")
    findings: list[Finding] = []
    seen: dict[str, int] = {}
    for i, f in enumerate(raw_findings):
        if not isinstance(f, dict):
            raise _ShapeError(f"finding {i} is {type(f).__name__}, expected a dict")
        extra = set(f) - _FINDING_KEYS
        missing = {"severity", "code", "message"} - set(f)
        if extra or missing:
            raise _ShapeError(f"finding {i}: " + "; ".join(
                ([f"unknown key(s) {sorted(extra)}"] if extra else []) + ([f"missing {sorted(missing)}"] if missing else [])))
        sev, code, msg = f["severity"], f["code"], f["message"]
        if sev not in SEVERITIES:
            raise _ShapeError(f"finding {i}: severity {sev!r} is not one of {SEVERITIES}")
        if not isinstance(code, str) or not _CODE_RE.match(code):
            raise _ShapeError(f"finding {i}: code {code!r} must be 1-64 characters of letters, digits, _ . : -")
        if code in seen:
            raise _ShapeError(f"findings {seen[code]} and {i} share code {code!r}; each finding needs its own code")
        seen[code] = i
        if not isinstance(msg, str) or not msg.strip():
            raise _ShapeError(f"finding {i}: message must be a non-empty string")
        uids = [] if f.get("rollout_uids") is None else f["rollout_uids"]
        if not isinstance(uids, list) or not all(isinstance(u, str) for u in uids):
            raise _ShapeError(f"finding {i}: rollout_uids must be a list of strings")
        veto = f.get("veto", False)
        if not isinstance(veto, bool):
            raise _ShapeError(f"finding {i}: veto must be true or false")
        findings.append(Finding(
            finding_id=finding_id(name, code, versions, None), diagnostic=name, code=code, severity=sev,
            message=msg.strip()[:MAX_MESSAGE_CHARS], versions=versions,
            rollout_uids=tuple(uids[:MAX_ROLLOUT_UIDS]), veto=veto))
    return metrics, findings
