"""User/agent diagnostics run as source in a sandboxed child (real subprocesses, ~0.2 s each)."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from evotrainer.diagnostics.usercode import (
    MAX_ROLLOUT_UIDS,
    UserCodeError,
    check_source,
    run_user_diagnostic,
    save_user_diagnostic,
)
from evotrainer.schema import finding_id
from evotrainer.testing import synthetic_rollouts, temp_store


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    st = temp_store(tmp_path_factory.mktemp("uc") / "camp")
    for v in ("v001", "v002"):
        for step in (1, 2):
            st.append_rollouts(v, "train", step, synthetic_rollouts("test", v, "train", step, 8, 4, seed=1))
            st.append_metrics(v, step, {"loss": 0.1 * step, "kl": 0.0}, "trl")
        st.append_rollouts(v, "val", 2, synthetic_rollouts("test", v, "val", 2, 4, 4, seed=2))
    return st


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        h.update(f"{p.relative_to(root)}|{st.st_mode}|{st.st_size}|{st.st_mtime_ns}".encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def landlocked(res) -> bool:
    return any(s.startswith("landlock ABI") for s in res.sandbox)


GOOD = '''
import polars as pl

def diagnose(rollouts, metrics):
    print("rows", rollouts.height, "splits", sorted(rollouts["split"].unique().to_list()))
    train = rollouts.filter(pl.col("split") == "train")
    stds = train.group_by("group_id").agg(pl.col("reward").std().alias("s"))
    dgr = float((stds["s"] < 1e-3).mean())
    findings = [{"severity": "warning", "code": "many_rows", "message": f"{train.height} train rows",
                 "rollout_uids": train["rollout_uid"].to_list()}]
    if metrics.filter(pl.col("name") == "kl")["value"].max() == 0:
        findings.append({"severity": "critical", "code": "kl_zero", "message": "KL is zero", "veto": True})
    return {"metrics": {"dgr": dgr, "rows": rollouts.height, "undefined": float("nan"), "none": None},
            "findings": findings}
'''


def test_good_diagnostic_returns_metrics_and_findings_and_writes_nothing(filled):
    before = tree_hash(filled.root)
    res = run_user_diagnostic(filled, GOOD, ["v001", "v002"], name="my_diag")
    assert res.ok, res.error
    assert res.error is None
    assert res.metrics["rows"] == 2 * (2 * 32 + 16)
    assert 0.0 <= res.metrics["dgr"] <= 1.0
    assert res.metrics["undefined"] is None and res.metrics["none"] is None
    assert "splits ['train', 'val']" in res.stdout
    by_code = {f.code: f for f in res.findings}
    many = by_code["many_rows"]
    assert many.diagnostic == "my_diag" and many.severity == "warning" and many.versions == ("v001", "v002")
    assert many.finding_id == finding_id("my_diag", "many_rows", ("v001", "v002"), None)
    assert len(many.rollout_uids) == MAX_ROLLOUT_UIDS
    assert by_code["kl_zero"].veto is True and by_code["kl_zero"].severity == "critical"
    assert res.seconds < 10
    assert tree_hash(filled.root) == before  # running writes nothing to the store

    one = run_user_diagnostic(filled, GOOD, "v002")
    assert one.ok and one.metrics["rows"] == 2 * 32 + 16
    assert one.findings[0].versions == ("v002",)
    every = run_user_diagnostic(filled, GOOD)  # None: all versions
    assert every.ok and every.findings[0].versions == ("v001", "v002")


def test_check_source_reports_syntax_errors_without_executing(tmp_path):
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w')\ndef diagnose(r, m):\n    return {{'metrics': {{}}\n"
    msg = check_source(src)
    assert msg is not None and msg.startswith("line 3, col ") and "SyntaxError" in msg and "\n" not in msg
    assert not marker.exists()
    assert check_source(f"open({str(marker)!r}, 'w')\ndef diagnose(r, m):\n    return {{}}\n") is None
    assert not marker.exists()  # compiled, never executed
    assert "IndentationError" in check_source("def diagnose(r, m):\nreturn 1\n")
    assert "'return' outside function" in check_source("return 1\ndef diagnose(r, m): pass\n")
    assert "no top-level `def diagnose" in check_source("def diagnose_it(r, m):\n    return {}\n")
    assert "no top-level" in check_source("class A:\n    def diagnose(self, r, m): pass\n")
    assert "two arguments" in check_source("def diagnose(rollouts):\n    return {}\n")
    assert "async" in check_source("async def diagnose(r, m):\n    return {}\n")
    assert check_source("def diagnose(*args):\n    return {}\n") is None


def test_syntax_error_run_is_refused_before_any_process(filled):
    res = run_user_diagnostic(filled, "def diagnose(r, m)\n    return {}\n")
    assert not res.ok and res.error.startswith("syntax: line 1, col ") and "SyntaxError" in res.error
    assert res.seconds < 1


def test_exception_reports_type_message_and_user_line(filled):
    src = "import polars as pl\n\ndef helper(x):\n    return x['no_such_key']\n\ndef diagnose(r, m):\n    return helper({})\n"
    res = run_user_diagnostic(filled, src)
    assert not res.ok
    assert res.error == "KeyError at line 4: 'no_such_key'"
    pol = run_user_diagnostic(filled, "def diagnose(r, m):\n    x = 1\n    return r.select('nope')\n")
    assert not pol.ok and pol.error.startswith("ColumnNotFoundError at line 3") and "\n" not in pol.error
    top = run_user_diagnostic(filled, "import not_a_module_xyz\ndef diagnose(r, m):\n    return {}\n")
    assert top.error.startswith("ModuleNotFoundError at line 1: No module named 'not_a_module_xyz'")


def test_infinite_loop_is_stopped_within_the_timeout(filled):
    t = time.monotonic()
    res = run_user_diagnostic(filled, "def diagnose(r, m):\n    print('start')\n    while True:\n        pass\n",
                              timeout_s=2)
    elapsed = time.monotonic() - t
    assert not res.ok
    assert res.error == "did not finish within 2 s (infinite loop?) and was stopped"
    assert "start" in res.stdout
    assert elapsed < 2 + 2


def test_detached_grandchild_does_not_block_the_parent(filled):
    src = ("import os, time\ndef diagnose(r, m):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"
           "    return {'metrics': {'x': 1.0}}\n")
    t = time.monotonic()
    res = run_user_diagnostic(filled, src, timeout_s=5)
    assert res.ok and res.metrics == {"x": 1.0}
    assert time.monotonic() - t < 3


@pytest.mark.parametrize("body", [
    "    a = []\n    while True:\n        a.append(' ' * 10**6)\n",  # gradual growth
    "    return {'metrics': {'x': len(bytearray(10**10))}}\n",  # one huge allocation
])
def test_memory_bomb_is_reported(filled, body):
    res = run_user_diagnostic(filled, "def diagnose(r, m):\n" + body, memory_mb=256, timeout_s=5)
    assert not res.ok
    assert res.error == "ran out of memory (limit 256 MB)"


def test_huge_print_output_is_capped(filled):
    src = "def diagnose(r, m):\n    for i in range(20000):\n        print('y' * 99)\n    return {'metrics': {'ok': 1}}\n"
    res = run_user_diagnostic(filled, src, max_output_kb=16)
    assert res.ok, res.error
    head, _, note = res.stdout.rpartition("\n[")
    assert len(head.encode()) <= 16 * 1024
    assert note.startswith("output truncated at 16 KB") and "1953 KB were printed" in note


def test_huge_return_value_is_refused(filled):
    res = run_user_diagnostic(filled, "def diagnose(r, m):\n    return {'metrics': {f'm{i}': 1.0 for i in range(50000)}}\n")
    assert not res.ok
    assert "more than the 64 KB allowed" in res.error and res.metrics == {} and res.findings == []


@pytest.mark.parametrize("ret, expect", [
    ("[1, 2]", "diagnose returned list"),
    ("None", "diagnose returned NoneType"),
    ("{'metric': {}}", "unknown key(s) ['metric']"),
    ("{'metrics': [1]}", '"metrics" is list'),
    ("{'metrics': {'a': 'high'}}", "metric 'a' is str"),
    ("{'metrics': {'a': True}}", "metric 'a' is bool"),
    ("{'findings': {}}", '"findings" is dict'),
    ("{'metrics': ()}", '"metrics" is list'),
    ("{'findings': [{'severity': 'bad', 'code': 'c', 'message': 'm'}]}", "severity 'bad' is not one of"),
    ("{'findings': [{'severity': 'info', 'code': 'c'}]}", "missing ['message']"),
    ("{'findings': [{'severity': 'info', 'code': 'c', 'message': 'm', 'serverity': 1}]}", "unknown key(s) ['serverity']"),
    ("{'findings': [{'severity': 'info', 'code': 'c', 'message': 'm', 'veto': 'yes'}]}", "veto must be true or false"),
    ("{'findings': [{'severity': 'info', 'code': 'c', 'message': 'm', 'rollout_uids': [1]}]}", "rollout_uids must be"),
    ("{'findings': [{'severity': 'info', 'code': 'c', 'message': 'm'}, {'severity': 'info', 'code': 'c', 'message': 'n'}]}",
     "share code 'c'"),
    ("{'metrics': {'a': object()}}", "not JSON-like data"),
])
def test_wrong_return_shape_is_refused_with_a_clear_error(filled, ret, expect):
    res = run_user_diagnostic(filled, f"def diagnose(r, m):\n    return {ret}\n")
    assert not res.ok
    assert res.error.startswith("wrong return shape: ") and expect in res.error, res.error
    assert "\n" not in res.error


def test_exit_without_result_is_reported(filled):
    res = run_user_diagnostic(filled, "import os\ndef diagnose(r, m):\n    print('bye')\n    os._exit(3)\n")
    assert not res.ok and res.error == "the diagnostic exited with code 3 without returning a result"
    assert "bye" in res.stdout
    sysexit = run_user_diagnostic(filled, "import sys\ndef diagnose(r, m):\n    sys.exit(0)\n")
    assert sysexit.error == "SystemExit at line 3: 0"


def test_cannot_touch_the_store_or_the_evidence_copy(filled):
    root = filled.root
    before = tree_hash(root)
    write = run_user_diagnostic(filled, (
        "import os\ndef diagnose(r, m):\n"
        f"    with open({str(root / 'ledger.jsonl')!r}, 'a') as fh:\n        fh.write('forged')\n"))
    if not landlocked(write) and os.geteuid() == 0:
        pytest.skip("no Landlock on this kernel and running as root: file permissions do not stop root")
    assert not write.ok and write.error.startswith("PermissionError at line 3"), write.error
    for stmt in (f"open({str(root / 'evil.txt')!r}, 'w')",
                 f"os.unlink({str(root / 'campaign.json')!r})",
                 f"os.mkdir({str(root / 'versions' / 'v009')!r})",
                 "open('../evidence/rollouts.parquet', 'ab')",
                 "open('../diagnostic.py', 'w')"):
        res = run_user_diagnostic(filled, f"import os\ndef diagnose(r, m):\n    {stmt}\n    return {{}}\n")
        assert not res.ok and res.error.startswith("PermissionError at line 3"), (stmt, res.error)
    assert tree_hash(root) == before
    assert not (root / "evil.txt").exists()
    # its own scratch folder (cwd = HOME = TMPDIR) is writable
    ok = run_user_diagnostic(filled, (
        "import os, tempfile\ndef diagnose(r, m):\n    open('scratch.txt', 'w').write('x')\n"
        "    tempfile.mkstemp()\n    return {'metrics': {'home_is_cwd': float(os.environ['HOME'] == os.getcwd())}}\n"))
    assert ok.ok and ok.metrics == {"home_is_cwd": 1.0}, ok.error


def test_landlock_also_blocks_reading_the_store_exec_and_tcp(filled):
    probe = run_user_diagnostic(filled, "def diagnose(r, m):\n    return {}\n")
    if not landlocked(probe):
        pytest.skip("no Landlock on this kernel")
    read = run_user_diagnostic(filled, f"def diagnose(r, m):\n    open({str(filled.root / 'campaign.json')!r}).read()\n")
    assert read.error.startswith("PermissionError at line 2")
    sub = run_user_diagnostic(filled, "import subprocess\ndef diagnose(r, m):\n    subprocess.run(['true'])\n")
    assert sub.error.startswith("PermissionError at line 3")
    if any("no TCP" in s for s in probe.sandbox):
        net = run_user_diagnostic(filled, ("import socket\ndef diagnose(r, m):\n"
                                           "    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"))
        assert net.error.startswith("PermissionError at line 3")
    env = run_user_diagnostic(filled, "import os, sys\ndef diagnose(r, m):\n    return {'metrics': {'n': len(os.environ)}}\n"
                              "    # env is scrubbed\n")
    assert env.ok and env.metrics["n"] <= 12


def test_save_revisions_lineage_idempotence_and_refusals(store):
    v1 = "def diagnose(r, m):\n    return {}\n"
    v2 = "def diagnose(r, m):\n    return {'metrics': {'n': r.height}}\n"
    a = save_user_diagnostic(store, "row_count", v1, author="alice", reason="count the rows")
    assert a.sha256 == hashlib.sha256(v1.encode()).hexdigest() and a.parent_sha256 is None
    again = save_user_diagnostic(store, "row_count", v1, author="bob", reason="same source again")
    assert again == a  # identical source: the first save stands
    b = save_user_diagnostic(store, "row_count", v2, author="agent", reason="report the count", parent_sha256=a.sha256)
    assert b.parent_sha256 == a.sha256
    revs = store.user_diagnostics("row_count")
    assert [m.sha256 for m, _ in revs] == [a.sha256, b.sha256]
    assert [s for _, s in revs] == [v1, v2]

    with pytest.raises(UserCodeError, match="line 1, col .*SyntaxError"):
        save_user_diagnostic(store, "row_count", "def diagnose(r, m)\n", author="a", reason="broken one")
    with pytest.raises(UserCodeError, match="no top-level"):
        save_user_diagnostic(store, "row_count", "x = 1\n", author="a", reason="no function")
    with pytest.raises(UserCodeError, match="is not a saved revision of row_count"):
        save_user_diagnostic(store, "row_count", v2 + "\n", author="a", reason="bad parent", parent_sha256="0" * 64)
    other = save_user_diagnostic(store, "other_diag", v1 + "# other\n", author="a", reason="another one")
    with pytest.raises(UserCodeError, match="is not a saved revision of row_count"):
        save_user_diagnostic(store, "row_count", v2 + "#x\n", author="a", reason="parent of another name",
                             parent_sha256=other.sha256)
    with pytest.raises(UserCodeError, match="not saved"):
        save_user_diagnostic(store, "Bad Name", v1, author="a", reason="bad name")
    assert len(store.user_diagnostics("row_count")) == 2
