"""Fixtures every test folder may use."""

from pathlib import Path

import pytest

from tests.browser import browser  # noqa: F401  (the headless Chromium of page tests)
from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the cluster of slurm-marked tests)


@pytest.fixture(autouse=True)
def _own_history_database(tmp_path_factory: pytest.TempPathFactory,
                          monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test (and every process it starts) records sweeps into a history database of its
    own, never the default ``results/history.sqlite`` of the directory pytest runs from; a test of
    the default itself deletes the variable."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    monkeypatch.setenv("DCP_HARNESS_HISTORY", str(path))
    return path
