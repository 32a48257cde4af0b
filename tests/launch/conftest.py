from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.launch.faults import FAULT_ENV, PATCH_ENV

TINY = {
    "tags": ["test"],
    "model": {"preset": "tiny", "layers": 2},
    "train": {"steps": 3, "global_batch": 4, "seq_length": 64, "lr": 1.0e-3, "seed": 1},
    "data": {"lengths": {"min": 8, "max": 64}},
    "resources": {"gpus_per_node": 1, "time_min": 2},
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def write_case(tmp_path: Path) -> Callable[..., Path]:
    """write_case(name, **sections) -> path of a tiny CPU case file (sections merged into TINY)."""
    folder = tmp_path / "cases"
    folder.mkdir(exist_ok=True)

    def write(name: str, **sections) -> Path:
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(_merge({"name": name, **TINY}, sections), sort_keys=False))
        return path

    return write


@pytest.fixture(autouse=True)
def _no_inherited_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.delenv(PATCH_ENV, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
