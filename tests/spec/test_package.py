"""harness.spec's public surface, and that it stays a leaf: no torch, and nothing else of harness
but the pure-Python schedule rules of the core (``harness.slotmem.schedule``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import harness
import harness.spec


def test_exports() -> None:
    assert set(harness.spec.__all__) == {"load_cases", "select_cases", "Case", "CaseFile",
                                         "PRESETS", "Problem", "preflight", "resolve_model"}
    assert all(hasattr(harness.spec, name) for name in harness.spec.__all__)
    assert set(harness.spec.PRESETS) == {"qwen3-30b-a3b", "tiny"}


def test_importing_spec_does_not_import_torch() -> None:
    code = (
        "import sys, harness.spec; "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') "
        "or (m.startswith('harness.') and m.split('.')[1] not in ('spec', 'errors', 'slotmem'))); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    root = Path(harness.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
