"""The example notebooks: stored without outputs, and each runs headless, top to bottom, against a
temporary data folder and campaign, in the order a reader would run them (quickstart first).

The kernel: a kernelspec written to a temporary JUPYTER_PATH whose argv is this interpreter
(`sys.executable`), under a name no other kernelspec uses, so the notebooks run on the project's
venv whatever kernels the machine has. A probe cell checks that.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ORDER = ["quickstart.ipynb", "inspecting_rollouts.ipynb", "diagnostics_and_backtests.ipynb",
         "overriding_the_agent.ipynb", "writing_up.ipynb"]
KERNEL = "evotrainer-test-venv"
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"  # git-ignored


def test_every_notebook_is_listed_and_stored_without_outputs():
    import nbformat

    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(ORDER)
    for name in ORDER:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.get("kernelspec", {}).get("name") == "python3", name
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code, name
        for c in code:
            assert c.outputs == [] and c.execution_count is None, f"{name}: a cell has stored outputs; strip them"
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), name


def test_lab_command_help():
    res = subprocess.run([sys.executable, "-m", "evotrainer.cli", "lab", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr
    assert "--port" in res.stdout and "--no-browser" in res.stdout


def test_lab_command_serves_the_notebooks_folder_on_localhost_only(monkeypatch):
    from evotrainer import cli

    seen = {}

    class FakePopen:
        def __init__(self, cmd, env=None):
            seen["cmd"], seen["env"] = cmd, env

        def wait(self):
            return 0

    monkeypatch.setattr("subprocess.Popen", FakePopen)
    assert cli.main(["lab", "--port", "8899", "--no-browser"]) == 0
    cmd = seen["cmd"]
    assert cmd[:3] == [sys.executable, "-m", "jupyterlab"]
    assert "--ServerApp.ip=127.0.0.1" in cmd and "--ServerApp.port=8899" in cmd and "--no-browser" in cmd
    assert f"--ServerApp.root_dir={NOTEBOOKS}" in cmd
    assert str(ROOT) in seen["env"]["PYTHONPATH"].split(os.pathsep)


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory, data_dir):
    """Environment for the kernels: temp data and campaign, and a kernelspec for this interpreter."""
    base = tmp_path_factory.mktemp("nbrun")
    spec_dir = base / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "EvoTrainer test (venv)", "language": "python",
    }))
    env = {
        "JUPYTER_PATH": str(base / "jupyter"),
        "JUPYTER_DATA_DIR": str(base / "jupyter-data"),
        "JUPYTER_RUNTIME_DIR": str(base / "jupyter-runtime"),
        "IPYTHONDIR": str(base / "ipython"),
        "EVOTRAINER_DATA": str(data_dir),
        "EVOTRAINER_NOTEBOOK_CAMPAIGN": str(base / "campaigns" / "notebooks"),
        "PYTHONPATH": "",  # the kernel must find `widgets` through notebook_env.setup(), as in JupyterLab
        "MPLBACKEND": "agg",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        # a campaign a failed notebook left running must not outlive the tests
        from evotrainer.lab import Lab
        from evotrainer.store import Store

        camp = Path(env["EVOTRAINER_NOTEBOOK_CAMPAIGN"])
        if Store.exists(camp) and Lab.attach(camp).running:
            Lab.attach(camp).stop()


def _run(nb, timeout=600):
    from nbclient import NotebookClient

    client = NotebookClient(nb, kernel_name=KERNEL, timeout=timeout, allow_errors=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return nb


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            out.append(o.data.get("text/plain", ""))
            out.append(o.data.get("text/markdown", ""))
    return "".join(out)


def _all_text(nb) -> str:
    return "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")


def _mimes(nb) -> set[str]:
    return {m for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type in ("execute_result", "display_data") for m in o.data}


def test_kernel_is_this_interpreter(kernel_env):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys, os; print(sys.executable); print(os.environ['EVOTRAINER_NOTEBOOK_CAMPAIGN'])")])
    out = _text(_run(nb, timeout=120).cells[0]).split("\n")
    assert out[0] == sys.executable and out[1] == kernel_env["EVOTRAINER_NOTEBOOK_CAMPAIGN"]


@pytest.fixture(scope="module")
def executed(kernel_env):
    """Every notebook, executed in order against the same temp campaign; name -> (notebook, seconds)."""
    import nbformat

    results = {}
    for name in ORDER:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        t0 = time.perf_counter()
        try:
            _run(nb)
        except Exception as exc:  # noqa: BLE001 - name the notebook, then the failing cell and its traceback
            pytest.fail(f"{name} failed: {exc}"[:6000])
        results[name] = (nb, time.perf_counter() - t0)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # executed copies, for reading what a reader would see
        nbformat.write(nb, ARTIFACTS / name)
    print("\nnotebook execution: " + ", ".join(f"{n} {s:.0f}s" for n, (_, s) in results.items())
          + f"; total {sum(s for _, s in results.values()):.0f}s")
    return results


def test_quickstart_trains_a_gated_campaign_and_records_the_answers(executed, kernel_env):
    nb, _ = executed["quickstart.ipynb"]
    last = " ".join(_text(nb.cells[-1]).split())
    assert "v000 completion APPROVE by alice: the baseline trains and evaluates cleanly" in last
    assert ("v001 design REVISE by alice: start with the agent's top-ranked change" in last  # one of several
            or "v001 design APPROVE by alice: start with the agent's top-ranked change" in last)  # the only one
    assert "v001 completion APPROVE by alice" in last
    assert "application/vnd.jupyter.widget-view+json" in _mimes(nb)
    from evotrainer.lab import Lab

    lab = Lab.attach(kernel_env["EVOTRAINER_NOTEBOOK_CAMPAIGN"])
    st = lab.status()  # all notebooks have run by now: the first two versions are the quickstart's
    assert [st.versions[v].state.value for v in ("v000", "v001")] == ["trained", "trained"]
    assert lab.store.read_version("v001").intervention is not None


def test_inspecting_rollouts_shows_groups_items_and_queries(executed):
    nb, _ = executed["inspecting_rollouts.ipynb"]
    text = _all_text(nb)
    assert "rollouts" in text and "share correct" in text and "avg_at_k" in text and "dead_share" in text


def test_diagnostics_notebook_runs_a_user_diagnostic_and_a_backtest(executed, kernel_env):
    nb, _ = executed["diagnostics_and_backtests.ipynb"]
    text = _all_text(nb)
    assert "verdict: " in text and "Counterfactual" in text
    from evotrainer.store import Store

    store = Store.open(kernel_env["EVOTRAINER_NOTEBOOK_CAMPAIGN"])
    saved = store.user_diagnostics("boxed_share")
    assert saved and saved[-1][0].author == "alice" and "\\\\boxed" in saved[-1][1]
    # validated retrospectively, whatever the verdict: the report and the notebook say which and why
    reps = store.validations("boxed_share", saved[-1][0].sha256)
    assert reps and reps[-1].author == "alice" and reps[-1].why
    assert ("ACCEPTED" if reps[-1].accepted else "REJECTED") in text and f"why: {reps[-1].why}"[:80] in text
    assert any(iv.author == "alice" and iv.change.factor == "reward" for iv in store.interventions())


def test_overriding_notebook_leaves_who_and_why_in_the_ledger(executed, kernel_env):
    nb, _ = executed["overriding_the_agent.ipynb"]
    from evotrainer.lab import Lab

    lab = Lab.attach(kernel_env["EVOTRAINER_NOTEBOOK_CAMPAIGN"])
    answers = [e for e in lab.store.ledger.events() if e.kind == "gate_answered"]
    revised = [e for e in answers if e.gate == "design" and e.answer == "revise" and e.actor == "alice"
               and "temperature" in e.reason]
    assert revised and lab.store.read_intervention(revised[-1].intervention_id).change.factor == "hparam"
    assert lab.store.read_version(revised[-1].version).intervention == revised[-1].intervention_id
    overridden = [e for e in answers if e.gate == "completion" and e.answer == "revise" and e.actor == "alice"]
    assert len(overridden) == 1 and overridden[0].version == revised[-1].version
    gate_said = next(d.outcome for d in lab.store.decisions() if d.candidate == overridden[0].version)
    assert overridden[0].outcome != gate_said
    assert lab.loop_state().loop(overridden[0].version).outcome == overridden[0].outcome
    assert len(lab.store.versions()) == 4 and not lab.running and lab.gate is None
    assert f"effective outcome: {overridden[0].outcome}" in _all_text(nb)
    text = _all_text(nb)
    assert "skill(s) in" in text and "decided_by" in text  # section 6: the memory frame and the skill library
    assert f"campaign {lab.store.campaign.name}:" in text  # compact(): the agent's view of the memory


def test_writing_up_renders_the_report(executed, kernel_env):
    nb, _ = executed["writing_up.ipynb"]
    text = _all_text(nb)
    assert "p_wilcoxon" in text and "v003" in text
    assert "application/vnd.plotly.v1+json" in _mimes(nb)
    assert any("text/markdown" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
    camp = Path(kernel_env["EVOTRAINER_NOTEBOOK_CAMPAIGN"])
    assert (camp / "report.md").read_text().strip() and (camp / "report.html").exists()

