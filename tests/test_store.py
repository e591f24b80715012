import json
import os
import subprocess
import sys

import polars as pl
import pytest

from evotrainer import evidence, schema
from evotrainer.errors import CorruptTableError, SchemaVersionError, StoreError
from evotrainer.store import Store
from evotrainer.testing import synthetic_rollouts


def _append(store, version="v000", split="train", step=1, n_groups=3, g=4, **kw):
    df = synthetic_rollouts(store.campaign.name, version, split, step, n_groups, g, **kw)
    return store.append_rollouts(version, split, step, df), df


def test_append_and_lazy_read_subsets(store):
    for v in ("v000", "v001"):
        for step in range(1, 6):
            _append(store, v, "train", step)
        _append(store, v, "val", 5)
    lf = store.rollouts()
    assert isinstance(lf, pl.LazyFrame)
    assert lf.select(pl.len()).collect().item() == 2 * (5 * 12 + 12)
    sub = store.rollouts("v001", "train", steps=(2, 4), columns=["step", "reward"]).collect()
    assert sub.columns == ["step", "reward"]
    assert sorted(sub["step"].unique().to_list()) == [2, 3, 4]
    assert sub.height == 3 * 12
    # pruning: the step range selects files by name, so only those files are scanned
    assert len(store.partition_files("rollouts", "v001", "train", (2, 4))) == 3
    assert store.steps("v000") == [1, 2, 3, 4, 5]
    val = store.rollouts(split="val").collect()
    assert set(val["split"]) == {"val"} and val["advantage"].null_count() == val.height


def test_partitions_are_append_only(store):
    path, df = _append(store, step=1)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="append-only"):
        store.append_rollouts("v000", "train", 1, df)
    assert path.read_bytes() == before


def test_contract_violations_are_refused_and_nothing_written(store):
    df = synthetic_rollouts("test", "v000", "train", 1, 2, 4)
    with pytest.raises(StoreError, match="lack required columns"):
        store.append_rollouts("v000", "train", 1, df.drop("advantage"))
    with pytest.raises(StoreError, match="another partition"):
        store.append_rollouts("v000", "train", 2, df)
    with pytest.raises(StoreError, match="wrong type"):
        store.append_rollouts("v000", "train", 1, df.with_columns(pl.lit("x").alias("reward")))
    with pytest.raises(StoreError, match="repeat a rollout_uid"):
        store.append_rollouts("v000", "train", 1, pl.concat([df, df]))
    assert store.partition_files("rollouts") == []
    assert not list(store.root.rglob("*.tmp"))


def test_reward_component_columns_vary_across_versions(store):
    _append(store, "v000", step=1)
    df = synthetic_rollouts("test", "v001", "train", 1, 2, 4).with_columns(pl.lit(0.5).alias("r.length"))
    store.append_rollouts("v001", "train", 1, df)
    both = store.rollouts(columns=None).collect()
    assert "r.length" in both.columns
    assert both.filter(pl.col("version") == "v000")["r.length"].null_count() == 12


def test_corrupt_parquet_named_in_one_line_error_and_doctor_quarantines(store):
    _append(store, step=1)
    path, _ = _append(store, step=2)
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorruptTableError) as err:
        store.rollouts("v000").collect()
    msg = str(err.value)
    assert "step=000002.parquet" in msg and "\n" not in msg and "quarantine" in msg
    # a step range that excludes the bad file still reads
    assert store.rollouts("v000", steps=(1, 1)).collect().height == 12
    bad = store.scan_for_corruption()
    assert [p.name for p, _ in bad] == ["step=000002.parquet"]
    dest = store.quarantine(path)
    assert dest.exists() and not path.exists()
    assert store.rollouts("v000").collect().height == 12


def test_ledger_append_replay_and_torn_line(store):
    store.ledger.append(schema.VersionCreated(version="v000", parent=None))
    with open(store.ledger.path, "ab") as fh:  # a writer killed mid-line
        fh.write(b'{"kind":"step_completed","vers')
    assert [e.kind for e in store.ledger.events()] == ["campaign_created", "version_created"]
    assert store.ledger.torn_lines == 1
    store.ledger.append(schema.TrainingStarted(version="v000", attempt=1))
    kinds = [e.kind for e in store.ledger.events()]
    assert kinds == ["campaign_created", "version_created", "training_started"]


def test_ledger_concurrent_appends_from_processes(store):
    code = (
        "import sys; from evotrainer.store import Store; from evotrainer import schema\n"
        "s = Store.open(sys.argv[1])\n"
        "for i in range(200): s.ledger.append(schema.StepCompleted(version='v000', step=i, n_rollouts=1,"
        " reward_mean=0.0, correct_mean=0.0, seconds=0.0, actor=sys.argv[2]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    procs = [subprocess.Popen([sys.executable, "-c", code, str(store.root), f"w{i}"], env=env) for i in range(3)]
    assert all(p.wait() == 0 for p in procs)
    events = store.ledger.events()
    assert len(events) == 1 + 600 and store.ledger.torn_lines == 0


def test_documents_are_frozen_and_versioned(store, tmp_path):
    reopened = Store.open(store.root)
    assert reopened.campaign == store.campaign
    with pytest.raises(Exception):
        store.campaign.name = "other"  # frozen
    raw = json.loads((store.root / "campaign.json").read_text())
    assert raw["schema_version"] == schema.SCHEMA_VERSION


@pytest.mark.parametrize("found,needle", [(99, "newer"), (0, "no migration")])
def test_campaign_of_another_schema_version_refused_untouched(store, found, needle):
    path = store.root / "campaign.json"
    raw = json.loads(path.read_text())
    raw["schema_version"] = found
    path.write_text(json.dumps(raw))
    before = path.read_bytes()
    with pytest.raises(SchemaVersionError, match=needle) as err:
        Store.open(store.root)
    assert "\n" not in str(err.value)
    assert path.read_bytes() == before


def test_migration_path_is_applied(store, monkeypatch):
    from evotrainer import migrations

    path = store.root / "campaign.json"
    raw = json.loads(path.read_text())
    raw["schema_version"] = 0
    raw["old_name"] = raw.pop("name")
    path.write_text(json.dumps(raw))

    def v0_to_v1(doc):
        doc["name"] = doc.pop("old_name")
        doc["schema_version"] = 1
        return doc

    monkeypatch.setitem(migrations.DOCUMENT_MIGRATIONS, 0, v0_to_v1)
    assert Store.open(store.root).campaign.name == "test"


def test_abandon_moves_partitions_after_step(store):
    for step in (1, 2, 3):
        _append(store, step=step)
        store.append_metrics("v000", step, {"loss": 0.1 * step}, "trl")
    moved, where = store.abandon_steps_after("v000", 1, "crash test")
    assert moved == [2, 3]
    assert store.steps("v000") == [1]
    assert (store.root / where / "REASON.txt").exists()
    assert len(list((store.root / where).rglob("*.parquet"))) == 4
    _append(store, step=2)  # the resumed run can write step 2 again
    assert store.steps("v000") == [1, 2]


def test_version_lock_is_exclusive(store):
    with store.version_lock("v000"), pytest.raises(StoreError, match="being trained by another process"):
        with store.version_lock("v000"):
            pass
    with store.version_lock("v000"):
        pass


def test_version_names_are_validated(store):
    with pytest.raises(ValueError):
        store.version_dir("../../etc")


def test_avg_at_k_and_per_item_scores():
    df = pl.DataFrame({
        "version": ["v000"] * 6, "step": [3] * 6, "item_id": ["a", "a", "b", "b", "c", "c"],
        "correct": [True, False, True, True, False, False], "reward": [1.0, 0, 1, 1, 0, 0],
    })
    items = evidence.per_item_scores(df)
    assert items["score"].to_list() == [0.5, 1.0, 0.0]
    avg = evidence.avg_at_k(df)
    assert avg["avg_at_k"].item() == pytest.approx(0.5) and avg["k"].item() == 2 and avg["n_items"].item() == 3


def test_store_files_are_readable_by_others(store):
    path, _ = _append(store, step=1)
    assert path.stat().st_mode & 0o044 == 0o044
    assert (store.root / "campaign.json").stat().st_mode & 0o044 == 0o044


def test_abandon_moves_unacknowledged_val_into_the_same_attempt(store):
    for step in (1, 2):
        _append(store, step=step)
    _append(store, split="val", step=1)
    moved, where = store.abandon_steps_after("v000", 1, "resume", also_val_steps=[1])
    assert moved == [1, 2]
    assert store.steps("v000") == [1] and store.steps("v000", "val") == []
    attempts = list((store.version_dir("v000") / "abandoned").iterdir())
    assert [a.name for a in attempts] == ["attempt-1"] and where.endswith("attempt-1")
    assert len(list(attempts[0].rglob("*.parquet"))) == 2
