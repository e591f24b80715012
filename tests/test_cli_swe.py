"""`evotrainer swe list|build` through the real CLI (offline: a tiny local instance, no download)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from evotrainer.envs.swe.instance import SweInstance, instance_dir
from evotrainer.envs.swe.toy import build_clamp_instance

ROOT = Path(__file__).resolve().parent.parent


def build_instance(cache: Path) -> SweInstance:
    return build_clamp_instance(instance_dir(cache, "calc-000000000001"))[0]


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
    assert row.split() == [inst.instance_id, "calc", "0.1", "calc/ops.py", "2", "1"]
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
