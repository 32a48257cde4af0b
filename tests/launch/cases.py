"""Case files for the launch tests, from one factory: a tiny CPU case (``TINY``) with the sections
a test cares about merged in, written as YAML the way users write case files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.errors import ConfigError
from harness.spec import load_cases
from harness.spec.schema import Case

TINY: dict[str, Any] = {
    "tags": ["test"],
    "model": {"preset": "tiny", "layers": 2},
    "train": {"steps": 3, "global_batch": 4, "seq_length": 64, "lr": 1.0e-3, "seed": 1},
    "data": {"lengths": {"min": 8, "max": 64}},
    "resources": {"gpus_per_node": 1, "time_min": 2},
}
REPEAT = {"repeat": {"loss": "exact"}}  # compare: the same arm twice, bitwise
UNIFORM = {"lengths": {"distribution": "uniform"}}  # data: uniform sequence lengths


def merged(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, section by section (a value replaces, a dict merges)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def case_doc(name: str, **sections: Any) -> dict:
    """The case file of ``name``: ``TINY`` with ``sections`` merged in."""
    return merged({"name": name, **TINY}, sections)


def write_case_file(folder: Path, name: str, **sections: Any) -> Path:
    """Write ``<folder>/<name>.yaml`` (:func:`case_doc`) and return its path. A case declaring
    ``compare.golden`` gets its golden folder, empty (no values recorded yet), as a user creates
    it: a missing one is an error."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(case_doc(name, **sections), sort_keys=False))
    if "golden" in (sections.get("compare") or {}):
        try:
            cases = load_cases([path])
        except ConfigError:  # a case a test wants refused: its golden folder does not matter
            cases = []
        for case in cases:
            if case.compare.golden is not None:
                (path.parent / case.compare.golden.dir / case.id).mkdir(parents=True, exist_ok=True)
    return path


def load_case_file(folder: Path, name: str, **sections: Any) -> Case:
    """The one case (no matrix) of a case file written by :func:`write_case_file`."""
    (case,) = load_cases([write_case_file(folder, name, **sections)])
    return case
