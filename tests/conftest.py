import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def store(tmp_path):
    from evotrainer.testing import temp_store

    return temp_store(tmp_path / "camp")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """An EVOTRAINER_DATA for subprocess tests; the tiny policy is built once per session there."""
    return tmp_path_factory.mktemp("evodata")
