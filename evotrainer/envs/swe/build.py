"""Build SWE instances: real small pure-Python projects (PyPI sdists) with injected AST-mutation bugs.

    build_instances(cache_root, projects=DEFAULT_PROJECTS, n=30, seed=0) -> list[SweInstance]
    build_from_source(src_dir, project, version, cache_root, n, seed) -> list[SweInstance]
    honest_fix_check(instance, cache_root) -> bool      # gold patch applied -> f2p and p2p pass
    python -m evotrainer.envs.swe.build --out data/swe --n 30 --seed 0

Pipeline per project: pip-download the pinned sdist (cache_root/sdists), unpack it
(cache_root/sources/<name>-<ver>), run each test FILE group once (baseline must pass), enumerate
mutation sites (comparison flips, +/-, and/or, dropped `not`, int off-by-one, return True/False)
inside functions whose name the matching test file mentions, shuffle them with the seed, and run
only the matching test file for each mutant in the sandbox (`run_command`, 2 workers). A mutant is
kept when >= 1 baseline-passing test fails; the first `quota` kept mutants in seeded order become
instances (so parallelism does not change the result). The mutation is an in-place TEXT edit of the
operator/constant (checked by re-parsing: the edited file's AST equals the mutated AST), so the gold
patch is a one-line diff. Test runs use `python -B` (no stale .pyc after same-size edits) and read
pytest's junit xml (xunit1) for node ids.
"""
from __future__ import annotations

import argparse
import ast
import copy
import difflib
import hashlib
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..sandbox import run_command
from .instance import SweInstance, commit_all, git, instance_dir, load_instance, materialize, save_instance

# Verified (pytest 9, CPython 3.11): tests ship in the sdist, pass with no extra deps, < 3 s each.
DEFAULT_PROJECTS: tuple[str, ...] = ("inflection==0.5.1", "toolz==0.12.1", "more-itertools==10.2.0")
# Used, in order, when a default project fails to download or yields no instances.
FALLBACK_PROJECTS: tuple[str, ...] = ("tabulate==0.9.0", "idna==3.6")
P2P_CAP = 30
JUNIT = ".swe-junit.xml"
RUN_TIMEOUT_S = 60.0
_SKIP_DIRS = {".git", "__pycache__", "docs", "doc", "examples", "benchmarks", "bench", "scripts", ".tox", "build",
              "dist", ".eggs"}
_SKIP_FILES = {"setup.py", "conftest.py", "versioneer.py", "_version.py", "noxfile.py", "fabfile.py"}


def base_test_command(pythonpath: str = ".") -> tuple[str, ...]:
    """argv run in the repo root; "python" means the project's interpreter (sys.executable here)."""
    return ("python", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", f"pythonpath={pythonpath}")


# ---------------------------------------------------------------- test running


@dataclass
class TestRun:
    status: str
    results: dict[str, str]  # node id -> "passed" | "failed" | "skipped"
    messages: dict[str, list[str]] = field(default_factory=dict)  # node id -> "E" lines
    seconds: float = 0.0
    ok_report: bool = True  # every junit entry mapped to a node id


def _nodeid(file: str, classname: str, name: str) -> str:
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file
    parts = [file]
    if classname.startswith(module + "."):
        parts += classname[len(module) + 1:].split(".")
    elif classname and classname != module:
        stem = Path(file).stem
        cls = classname.split(".")
        if stem in cls:
            parts += cls[cls.index(stem) + 1:]
    return "::".join([*parts, name])


def _e_lines(text: str, cap: int = 6) -> list[str]:
    out = [ln[1:].strip() for ln in (text or "").splitlines() if ln.startswith("E ")]
    out = [re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", ln) for ln in out]  # object addresses vary per run
    out = [ln[:200] for ln in out if ln]
    return out[:cap]


def parse_junit(path: Path) -> tuple[dict[str, str], dict[str, list[str]], bool]:
    results: dict[str, str] = {}
    messages: dict[str, list[str]] = {}
    ok = True
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return {}, {}, False
    for tc in root.iter("testcase"):
        file = tc.get("file")
        if not file:
            ok = False  # a collection error or similar: no usable node id
            continue
        nid = _nodeid(file, tc.get("classname", ""), tc.get("name", ""))
        bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
        if bad is not None:
            results[nid] = "failed"
            msgs = _e_lines(bad.text or "") or [re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", (bad.get("message") or ""))[:200]]
            messages.setdefault(nid, msgs)
        elif tc.find("skipped") is not None:
            results.setdefault(nid, "skipped")
        else:
            results.setdefault(nid, "passed")
    return results, messages, ok


def run_tests(repo: Path, args: Sequence[str], pythonpath: str = ".", timeout_s: float = RUN_TIMEOUT_S) -> TestRun:
    """Run the base test command + args in the sandbox; results from the junit xml."""
    junit = Path(repo) / JUNIT
    junit.unlink(missing_ok=True)
    argv = [sys.executable, *base_test_command(pythonpath)[1:], f"--junitxml={JUNIT}", "-o", "junit_family=xunit1",
            *args]
    t = time.monotonic()
    r = run_command(argv, workdir=Path(repo), timeout_s=timeout_s)
    results, messages, ok = parse_junit(junit)
    junit.unlink(missing_ok=True)
    return TestRun(r.status, results, messages, time.monotonic() - t, ok)


# ---------------------------------------------------------------- mutation


@dataclass(frozen=True)
class Site:
    file: str  # repo-relative
    index: int  # position in _sites() order for this file
    func: str
    kind: str
    line: int
    desc: str  # e.g. "Compare: '<' -> '<=' at line 42 in func foo"


_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_OP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
            ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.And: "and",
            ast.Or: "or"}
_OP_RE = {"<": rb"<(?![<=])", "<=": rb"<=", ">": rb"(?<![->])>(?![>=])", ">=": rb">=", "==": rb"==", "!=": rb"!=",
          "is": rb"\bis\b(?!\s+not\b)", "is not": rb"\bis\s+not\b", "in": rb"(?<!not )\bin\b", "not in": rb"\bnot\s+in\b",
          "+": rb"\+(?!=)", "-": rb"-(?![=>])", "and": rb"\band\b", "or": rb"\bor\b"}


def _walk_funcs(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, enclosing function name) for nodes inside function bodies (not decorators, defaults or
    f-strings), in a deterministic order."""
    out: list[tuple[ast.AST, str]] = []

    def func(f: ast.AST) -> None:
        for stmt in f.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func(stmt)
            elif not isinstance(stmt, ast.ClassDef):
                out.append((stmt, f.name))
                visit(stmt, f.name)

    def visit(node: ast.AST, name: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func(child)
            elif isinstance(child, ast.JoinedStr):
                continue
            else:
                if name is not None:
                    out.append((child, name))
                visit(child, name)

    visit(tree, None)
    return out


def _sites(tree: ast.AST, file: str) -> list[tuple[ast.AST, Site]]:
    out: list[tuple[ast.AST, Site]] = []
    seen: set[int] = set()
    for node, func in _walk_funcs(tree):
        if id(node) in seen:
            continue
        seen.add(id(node))
        line = getattr(node, "lineno", 0)
        cands: list[tuple[str, str]] = []
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
            a, b = _OP_TEXT[type(node.ops[0])], _OP_TEXT[_CMP_SWAP[type(node.ops[0])]]
            cands.append(("Compare", f"{a!r} -> {b!r}"))
        elif isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub):
            a = _OP_TEXT[type(node.op)]
            cands.append(("BinOp", f"{a!r} -> {'-' if a == '+' else '+'!r}"))
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            a = _OP_TEXT[type(node.op)]
            cands.append(("BoolOp", f"{a!r} -> {'or' if a == 'and' else 'and'!r}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            cands.append(("RemoveNot", "'not' removed"))
        elif (isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 1000
              and hasattr(node, "end_col_offset")):
            cands.append(("Constant", f"{node.value} -> {node.value + 1}"))
        elif (isinstance(node, ast.Return) and isinstance(node.value, ast.Constant)
              and type(node.value.value) is bool):
            cands.append(("ReturnBool", f"{node.value.value} -> {not node.value.value}"))
        for kind, what in cands:
            site = Site(file, len(out), func, kind, line, f"{kind}: {what} at line {line} in func {func}")
            out.append((node, site))
    return out


def _offsets(src: bytes) -> list[int]:
    starts = [0]
    for ln in src.splitlines(keepends=True):
        starts.append(starts[-1] + len(ln))
    return starts


def _pos(starts: list[int], lineno: int, col: int) -> int:
    return starts[lineno - 1] + col


def _replace_in_gap(src: bytes, starts, left: ast.AST, right: ast.AST, op: str, new: str) -> bytes | None:
    a = _pos(starts, left.end_lineno, left.end_col_offset)
    b = _pos(starts, right.lineno, right.col_offset)
    gap = src[a:b]
    ms = list(re.finditer(_OP_RE[op], gap))
    if len(ms) != 1:
        return None
    m = ms[0]
    return src[:a + m.start()] + new.encode() + src[a + m.end():]


def mutate_source(src: bytes, file: str, site_index: int) -> tuple[bytes, Site] | None:
    """Apply site `site_index` as a text edit; None when the edit cannot be made or verified."""
    tree = ast.parse(src)
    sites = _sites(tree, file)
    node, site = sites[site_index]
    starts = _offsets(src)
    new: bytes | None = None
    mtree = copy.deepcopy(tree)
    mnode = _sites(mtree, file)[site_index][0]
    if site.kind == "Compare":
        t = type(node.ops[0])
        new = _replace_in_gap(src, starts, node.left, node.comparators[0], _OP_TEXT[t], _OP_TEXT[_CMP_SWAP[t]])
        mnode.ops = [_CMP_SWAP[t]()]
    elif site.kind == "BinOp":
        a = _OP_TEXT[type(node.op)]
        b = "-" if a == "+" else "+"
        new = _replace_in_gap(src, starts, node.left, node.right, a, b)
        mnode.op = ast.Sub() if a == "+" else ast.Add()
    elif site.kind == "BoolOp":
        a = _OP_TEXT[type(node.op)]
        b = "or" if a == "and" else "and"
        new = _replace_in_gap(src, starts, node.values[0], node.values[1], a, b)
        mnode.op = ast.Or() if a == "and" else ast.And()
    elif site.kind == "RemoveNot":
        s = _pos(starts, node.lineno, node.col_offset)
        e = _pos(starts, node.operand.lineno, node.operand.col_offset)
        if not re.fullmatch(rb"not\s+", src[s:e]):
            return None
        new = src[:s] + src[e:]
        for p in ast.walk(mtree):  # replace the UnaryOp by its operand in the copy
            for fname, value in ast.iter_fields(p):
                if value is mnode:
                    setattr(p, fname, mnode.operand)
                elif isinstance(value, list) and any(v is mnode for v in value):
                    setattr(p, fname, [mnode.operand if v is mnode else v for v in value])
    elif site.kind == "Constant":
        s = _pos(starts, node.lineno, node.col_offset)
        e = _pos(starts, node.end_lineno, node.end_col_offset)
        if not re.fullmatch(rb"\d+", src[s:e]):
            return None
        new = src[:s] + str(node.value + 1).encode() + src[e:]
        mnode.value = node.value + 1
    elif site.kind == "ReturnBool":
        v = node.value
        s = _pos(starts, v.lineno, v.col_offset)
        e = _pos(starts, v.end_lineno, v.end_col_offset)
        if src[s:e] not in (b"True", b"False"):
            return None
        new = src[:s] + str(not v.value).encode() + src[e:]
        mnode.value.value = not v.value
    if new is None:
        return None
    try:
        if ast.dump(ast.parse(new)) != ast.dump(mtree):
            return None
    except SyntaxError:
        return None
    return new, site


def gold_patch(rel: str, buggy: bytes, fixed: bytes) -> str:
    """Unified diff (a/ b/ paths) from the buggy to the fixed file."""
    def lines(b: bytes) -> list[str]:
        out = b.decode("utf-8").splitlines(keepends=True)
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n\\ No newline at end of file\n"
        return out
    return "".join(difflib.unified_diff(lines(buggy), lines(fixed), f"a/{rel}", f"b/{rel}", n=3))


# ---------------------------------------------------------------- project scanning


def _is_test_file(p: Path) -> bool:
    return p.suffix == ".py" and (p.name.startswith("test_") or p.stem.endswith("_test"))


def _scan(src_dir: Path) -> tuple[list[str], list[str], str]:
    tests, sources = [], []
    for p in sorted(src_dir.rglob("*.py")):
        rel = p.relative_to(src_dir)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        if _is_test_file(p):
            tests.append(rel.as_posix())
        elif (p.name not in _SKIP_FILES and not any(part in ("tests", "test", "testing") for part in rel.parts[:-1])
              and len(rel.parts) > 0):
            sources.append(rel.as_posix())
    pythonpath = "src" if (src_dir / "src").is_dir() and any(s.startswith("src/") for s in sources) else "."
    return tests, sources, pythonpath


def _tests_for(module: str, tests: list[str]) -> list[str]:
    stem = Path(module).stem.lstrip("_")
    if stem == "__init__":
        stem = Path(module).parent.name
    hits = [t for t in tests if stem and stem in Path(t).stem]
    if hits:
        return hits
    return list(tests) if len(tests) <= 2 else []


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", JUNIT, ".git"),
                    dirs_exist_ok=True)


def instance_id(project: str, version: str, file: str, mutation: str) -> str:
    h = hashlib.sha256(json.dumps([project, version, file, mutation]).encode()).hexdigest()[:12]
    return f"{project}-{h}"


def problem_statement(project: str, version: str, failing: list[str], messages: dict[str, list[str]],
                      cap_tests: int = 5) -> str:
    out = [f"Some tests of {project} {version} fail. Running the test suite reports:", ""]
    for nid in failing[:cap_tests]:
        out.append(f"FAILED {nid}")
        for ln in messages.get(nid, [])[:6]:
            out.append(f"    {ln}")
    if len(failing) > cap_tests:
        out.append(f"... and {len(failing) - cap_tests} more failing test(s).")
    out += ["", "These tests passed before. Find and fix the bug in the library code so that they pass again; "
            "do not modify the tests."]
    return "\n".join(out)


# ---------------------------------------------------------------- building


def _build_template(src_dir: Path, dest: Path, rel: str, mutant: bytes, module: str) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_tree(src_dir, tmp)
    git(["init", "-q", "."], tmp)
    commit_all(tmp, "initial import")
    (tmp / rel).write_bytes(mutant)
    commit_all(tmp, f"refactor {module}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def build_from_source(src_dir: Path, project: str, version: str, cache_root: Path, n: int, seed: int,
                      log: Callable[[str], object] = print, workers: int = 2,
                      max_candidates: int | None = None) -> list[SweInstance]:
    """Up to n instances from an unpacked project at src_dir (left untouched)."""
    src_dir, cache_root = Path(src_dir), Path(cache_root)
    tests, sources, pythonpath = _scan(src_dir)
    t0 = time.monotonic()
    work_root = Path(tempfile.mkdtemp(prefix=f"swe-{project}-"))
    try:
        wdirs = [work_root / f"w{i}" for i in range(max(1, workers))]
        for w in wdirs:
            _copy_tree(src_dir, w)
        # baseline per test-file group
        groups: dict[tuple[str, ...], TestRun] = {}
        mod_tests = {m: tuple(_tests_for(m, tests)) for m in sources}
        for grp in sorted({g for g in mod_tests.values() if g}):
            run = run_tests(wdirs[0], grp, pythonpath)
            if run.status == "pass" and run.ok_report and run.results:
                groups[grp] = run
            else:
                log(f"  [{project}] baseline of {' '.join(grp)} is {run.status}: dropped")
        test_text = {t: (src_dir / t).read_text(encoding="utf-8", errors="replace") for t in tests}
        cands: list[tuple[str, int, Site]] = []
        originals: dict[str, bytes] = {}
        for m in sources:
            grp = mod_tests[m]
            if grp not in groups:
                continue
            raw = (src_dir / m).read_bytes()
            try:
                tree = ast.parse(raw)
            except SyntaxError:
                continue
            originals[m] = raw
            text = "\n".join(test_text[t] for t in grp)
            for _, site in _sites(tree, m):
                if site.func.startswith("__") or not re.search(rf"\b{re.escape(site.func)}\b", text):
                    continue
                cands.append((m, site.index, site))
        rng = random.Random(f"{seed}:{project}:{version}")
        rng.shuffle(cands)
        if max_candidates is not None:
            cands = cands[:max_candidates]
        log(f"  [{project}] {len(sources)} modules, {len(tests)} test files, {len(groups)} test groups, "
            f"{len(cands)} mutation sites")

        def evaluate(i: int, m: str, got: tuple[bytes, Site] | None):
            if got is None:
                return None
            mutant, site = got
            w = wdirs[i % len(wdirs)]
            (w / m).write_bytes(mutant)
            try:
                run = run_tests(w, mod_tests[m], pythonpath)
            finally:
                (w / m).write_bytes(originals[m])
            return mutant, site, run

        kept: list[SweInstance] = []
        per_func: dict[tuple[str, str], int] = {}
        tried = 0
        pos = 0
        batch = max(1, len(wdirs))
        with ThreadPoolExecutor(max_workers=len(wdirs)) as pool:
            while len(kept) < n and pos < len(cands):
                chunk = [(c, (pos + j)) for j, c in enumerate(cands[pos:pos + batch])]
                # skip functions already used twice before spending a test run on them
                chunk = [(c, j) for c, j in chunk if per_func.get((c[0], c[2].func), 0) < 2]
                # Mutants are made here, not in the pool: CPython 3.11's AST constructor keeps
                # its recursion counter in shared state, so concurrent ast.parse can raise
                # "AST constructor recursion depth mismatch". Only the test runs go parallel.
                futs = [pool.submit(evaluate, j, c[0], mutate_source(originals[c[0]], c[0], c[1]))
                        for c, j in chunk]
                pos += batch
                for (c, _), fut in zip(chunk, futs):
                    res = fut.result()
                    tried += 1
                    if res is None or len(kept) >= n:
                        continue
                    mutant, site, run = res
                    key = (site.file, site.func)
                    if per_func.get(key, 0) >= 2:
                        continue
                    base = groups[mod_tests[site.file]]
                    if run.status == "timeout" or not run.ok_report:
                        continue
                    failing = sorted(t for t, s in base.results.items() if s == "passed" and run.results.get(t) == "failed")
                    if not failing:
                        continue
                    passing = sorted(t for t, s in base.results.items() if s == "passed" and run.results.get(t) == "passed")
                    # (sorted: test order can follow set iteration, which is hash-randomized per process)
                    p2p = sorted(rng.sample(passing, min(P2P_CAP, len(passing)))) if passing else []
                    rel = site.file
                    module = Path(rel).stem if Path(rel).stem != "__init__" else Path(rel).parent.name
                    iid = instance_id(project, version, rel, site.desc)
                    inst = SweInstance(
                        instance_id=iid, project=project, version=version,
                        problem_statement=problem_statement(project, version, failing, run.messages),
                        fail_to_pass=tuple(failing), pass_to_pass=tuple(p2p),
                        gold_patch=gold_patch(rel, mutant, originals[rel]), mutated_file=rel, mutation=site.desc,
                        test_command=base_test_command(pythonpath), seed=seed)
                    d = instance_dir(cache_root, iid)
                    d.mkdir(parents=True, exist_ok=True)
                    _build_template(src_dir, d / "repo", rel, mutant, module)
                    save_instance(inst, d)
                    per_func[key] = per_func.get(key, 0) + 1
                    kept.append(inst)
        log(f"  [{project}] {len(kept)} instances from {tried} mutants in {time.monotonic() - t0:.1f}s")
        return kept
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


def fetch_source(spec: str, cache_root: Path, log: Callable[[str], object] = print) -> tuple[str, str, Path]:
    """pip-download the sdist for 'name==version' (cached) and unpack it under cache_root/sources."""
    name, _, version = spec.partition("==")
    if not version:
        raise ValueError(f"pin a version: {spec!r}")
    cache_root = Path(cache_root)
    dest = cache_root / "sources" / f"{name}-{version}"
    if (dest / ".complete").exists():
        return name, version, dest
    sdists = cache_root / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    norm = re.sub(r"[-_.]+", "[-_.]", name)
    found = [p for p in sdists.iterdir() if re.fullmatch(rf"(?i){norm}-{re.escape(version)}\.tar\.gz", p.name)]
    if not found:
        log(f"  downloading {spec} ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        spec, "-d", str(sdists)], check=True, capture_output=True, text=True)
        found = [p for p in sdists.iterdir() if re.fullmatch(rf"(?i){norm}-{re.escape(version)}\.tar\.gz", p.name)]
    if not found:
        raise FileNotFoundError(f"no sdist for {spec} in {sdists}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="swe-unpack-"))
    try:
        with tarfile.open(found[0]) as tf:
            tf.extractall(tmp, filter="data")
        tops = [p for p in tmp.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ValueError(f"unexpected sdist layout in {found[0]}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        _copy_tree(tops[0], dest)  # a copy: files owned by us, not by the tarball's uid
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (dest / ".complete").write_text("ok\n")
    return name, version, dest


def build_instances(cache_root: Path, projects: Sequence[str] = DEFAULT_PROJECTS, n: int = 30, seed: int = 0,
                    log: Callable[[str], object] = print,
                    fallbacks: Sequence[str] = FALLBACK_PROJECTS) -> list[SweInstance]:
    """n instances spread evenly over `projects` (later projects make up a shortfall of earlier ones);
    a fallback project is used for what is still missing (a project failed or ran out of mutants)."""
    cache_root = Path(cache_root)
    todo, spare = list(projects), [p for p in fallbacks if p not in projects]
    out: list[SweInstance] = []
    i = 0
    while len(out) < n and (i < len(todo) or spare):
        if i >= len(todo):
            todo.append(spare.pop(0))
        spec = todo[i]
        quota = math.ceil((n - len(out)) / max(1, len(projects) - i)) if i < len(projects) else n - len(out)
        try:
            name, version, src = fetch_source(spec, cache_root, log)
            out += build_from_source(src, name, version, cache_root, quota, seed, log)
        except (subprocess.CalledProcessError, OSError, ValueError) as e:
            log(f"  [{spec}] failed: {e}")
        i += 1
    return out


def _runner_argv(inst: SweInstance, extra: Sequence[str]) -> list[str]:
    cmd = list(inst.test_command)
    if cmd and cmd[0] == "python":
        cmd[0] = sys.executable
    return [*cmd, f"--junitxml={JUNIT}", "-o", "junit_family=xunit1", *extra]


def honest_fix_check(instance: SweInstance, cache_root: Path, *, check_bug: bool = False) -> bool:
    """Materialize (history cleared), apply the gold patch with `git apply`, run f2p + p2p: all pass.
    check_bug=True also checks that every f2p test fails before the patch."""
    d = instance_dir(Path(cache_root), instance.instance_id)
    with tempfile.TemporaryDirectory(prefix="swe-honest-") as tmp:
        repo = materialize(d, Path(tmp) / "repo", clear_git_log=True)
        ids = [*instance.fail_to_pass, *instance.pass_to_pass]
        if check_bug:
            before = _run_ids(repo, instance, list(instance.fail_to_pass))
            if any(before.get(t) != "failed" for t in instance.fail_to_pass):
                return False
        r = git(["apply", "-"], repo, check=False, input=instance.gold_patch)
        if r.returncode != 0:
            return False
        after = _run_ids(repo, instance, ids)
        return all(after.get(t) == "passed" for t in ids)


def _run_ids(repo: Path, inst: SweInstance, ids: list[str]) -> dict[str, str]:
    junit = repo / JUNIT
    junit.unlink(missing_ok=True)
    run_command(_runner_argv(inst, ids), workdir=repo, timeout_s=RUN_TIMEOUT_S)
    results, _, _ = parse_junit(junit)
    junit.unlink(missing_ok=True)
    return results


def load_all(cache_root: Path) -> list[SweInstance]:
    root = Path(cache_root) / "instances"
    return [load_instance(d)[0] for d in sorted(root.iterdir()) if (d / "instance.json").exists()] if root.is_dir() else []


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evotrainer.envs.swe.build", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/swe", type=Path)
    ap.add_argument("--n", default=30, type=int)
    ap.add_argument("--seed", default=0, type=int)
    ap.add_argument("--projects", default=",".join(DEFAULT_PROJECTS), help="comma-separated name==version")
    ap.add_argument("--check", action="store_true", help="run the honest fixer (gold patch) on every instance")
    a = ap.parse_args(argv)
    t = time.monotonic()
    insts = build_instances(a.out, [p for p in a.projects.split(",") if p], a.n, a.seed)
    per: dict[str, int] = {}
    for i in insts:
        per[i.project] = per.get(i.project, 0) + 1
    print(f"built {len(insts)} instances in {time.monotonic() - t:.1f}s under {a.out}/instances: "
          + ", ".join(f"{k} {v}" for k, v in per.items()))
    if a.check:
        bad = [i.instance_id for i in insts if not honest_fix_check(i, a.out)]
        print(f"honest fixer: {len(insts) - len(bad)}/{len(insts)} solved" + (f"; failed: {bad}" if bad else ""))
        return 1 if bad else 0
    return 0 if insts else 1


if __name__ == "__main__":
    sys.exit(main())
