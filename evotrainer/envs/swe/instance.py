"""The SWE task data model: one injected-bug instance of a real project, and its on-disk layout.

    data/swe/instances/<instance_id>/instance.json   the SweInstance
    data/swe/instances/<instance_id>/repo/           the repo TEMPLATE (a git repo, two commits)

The template's history is "initial import" (the ORIGINAL, correct source) followed by
"refactor <module>" (the bug-introducing commit, i.e. the buggy working tree). So `git log -p` /
`git show HEAD` in a materialized copy reveals the fix: the paper's git leak. `materialize(...,
clear_git_log=True)` instead gives a fresh repo with ONE commit of the buggy state.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

INSTANCE_JSON = "instance.json"
REPO_DIR = "repo"
# Fixed identity and dates so that every git object (and so every commit id) is reproducible.
GIT_DATE = "2024-01-01T00:00:00+00:00"
GIT_ENV = {"GIT_AUTHOR_NAME": "EvoTrainer", "GIT_AUTHOR_EMAIL": "swe@evotrainer.invalid",
           "GIT_COMMITTER_NAME": "EvoTrainer", "GIT_COMMITTER_EMAIL": "swe@evotrainer.invalid",
           "GIT_AUTHOR_DATE": GIT_DATE, "GIT_COMMITTER_DATE": GIT_DATE,
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


class SweInstance(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_id: str  # "<project>-<12 hex of sha256(project, version, file, mutation)>"
    project: str
    version: str
    problem_statement: str  # from the failing tests: names + assertion messages, no fix hints
    fail_to_pass: tuple[str, ...]  # pytest node ids failing with the bug, passing with the fix
    pass_to_pass: tuple[str, ...]  # node ids passing both ways (a sample, capped ~30)
    gold_patch: str  # unified diff (a/ b/ paths) from buggy to fixed
    mutated_file: str  # repo-relative path
    mutation: str  # e.g. "Compare: '<' -> '<=' at line 42 in func foo"
    test_command: tuple[str, ...]  # argv, run in the repo root
    seed: int


def instance_dir(cache_root: Path, instance_id: str) -> Path:
    """data/swe/instances/<id>/ for cache_root = data/swe."""
    return Path(cache_root) / "instances" / instance_id


def load_instance(dir: Path) -> tuple[SweInstance, Path]:
    """(instance, path of the repo TEMPLATE dir)."""
    d = Path(dir)
    inst = SweInstance.model_validate(json.loads((d / INSTANCE_JSON).read_text(encoding="utf-8")))
    repo = d / REPO_DIR
    if not (repo / ".git").is_dir():
        raise FileNotFoundError(f"{repo} is not a git repo template")
    return inst, repo


def save_instance(inst: SweInstance, dir: Path) -> Path:
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / INSTANCE_JSON).write_text(json.dumps(inst.model_dump(mode="json"), indent=1, sort_keys=True) + "\n",
                                   encoding="utf-8")
    return d


def git(args: list[str], cwd: Path, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Trusted git (our own process, not the sandbox) with fixed identity/dates and no user config."""
    env = {**os.environ, **GIT_ENV, "HOME": str(cwd)}
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false",
                           "-c", "core.autocrlf=false", *args], cwd=str(cwd), env=env, check=check,
                          capture_output=True, text=True, input=input)


def commit_all(repo: Path, message: str) -> str:
    git(["add", "-A", "."], repo)
    git(["commit", "-q", "--no-verify", "-m", message], repo)
    return git(["rev-parse", "HEAD"], repo).stdout.strip()


def materialize(instance_dir: Path, dest: Path, *, clear_git_log: bool) -> Path:
    """Copy the template repo to `dest` (created; must not exist or be empty) and return it.

    clear_git_log=False: the full two-commit history comes along (the fix is readable via git).
    clear_git_log=True: dest gets a fresh repo with ONE commit of the buggy state.
    """
    _, template = load_instance(Path(instance_dir))
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    if clear_git_log:
        shutil.copytree(template, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        git(["init", "-q", "."], dest)
        commit_all(dest, "initial import")
    else:
        shutil.copytree(template, dest, dirs_exist_ok=True)
    return dest
