"""Fixtures every test folder may use."""

import os
from pathlib import Path
from typing import Iterator

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


@pytest.fixture(autouse=True, scope="session")
def _keep_results_latest() -> Iterator[None]:
    """`dcp-harness run` points `results/latest` of the directory it runs in at its sweep, so
    tests that run sweeps from the directory pytest runs in move it; it is put back as it was (a
    developer's `gate` without DIR still judges their own newest sweep)."""
    link = Path("results") / "latest"
    before = os.readlink(link) if link.is_symlink() else None
    yield
    if link.is_symlink() and (before is None or os.readlink(link) != before):
        link.unlink()
        if before is not None:
            link.symlink_to(before)
