"""Low-level process isolation shared by the user-diagnostic runner and the code/SWE sandbox.

Standard library only, and importable as a plain file: children load it with
`importlib.util.spec_from_file_location` (diagnostics/usercode.py's runner) or run it as a script
(`python -I isolation.py CONFIG_JSON`, the launcher used by envs/sandbox.py) without importing the
`evotrainer` package.

Pieces:
- `set_rlimits`: soft = hard limits (user code cannot raise them).
- `landlock_restrict`: a Landlock ruleset via raw syscalls (ctypes): handled = every filesystem
  right the ABI knows; granted = read beneath `read_roots`, read+write beneath `rw_roots`,
  read+execute of `exec_files` only; with ABI >= 4 TCP bind/connect denied (`deny_tcp`); with
  ABI >= 6 signals and abstract unix sockets scoped to the sandbox.
- `drop_capabilities`: empty the bounding set and the capability sets (a root child keeps uid 0
  but no privilege; with no_new_privs an exec cannot bring them back).
- `unshare`: network / PID / IPC namespaces.
- `descendants`, `kill_tree`, `Capture` (capped reading of output).
- `_launch` (the `__main__` of this file): the trusted launcher. It joins the run's cgroups,
  unshares namespaces, forks an init (PID 1 of the new PID namespace, a child subreaper) which
  forks the target; the target applies rlimits, Landlock and drops capabilities, then execs.
  When the target exits, init kills whatever is left and exits; with a PID namespace the kernel
  kills every process in it when init dies.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys

# ---------------------------------------------------------------- Landlock constants (uapi/linux/landlock.h)
LL_EXECUTE = 1 << 0
LL_WRITE_FILE = 1 << 1
LL_READ_FILE = 1 << 2
LL_READ_DIR = 1 << 3
LL_REMOVE_DIR = 1 << 4
LL_REMOVE_FILE = 1 << 5
LL_MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
LL_REFER = 1 << 13  # ABI 2
LL_TRUNCATE = 1 << 14  # ABI 3
LL_IOCTL_DEV = 1 << 15  # ABI 5
LL_FILE_ONLY = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
LL_READ = LL_READ_FILE | LL_READ_DIR
_SYS_CREATE, _SYS_ADD, _SYS_RESTRICT = 444, 445, 446
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_SET_CHILD_SUBREAPER = 38, 24, 36
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x08000000, 0x10000000, 0x20000000, 0x40000000


class LandlockError(OSError):
    """Landlock could not be applied; str() is a short reason such as 'landlock unavailable (...)'."""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none."""
    try:
        abi = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))


def landlock_restrict(read_roots=(), rw_roots=(), exec_files=(), rw_files=(), *, deny_tcp: bool = True,
                      scoped: bool = True) -> tuple[int, bool, bool]:
    """Confine the calling thread (and its future children) for good. Returns (abi, tcp_denied,
    scoped). Raises LandlockError when the kernel refuses; OSError when a rule cannot be added.
    Missing paths are skipped. Sets no_new_privs (required)."""
    libc = _libc()
    abi = libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        raise LandlockError("landlock unavailable (kernel without Landlock)")
    wr = LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE
    if abi >= 2:
        wr |= LL_REFER
    if abi >= 3:
        wr |= LL_TRUNCATE
    handled = wr | LL_READ | LL_EXECUTE

    class Attr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]

    net = 3 if (abi >= 4 and deny_tcp) else 0
    scope = 3 if (abi >= 6 and scoped) else 0
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    attr = Attr(handled, net, scope)
    rs = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        raise LandlockError(f"landlock ruleset refused (errno {ctypes.get_errno()})")
    try:
        def allow(path, access):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if not os.path.isdir(path):
                    access &= LL_FILE_ONLY
                b = Beneath(access & handled, fd)
                if libc.syscall(_SYS_ADD, ctypes.c_int(rs), ctypes.c_int(1), ctypes.byref(b), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule " + str(path))
            finally:
                os.close(fd)

        for p in read_roots:
            allow(p, LL_READ)
        for p in rw_roots:
            allow(p, LL_READ | wr)
        for p in rw_files:
            allow(p, LL_READ_FILE | LL_WRITE_FILE)
        for p in exec_files:
            allow(p, LL_READ_FILE | LL_EXECUTE)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc.syscall(_SYS_RESTRICT, ctypes.c_int(rs), ctypes.c_uint32(0)) < 0:
            raise LandlockError(f"landlock_restrict_self refused (errno {ctypes.get_errno()})")
    finally:
        os.close(rs)
    return int(abi), bool(net), bool(scope)


# ---------------------------------------------------------------- rlimits, capabilities, namespaces


def set_rlimits(*, data_bytes=None, as_bytes=None, cpu_s=None, fsize_bytes=None, nproc=None, nofile=None,
                core=0) -> list[str]:
    """Set soft = hard limits (CPU: hard = soft + 1 so SIGXCPU comes first). Returns the names set."""
    done = []
    for name, res, n in (("data", resource.RLIMIT_DATA, data_bytes), ("as", resource.RLIMIT_AS, as_bytes),
                         ("fsize", resource.RLIMIT_FSIZE, fsize_bytes), ("nproc", resource.RLIMIT_NPROC, nproc),
                         ("nofile", resource.RLIMIT_NOFILE, nofile), ("core", resource.RLIMIT_CORE, core)):
        if n is None:
            continue
        try:
            resource.setrlimit(res, (int(n), int(n)))
            done.append(name)
        except (ValueError, OSError):
            pass
    if cpu_s is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_s), int(cpu_s) + 1))
        done.append("cpu")
    return done


def drop_capabilities() -> bool:
    """Drop every capability from the bounding set, then empty effective/permitted/inheritable."""
    libc = _libc()
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past last cap
            break
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    nr = 126 if os.uname().machine == "x86_64" else 91
    return libc.syscall(nr, ctypes.byref(hdr), ctypes.byref(data)) == 0


def unshare(flags: int) -> int:
    """unshare(2); returns 0 or the errno."""
    libc = _libc()
    if libc.unshare(ctypes.c_int(flags)) != 0:
        return ctypes.get_errno() or 1
    return 0


# ---------------------------------------------------------------- process trees and output


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                out += kids
                todo += kids
    return out


def kill_tree(proc) -> None:
    """SIGKILL the (unreaped) child `proc` (a Popen), its process group, and descendants that left it."""
    victims = descendants(proc.pid)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in [proc.pid, *victims]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class Capture:
    """A child's output: keep the first `cap` bytes and a short tail for diagnosis."""

    def __init__(self, cap: int):
        self.cap, self.head, self.total, self.tail = cap, bytearray(), 0, b""

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail = (self.tail + chunk)[-4096:]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self, cap_kb: int) -> str:
        out = self.head.decode("utf-8", "replace")
        if self.total > self.cap:
            out += f"\n[output truncated at {cap_kb} KB; {self.total // 1024} KB were printed]"
        return out


# ---------------------------------------------------------------- the launcher (runs as a script)


def _write_report(fd: int, obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(fd, data)


def _target(cfg: dict, rfd: int) -> None:
    """In the forked target: limits, Landlock, capabilities, then exec. Never returns."""
    applied, warnings = [], []
    try:
        os.chdir(cfg["cwd"])
        lim = cfg["rlimits"]
        set_rlimits(**lim)
        applied.append("rlimits")
        if cfg.get("landlock"):
            ll = cfg["landlock"]
            try:
                abi, net, _scope = landlock_restrict(ll["read"], ll["rw"], ll["exec"], ll["rw_files"],
                                                    deny_tcp=ll["deny_tcp"])
                applied.append("landlock")
                applied.append(f"landlock-abi{abi}")
                if net:
                    applied.append("landlock-tcp")
                if ll["deny_tcp"] and not net:
                    warnings.append(f"Landlock ABI {abi} cannot deny TCP")
            except OSError as exc:
                warnings.append(f"{exc}: no filesystem confinement (reads, writes and exec are not restricted)")
                _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        else:
            _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if os.geteuid() == 0:
            if drop_capabilities():
                applied.append("nocaps")
            else:
                warnings.append("root capabilities could not be dropped")
        _write_report(rfd, {"applied": applied, "warnings": warnings})
        os.close(rfd)
        os.execve(cfg["exec"], cfg["argv"], cfg["env"])
    except BaseException as exc:  # noqa: BLE001 - setup or exec failed: report whatever it was
        _write_report(rfd, {"applied": applied, "warnings": warnings,
                            "setup_error": f"{type(exc).__name__}: {exc}"})
    os._exit(127)


def _init(cfg: dict, rfd: int) -> None:
    """PID 1 of the new namespace (or a subreaper without one): run the target, reap, report, exit."""
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        _target(cfg, rfd)
    status = None
    while True:
        try:
            p, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if p == pid:
            status = st
            break
    # the target is gone: nothing else may outlive it
    in_pidns = os.getpid() == 1
    me = int(os.readlink("/proc/self")) if not in_pidns else 1  # /proc is the host's: its pids are host pids
    for _ in range(200):
        if in_pidns:
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of the namespace
        else:
            for q in descendants(me):
                with contextlib.suppress(OSError):
                    os.kill(q, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            break
        import time
        time.sleep(0.005)
    if status is None:
        _write_report(rfd, {"lost": True})
    elif os.WIFSIGNALED(status):
        _write_report(rfd, {"signal": os.WTERMSIG(status), "orphans": 0})
    else:
        _write_report(rfd, {"exit": os.WEXITSTATUS(status)})
    os._exit(0)


def _launch(cfg: dict) -> None:
    rfd = cfg["report_fd"]
    os.set_inheritable(rfd, True)
    notes: list[str] = []
    for procs in cfg.get("cgroups", ()):
        try:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as exc:
            notes.append(f"could not join cgroup {procs} ({exc.strerror})")
    flags = 0
    if cfg.get("netns"):
        flags |= CLONE_NEWNET
    if cfg.get("pidns"):
        flags |= CLONE_NEWPID | CLONE_NEWIPC
    got = {"netns": False, "pidns": False}
    if flags:
        if os.geteuid() != 0:
            uid, gid = os.geteuid(), os.getegid()
            if unshare(CLONE_NEWUSER) == 0:
                with contextlib.suppress(OSError):
                    with open("/proc/self/setgroups", "w") as fh:
                        fh.write("deny")
                    with open("/proc/self/uid_map", "w") as fh:
                        fh.write(f"{uid} {uid} 1")
                    with open("/proc/self/gid_map", "w") as fh:
                        fh.write(f"{gid} {gid} 1")
        err = unshare(flags)
        if err == 0:
            got = {"netns": bool(flags & CLONE_NEWNET), "pidns": bool(flags & CLONE_NEWPID)}
        else:  # try them one at a time
            if cfg.get("netns"):
                got["netns"] = unshare(CLONE_NEWNET) == 0
            if cfg.get("pidns"):
                got["pidns"] = unshare(CLONE_NEWPID) == 0
    _write_report(rfd, {"launcher": got, "notes": notes})
    pid = os.fork()
    if pid == 0:
        _init(cfg, rfd)
    os.close(rfd)
    while True:
        try:
            _, st = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(st) & 0xFF if os.WIFEXITED(st) else 125)


def read_reports(fd: int) -> list[dict]:
    """The launcher's JSON lines (layers it got, what the target applied, how the target ended)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(OSError):
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                out.append(obj)
    return out


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))
