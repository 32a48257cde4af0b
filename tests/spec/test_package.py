"""harness.spec's public surface, and what importing it loads: no torch, and of the rest of
harness only the comparisons (``harness.compare`` and the packages below it), which ``harness``
imports so that every case is read with their ``compare.<name>`` sections (its own modules
import nothing above floor 1: tests/test_layers.py)."""

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
        "or (m.startswith('harness.') and m.split('.')[1] not in ("
        "'spec', 'errors', 'slotmem', 'textfmt', 'results', 'graphplan', 'golden', 'environment', "
        "'compare', 'kernels'))); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    root = Path(harness.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr


def test_importing_spec_registers_every_comparison_s_section() -> None:
    code = ("import harness.spec.schema as s; print(','.join(s.CompareSpec.model_fields))")
    root = Path(harness.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert done.stdout.split() == ["repeat,graph_vs_eager,dcp_vs_fixed_cp,graph_pools,reference,"
                                   "golden,oracle,resume,slot_ring,sanity"], done.stderr
