"""`evotrainer swe list|build` through the real CLI (offline: a tiny local instance, no download)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from evotrainer.envs.swe.build import base_test_command
from evotrainer.envs.swe.instance import SweInstance, commit_all, git, instance_dir, save_instance

ROOT = Path(__file__).resolve().parent.parent

ORIGINAL = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"
BUGGY = ORIGINAL.replace("if x < lo:", "if x > lo:")
TESTS = ("from calc.ops import clamp\n\n\ndef test_low():\n    assert clamp(-5, 0, 10) == 0\n\n\n"
         "def test_high():\n    assert clamp(50, 0, 10) == 10\n")


def build_instance(cache: Path) -> SweInstance:
    """The shape build.py writes (same as tests/test_swe_env.py's builder): commit 1 original, commit 2 the bug."""
    inst = SweInstance(instance_id="calc-000000000001", project="calc", version="0.1",
                       problem_statement="tests/test_ops.py::test_low fails",
                       fail_to_pass=("tests/test_ops.py::test_low",), pass_to_pass=("tests/test_ops.py::test_high",),
                       gold_patch="", mutated_file="calc/ops.py",
                       mutation="Compare: '<' -> '>' at line 2 in func clamp",
                       test_command=(*base_test_command(), "tests"), seed=0)
    d = instance_dir(cache, inst.instance_id)
    repo = d / "repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(ORIGINAL)
    (repo / "tests" / "test_ops.py").write_text(TESTS)
    git(["init", "-q", "."], repo)
    commit_all(repo, "initial import")
    (repo / "calc" / "ops.py").write_text(BUGGY)
    commit_all(repo, "refactor calc.ops")
    inst = inst.model_copy(update={"gold_patch": git(["diff", "HEAD", "HEAD~1"], repo).stdout})
    save_instance(inst, d)
    return inst


def cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("evotrainer: error:"), res
    return err


def test_swe_list_missing_and_empty(tmp_path):
    # the default folder (<data dir>/swe) does not exist yet: one line naming it and the fix
    err = one_line_error(cli("swe", "list", data_dir=tmp_path))
    assert str(tmp_path / "swe") in err and "evotrainer swe build" in err
    (tmp_path / "empty").mkdir()
    res = cli("swe", "list", str(tmp_path / "empty"), data_dir=tmp_path)
    assert res.returncode == 0 and "no SWE instances" in res.stdout, res


def test_swe_list_shows_instances(tmp_path):
    inst = build_instance(tmp_path / "swe")
    res = cli("swe", "list", data_dir=tmp_path)  # the default folder: <data dir>/swe
    assert res.returncode == 0, res.stderr
    header, row, total = res.stdout.strip().splitlines()
    assert header.split() == ["id", "project", "mutated", "file", "f2p", "p2p"]
    assert row.split() == [inst.instance_id, "calc", "0.1", "calc/ops.py", "1", "1"]
    assert total.startswith("1 instance(s) under") and "calc 1" in total
    # a broken instance.json is one line naming the folder
    (instance_dir(tmp_path / "swe", inst.instance_id) / "instance.json").write_text("{not json")
    err = one_line_error(cli("swe", "list", str(tmp_path / "swe"), data_dir=tmp_path))
    assert inst.instance_id in err


def test_swe_build_bad_arguments_are_one_line(tmp_path):
    out = str(tmp_path / "x")
    err = one_line_error(cli("swe", "build", "--projects", "inflection", "--out", out, data_dir=tmp_path))
    assert "name==version" in err and "'inflection'" in err
    err = one_line_error(cli("swe", "build", "--n", "0", "--out", out, data_dir=tmp_path))
    assert "--n" in err
    assert not (tmp_path / "x").exists()  # nothing downloaded or written
