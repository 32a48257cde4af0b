"""Helpers for the spec tests: write case files under tmp_path, build Case objects directly."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from harness.spec.presets import resolve_model
from harness.spec.schema import Case, CaseFile

# A valid fixed-CP case: 2 ranks, cp 2 -> dp 1.
GOOD_FIXED = """\
name: fixed-cp2
tags: [focused, cpu]
model: {preset: tiny, layers: 4}
parallel: {pp: 1, cp: 2}
train:
  steps: 3
  global_batch: 4
  seq_length: 128
  lr: 1.0e-3
data:
  lengths: {distribution: uniform, min: 8, max: 128}
compare:
  repeat: {loss: exact}
resources: {gpus_per_node: 2}
"""

# A valid dynamic-CP case: 4 ranks, pp 2 -> dp_cp 2.
GOOD_DCP = """\
name: dcp-pp2
tags: [dcp]
model: {preset: tiny, layers: 8}
parallel: {pp: 2, ep: 2, dynamic_cp: [1, 2]}
train: {steps: 2, global_batch: 8, seq_length: 256, max_seqlen_per_rank: 128, lr: 1.0e-3}
data: {lengths: {min: 16, max: 256}}
compare:
  dcp_vs_fixed_cp: {fixed_cp: 2}
resources: {gpus_per_node: 4}
"""


@pytest.fixture
def write_case(tmp_path: Path) -> Callable[..., Path]:
    """write_case(text, name="case.yaml") -> path of the written file (text is dedented)."""

    def write(text: str, name: str = "case.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


def build_case(**sections: Any) -> Case:
    """A Case from case-file sections (defaults: a valid 1-rank tiny case), no preflight."""
    raw: dict[str, Any] = {
        "name": "t",
        "train": {"steps": 1, "global_batch": 4, "seq_length": 128, "lr": 1e-3},
        "data": {"lengths": {"min": 8, "max": 128}},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    spec = CaseFile.model_validate(raw)
    return Case(
        id=spec.name, name=spec.name, source="<test>", tags=tuple(spec.tags),
        model=resolve_model(spec.model), parallel=spec.parallel, train=spec.train,
        data=spec.data, compare=spec.compare, resources=spec.resources, graphs=spec.graphs,
        shapes=spec.shapes,
    )
