"""Run untrusted code (model completions, task-repo test suites) in an isolated child.

    run_python(code, files=..., stdin=..., timeout_s=10) -> SandboxResult
    run_command(["python", "-m", "pytest", "-q"], workdir=repo) -> SandboxResult

Status: "pass" (exit 0), "fail" (non-zero exit), "timeout" (wall clock; the whole tree is killed),
"crash" (killed by a signal we did not cause: SIGSEGV, SIGABRT...), "resource_limit" (memory, CPU,
file size, process count: MemoryError, SIGXCPU, EFBIG/SIGXFSZ, EAGAIN on fork, the cgroup OOM
killer). Never raises for anything the code does.

Layers, each recorded in `SandboxResult.isolation` when applied, and in `warnings` when it could
not be (non-root, old kernel, cgroups not writable):
- "cgroup-pids" / "cgroup-memory": a fresh cgroup (v1 or v2, whichever is writable) per run with
  pids.max = max_processes + 2 (the launcher and init) and a memory limit of memory_mb + 128 MB for
  the whole tree. This is what stops a fork bomb as root (the kernel does not enforce
  RLIMIT_NPROC for uid 0). After the run any task still in the cgroup is killed and reported.
- "netns": a new network namespace (only a loopback interface, down): no TCP/UDP/raw/unix-abstract
  traffic to anything outside, including 127.0.0.1 of the host. Skipped when network=True.
- "pidns": a new PID (and IPC) namespace; the launcher's init is PID 1 there and a child
  subreaper: when the target exits, init SIGKILLs what is left and exits, and the kernel kills
  every process of the namespace with it. A double-forked, setsid()'d process cannot survive.
- "rlimits": RLIMIT_DATA = memory_mb, RLIMIT_AS = memory_mb + 1024 MB (address-space reservations
  of threads and numpy), RLIMIT_CPU ~ timeout x cores, RLIMIT_FSIZE = max_file_mb, RLIMIT_NPROC =
  max_processes (enforced only for non-root), RLIMIT_NOFILE 256, RLIMIT_CORE 0.
- "landlock" (+ "landlock-tcp" with ABI >= 4): writes only beneath the work dir (and /dev/null);
  reads beneath the work dir, the Python installation (sys.prefix, sys.base_prefix), /usr, /lib*,
  /bin, /sbin, /etc/ld.so.cache, /etc/localtime, /etc/ssl, /sys/devices/system/cpu and /dev/{null,
  zero,urandom,random}; exec of only the Python interpreter (realpath of sys.executable), the dynamic
  loader, and for run_command argv[0] resolved on PATH plus `exec_paths`. So no shells, no git,
  no other tools unless listed; /proc, /home, /root, /tmp (outside the work dir), other stores are
  unreadable.
- "nocaps": a root child drops its whole capability bounding set and every capability, with
  no_new_privs, before exec: it is uid 0 without privilege.
- Always: start_new_session, scrubbed env (PATH, LANG, HOME=TMPDIR=work dir), `python -I`, cwd =
  work dir, stdin from a file, stdout/stderr capped at max_output_kb each.

NOT contained: the disk (files up to max_file_mb each, but as many as fit; a private temp work dir is
deleted afterwards, a caller's `workdir` is not), CPU time share (no cpu cgroup weight), reads of
world-readable system folders listed above, timing side channels, kernel exploits. A run_command
`workdir` stays root-owned and its contents are writable by the code (that is the point).
"""
from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import isolation as iso

Status = Literal["pass", "fail", "timeout", "crash", "resource_limit"]
_ISOLATION_PY = str(Path(iso.__file__).resolve())
_KILL_GRACE_S = 2.0
_NOFILE = 256
_CG_MEMORY_MARGIN_MB = 128
_RESOURCE_RE = re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|memory allocation of \d+ bytes failed"
                          rb"|\[Errno 11\] Resource temporarily unavailable|\[Errno 27\] File too large"
                          rb"|\[Errno 24\] Too many open files|BlockingIOError")


@dataclass(frozen=True)
class SandboxResult:
    status: Status
    returncode: int | None  # exit code, or -signal; None on timeout
    stdout: str  # capped
    stderr: str  # capped
    seconds: float
    truncated: bool
    isolation: tuple[str, ...]  # layers applied
    warnings: tuple[str, ...]  # what could NOT be applied (or what happened: survivors killed)

    @property
    def ok(self) -> bool:
        return self.status == "pass"


# ---------------------------------------------------------------- cgroups


class _Cgroup:
    """A per-run pids (+ memory) cgroup, v2 or v1, when this process may create one."""

    def __init__(self, max_tasks: int, memory_bytes: int):
        self.dirs: list[str] = []
        self.procs: list[str] = []
        self.applied: list[str] = []
        self.warnings: list[str] = []
        name = "evotrainer-sandbox-" + uuid.uuid4().hex[:12]
        root = "/sys/fs/cgroup"
        v2 = os.path.exists(os.path.join(root, "cgroup.controllers"))
        if v2:
            d = os.path.join(root, name)
            if self._mk(d) and self._set(d, "pids.max", max_tasks):
                self.applied.append("cgroup-pids")
                if self._set(d, "memory.max", memory_bytes):
                    self._set(d, "memory.swap.max", 0)
                    self.applied.append("cgroup-memory")
        else:
            d = os.path.join(root, "pids", name)
            if self._mk(d) and self._set(d, "pids.max", max_tasks):
                self.applied.append("cgroup-pids")
            d = os.path.join(root, "memory", name)
            if self._mk(d) and self._set(d, "memory.limit_in_bytes", memory_bytes):
                self._set(d, "memory.memsw.limit_in_bytes", memory_bytes)
                self.applied.append("cgroup-memory")
        if "cgroup-pids" not in self.applied:
            self.warnings.append("no pids cgroup (cannot create one here): the process count is bounded only by "
                                 "RLIMIT_NPROC, which the kernel does not enforce for root")
        if "cgroup-memory" not in self.applied:
            self.warnings.append("no memory cgroup: memory is limited per process (rlimits), not for the whole tree")

    def _mk(self, d: str) -> bool:
        try:
            os.mkdir(d)
        except OSError:
            return False
        self.dirs.append(d)
        self.procs.append(os.path.join(d, "cgroup.procs"))
        return True

    @staticmethod
    def _set(d: str, key: str, value: int) -> bool:
        try:
            with open(os.path.join(d, key), "w") as fh:
                fh.write(str(int(value)))
            return True
        except OSError:
            return False

    def _read(self, key: str) -> str:
        for d in self.dirs:
            with contextlib.suppress(OSError), open(os.path.join(d, key)) as fh:
                return fh.read()
        return ""

    def pids(self) -> set[int]:
        out: set[int] = set()
        for p in self.procs:
            with contextlib.suppress(OSError, ValueError), open(p) as fh:
                out |= {int(x) for x in fh.read().split()}
        return out

    def hit_limits(self) -> list[str]:
        hits = []
        m = re.search(r"^max (\d+)", self._read("pids.events"), re.MULTILINE)
        if m and int(m.group(1)) > 0:
            hits.append("process limit")
        m = re.search(r"^oom_kill (\d+)", self._read("memory.events") or self._read("memory.oom_control"), re.MULTILINE)
        if m and int(m.group(1)) > 0:
            hits.append("memory limit (OOM kill)")
        return hits

    def kill_all(self) -> int:
        """SIGKILL every task still in the cgroup; returns how many there were."""
        seen: set[int] = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            left = self.pids()
            if not left:
                break
            seen |= left
            for p in left:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.01)
        return len(seen)

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


# ---------------------------------------------------------------- paths


def _read_roots(work: Path) -> list[str]:
    roots = [str(work), sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)),
             "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime",
             "/etc/ssl", "/sys/devices/system/cpu", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
    return [r for i, r in enumerate(roots) if r and r not in roots[:i] and os.path.exists(r)]


def _loaders() -> list[str]:
    out = []
    for pat in ("/lib64/ld-linux*.so*", "/lib/ld-linux*.so*", "/lib/*-linux-gnu/ld-linux*.so*", "/lib/ld-musl*.so*"):
        out += [os.path.realpath(p) for p in glob.glob(pat)]
    return sorted(set(out))


def _env(work: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8",
            "HOME": str(work), "TMPDIR": str(work)}


# ---------------------------------------------------------------- core runner


def _run(argv: list[str], exec_path: str, work: Path, exec_files: list[str], stdin: str, timeout_s: float,
         memory_mb: int, max_processes: int, max_file_mb: int, max_output_kb: int, network: bool,
         extra_read: Sequence[str] = ()) -> SandboxResult:
    started = time.monotonic()
    warnings: list[str] = []
    isolation: list[str] = ["session", "scrubbed-env"]
    threads = max(1, min(4, os.cpu_count() or 1))
    cg = _Cgroup(max_processes + 2, (int(memory_mb) + _CG_MEMORY_MARGIN_MB) << 20)
    isolation += cg.applied
    warnings += cg.warnings
    landlock = None
    if iso.landlock_abi() >= 1:
        landlock = {"read": _read_roots(work) + [str(p) for p in extra_read], "rw": [str(work)],
                    "exec": sorted(set(exec_files) | set(_loaders())), "rw_files": ["/dev/null"],
                    "deny_tcp": not network}
    else:
        warnings.append("no Landlock on this kernel: the code can read and write every file the (capability-less) "
                        "user can, and exec any program")
    cfg = {
        "argv": argv, "exec": exec_path, "cwd": str(work), "env": _env(work), "cgroups": cg.procs,
        "netns": not network, "pidns": True, "landlock": landlock,
        "rlimits": {"data_bytes": int(memory_mb) << 20, "as_bytes": (int(memory_mb) + 1024) << 20,
                    "cpu_s": math.ceil(timeout_s * threads) + 1, "fsize_bytes": int(max_file_mb) << 20,
                    "nproc": int(max_processes) if os.geteuid() != 0 else None, "nofile": _NOFILE, "core": 0},
    }
    stdin_dir = tempfile.mkdtemp(prefix="evotrainer-sbin-")
    rfd_r, rfd_w = os.pipe()
    out_cap, err_cap = iso.Capture(max_output_kb * 1024), iso.Capture(max_output_kb * 1024)
    timed_out = False
    proc = None
    try:
        sp = os.path.join(stdin_dir, "stdin")
        with open(sp, "w", encoding="utf-8") as fh:
            fh.write(stdin or "")
        cfg["report_fd"] = rfd_w
        with open(sp, "rb") as fin:
            proc = subprocess.Popen([sys.executable, "-I", "-S", _ISOLATION_PY, json.dumps(cfg)], cwd=str(work),
                                    env=cfg["env"], stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True, pass_fds=(rfd_w,))
        os.close(rfd_w)
        rfd_w = -1
        deadline = started + timeout_s + 0.3  # the launcher's own start-up is not the code's time
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out_cap)
            sel.register(proc.stderr, selectors.EVENT_READ, err_cap)
            open_ = 2
            while open_:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(min(left, 0.5)):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        key.data.feed(chunk)
                    else:
                        sel.unregister(key.fileobj)
                        open_ -= 1
        if not timed_out:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            timed_out = proc.returncode is None
        if timed_out:
            iso.kill_tree(proc)  # killing init (PID 1) tears the whole PID namespace down
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_KILL_GRACE_S)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        seconds = time.monotonic() - started
        survivors = cg.kill_all() if cg.procs else 0
        if survivors:
            warnings.append(f"{survivors} process(es) were still in the run's cgroup afterwards and were killed")
        hits = cg.hit_limits()
        reports = iso.read_reports(rfd_r)
    finally:
        if rfd_w >= 0:
            os.close(rfd_w)
        os.close(rfd_r)
        if proc is not None:
            if proc.returncode is None:
                iso.kill_tree(proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_KILL_GRACE_S)
            for f in (proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    f.close()
        cg.kill_all()
        cg.remove()
        shutil.rmtree(stdin_dir, ignore_errors=True)

    launcher = next((r for r in reports if "launcher" in r), {})
    target = next((r for r in reports if "applied" in r), {})
    final = next((r for r in reports if "exit" in r or "signal" in r or "lost" in r), {})
    got = launcher.get("launcher", {})
    warnings += launcher.get("notes", [])
    if not network:
        if got.get("netns"):
            isolation.append("netns")
        else:
            warnings.append("no network namespace (unshare(CLONE_NEWNET) refused): the network is reachable"
                            + (" except TCP (Landlock)" if "landlock-tcp" in target.get("applied", []) else ""))
    if got.get("pidns"):
        isolation.append("pidns")
    else:
        warnings.append("no PID namespace (unshare(CLONE_NEWPID) refused): leftovers are found by the init "
                        "subreaper and the cgroup only")
    isolation += target.get("applied", [])
    warnings += target.get("warnings", [])
    if os.geteuid() == 0 and landlock is not None and "rlimits" in target.get("applied", []):
        warnings.append("RLIMIT_NPROC is not enforced for root; the process count relies on the pids cgroup")
    tail = err_cap.tail + out_cap.tail[-1024:]
    if timed_out:
        status, rc = "timeout", None
    elif target.get("setup_error"):
        status, rc = "crash", 127
        err_cap.feed(f"\n[sandbox: could not start the program: {target['setup_error']}]".encode())
    elif "signal" in final:
        sig = final["signal"]
        rc = -sig
        if sig in (signal.SIGXCPU, signal.SIGXFSZ) or (sig == signal.SIGKILL and hits) or sig == signal.SIGKILL:
            status = "resource_limit"
        else:
            status = "crash"
    elif "exit" in final:
        rc = final["exit"]
        if rc == 0:
            status = "pass"
        elif hits or _RESOURCE_RE.search(tail):
            status = "resource_limit"
        else:
            status = "fail"
    else:  # the launcher died without a word (killed from outside, OOM)
        rc = proc.returncode if proc is not None else None
        status = "resource_limit" if hits else "crash"
        warnings.append(f"the launcher exited without reporting (returncode {rc})")
    return SandboxResult(status=status, returncode=rc, stdout=out_cap.text(max_output_kb),
                         stderr=err_cap.text(max_output_kb), seconds=seconds,
                         truncated=out_cap.truncated or err_cap.truncated,
                         isolation=tuple(dict.fromkeys(isolation)), warnings=tuple(dict.fromkeys(warnings)))


# ---------------------------------------------------------------- public API


def run_python(code: str, *, files: dict[str, str] | None = None, stdin: str = "", timeout_s: float = 10.0,
               memory_mb: int = 512, max_processes: int = 32, max_file_mb: int = 16, max_output_kb: int = 64,
               network: bool = False, workdir: Path | None = None) -> SandboxResult:
    """Run `code` as `python -I main.py` (sys.executable) in a private temp work dir (or `workdir`,
    which must exist and is not deleted) holding `files` (relative paths -> text)."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="evotrainer-sandbox-")) if own else Path(workdir).resolve()
    try:
        for rel, text in (files or {}).items():
            p = (work / rel).resolve()
            if work not in p.parents:
                raise ValueError(f"file {rel!r} is outside the work dir")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        main = work / "main.py"
        main.write_text(code, encoding="utf-8")
        py = os.path.realpath(sys.executable)
        return _run([sys.executable, "-I", "main.py"], sys.executable, work, [py], stdin, timeout_s, memory_mb,
                    max_processes, max_file_mb, max_output_kb, network)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def run_command(argv: list[str], *, workdir: Path, stdin: str = "", timeout_s: float = 60.0, memory_mb: int = 2048,
                max_processes: int = 64, max_file_mb: int = 64, max_output_kb: int = 64, network: bool = False,
                exec_paths: Sequence[str] = (), read_paths: Sequence[str] = ()) -> SandboxResult:
    """Run argv (argv[0] looked up on PATH) with cwd = HOME = `workdir` under the same isolation.
    Exec is allowed for argv[0], the Python interpreter and `exec_paths` only (a script's `#!`
    interpreter must be among them); `read_paths` are extra read-only folders."""
    work = Path(workdir).resolve()
    if not work.is_dir():
        raise ValueError(f"workdir {workdir} is not a directory")
    if not argv:
        raise ValueError("argv is empty")
    exe = argv[0]
    if os.sep not in exe:
        found = shutil.which(exe, path=_env(work)["PATH"])
        if found is None:
            return SandboxResult("crash", 127, "", f"[sandbox: {exe!r} not found on PATH]", 0.0, False, (), ())
        exe = found
    elif not os.path.isabs(exe):
        exe = str(work / exe)
    exec_files = [os.path.realpath(exe), os.path.realpath(sys.executable)] + [os.path.realpath(p) for p in exec_paths]
    return _run([argv[0], *argv[1:]], exe, work, exec_files, stdin, timeout_s, memory_mb, max_processes, max_file_mb,
                max_output_kb, network, [str(p) for p in read_paths])
