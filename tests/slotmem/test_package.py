"""harness.slotmem's public surface: both halves in ``__all__``, the planner importable without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import harness
import harness.slotmem as slotmem


def test_every_exported_name_resolves() -> None:
    assert len(set(slotmem.__all__)) == len(slotmem.__all__)
    assert set(slotmem._CAPTURE_API) <= set(slotmem.__all__)
    for name in ("plan_pipeline", "SlotRecord", "PlanError", "make_graphed_callables", "capture_plan",
                 "make_ordinary_graphed_callables", "SlotGraphs", "CaptureError", "AllocatorUnsupported"):
        assert name in slotmem.__all__
    for name in slotmem.__all__:
        assert getattr(slotmem, name) is not None, name
    from harness.slotmem.capture import make_graphed_callables

    assert slotmem.make_graphed_callables is make_graphed_callables
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        slotmem.nope  # noqa: B018


def test_importing_the_planner_does_not_import_torch() -> None:
    code = (
        "import sys, harness.slotmem, harness.slotmem.plan; harness.slotmem.plan_pipeline(2, 2, 4, (1, 2)); "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    root = Path(harness.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
