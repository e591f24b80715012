"""The kernel-resident controller: non-blocking, survives kernel restarts, every action in Python."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evotrainer.lab import Lab, LabError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(data_dir, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_DATA", str(data_dir))
    return dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT))


def _ledger(lab, kind):
    return [e for e in lab.store.ledger.events() if e.kind == kind]


def test_cells_stay_responsive_while_a_campaign_trains(tmp_path, env):
    lab = Lab.start(tmp_path / "camp", preset="smoke", versions=2)
    try:
        assert lab.running
        t0 = time.perf_counter()
        total = sum(i * i for i in range(10_000))  # "a cell that computes something trivial"
        snapshot = lab.summary()
        elapsed = time.perf_counter() - t0
        assert total == 333283335000 and "campaign camp" in snapshot
        assert elapsed < 1.0, f"a trivial cell took {elapsed:.2f}s while training in the background"
        lab.wait(timeout=300)
        st = lab.status()
        assert sorted(st.versions) == ["v000", "v001"] and all(v.state.value == "trained" for v in st.versions.values())
    finally:
        lab.stop()


def test_kernel_restart_reattach_shows_identical_state_and_training_goes_on(tmp_path, env):
    camp = tmp_path / "camp"
    kernel = textwrap.dedent(f"""
        import sys, time
        from evotrainer.lab import Lab
        lab = Lab.start({str(camp)!r}, preset="smoke", versions=2)
        print("started", flush=True)
        time.sleep(600)  # the 'kernel' idles; it is killed (restarted) by the test
    """)
    proc = subprocess.Popen([sys.executable, "-c", kernel], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    # wait until the first version is training, then 'restart the kernel'
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((camp / "versions").glob("v000/rollouts/split=train/*.parquet")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lab = Lab.attach(camp)
    assert lab.running, "the campaign must not die with the kernel"
    lab.wait(timeout=300)
    st = lab.status()
    assert sorted(st.versions) == ["v000", "v001"] and all(v.state.value == "trained" for v in st.versions.values())
    # two fresh 'kernels' attaching to the same campaign see identical state
    show = "from evotrainer.lab import Lab; import sys; print(Lab.attach(sys.argv[1]).summary())"
    a = subprocess.run([sys.executable, "-c", show, str(camp)], env=env, cwd=ROOT, capture_output=True, text=True)
    b = subprocess.run([sys.executable, "-c", show, str(camp)], env=env, cwd=ROOT, capture_output=True, text=True)
    assert a.returncode == 0 and a.stdout == b.stdout == lab.summary() + "\n"


def test_gates_and_proposals_answered_from_python(tmp_path, env):
    lab = Lab.start(tmp_path / "camp", preset="smoke", versions=2, gates=("design", "completion"))
    lab.wait(timeout=300)
    assert lab.gate is not None and lab.gate.gate == "completion" and lab.gate.version == "v000"
    assert lab.proposals == []  # nothing proposed before v000 is accepted
    lab.gate.approve(reason="baseline ok", who="alice")
    lab.resume()
    lab.wait(timeout=300)
    gate = lab.gate
    assert gate.gate == "design" and gate.version == "v001"
    props = lab.proposals
    assert len(props) >= 2 and all(p.version == "v001" for p in props) and "Proposal" in repr(props[0])
    chosen = props[1]
    chosen.approve(reason="the data finding is the bottleneck", who="bob")
    with pytest.raises(LabError, match="not waiting"):  # the gate is answered: a second answer is refused
        props[0].approve(reason="changed my mind", who="bob")
    lab.resume()
    lab.wait(timeout=300)
    assert lab.gate.gate == "completion" and lab.gate.version == "v001"
    assert lab.store.read_version("v001").intervention == chosen.intervention.intervention_id
    answers = [(e.gate, e.answer, e.actor, e.reason) for e in _ledger(lab, "gate_answered")]
    assert answers == [("completion", "approve", "alice", "baseline ok"),
                       ("design", "revise", "bob", "the data finding is the bottleneck")]
    # a person's own intervention at a later gate, written in a cell
    mine = lab.intervention(
        change={"factor": "hparam", "name": "temperature", "value": 0.8},
        hypothesis={"if": "we sample colder", "then": "fewer format violations", "because": "less noise"},
        target_metric="avg_at_k", success_criterion={"metric": "avg_at_k", "op": ">", "threshold": 0},
        rollback_plan="temperature 1.0", author="carol")
    assert mine.parent == lab.loop_state().best()
    lab.gate.revise(outcome="reject", reason="too few items to trust", who="carol")
    assert lab.loop_state().loop("v001").outcome == "reject"


def test_pause_resume_and_stop(tmp_path, env):
    lab = Lab.start(tmp_path / "camp", preset="smoke", versions=3)
    lab.pause()
    lab.wait(timeout=300)  # stops cleanly at the next phase boundary
    done = [v for v, s in lab.status().versions.items() if s.state.value == "trained"]
    assert len(done) < 3 and not lab.running
    log = lab.store.controller_log().read_text()
    assert "paused between phases" in log
    lab.resume()
    assert lab.running or len(lab.status().versions) == 3
    lab.stop()
    assert not lab.running
    lab.resume()
    lab.wait(timeout=300)
    st = lab.status()
    assert sorted(st.versions) == ["v000", "v001", "v002"] and all(v.state.value == "trained" for v in st.versions.values())
    # one controller per campaign: a second one is refused with a clear message
    lab.store.request_pause(False)
    with lab.store.controller_lock():
        res = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", "--campaign", str(lab.store.root),
                              "--resume", "--versions", "4"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "already being run by process" in res.stderr
    assert json.loads((lab.store.root / "campaign.json").read_text())["name"] == "camp"
