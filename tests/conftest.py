import os

import pytest

os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "outputs")
