"""A real sweep that runs in seconds on any CPU: a command case whose trainer (no torch) prints
Megatron-LM's iteration lines, run through ``python -m harness run`` in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
TRAINER = """\
import sys
iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
for i in range(1, iters + 1):
    print(f" iteration {i:8d}/{iters:8d} | elapsed time per iteration (ms): 10.0 | learning rate: "
          f"3.0E-03 | lm loss: {4.0 - 0.1 * i:.6E} | grad norm: 1.0 | number of skipped "
          "iterations:   0 | number of nan iterations:   0 |", flush=True)
"""
CASE = """\
name: {name}
resources: {{gpus_per_node: 1, time_min: 3}}
train: {{steps: 3, global_batch: 4, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [python, train.py, --train-iters, "{{steps}}"]
  env: {{OMP_NUM_THREADS: "1"}}
  metrics: {{source: megatron_log}}
compare:
  repeat: {{loss: exact}}
"""


def quick_case(folder: Path, name: str = "quick") -> Path:
    """The case file (and its trainer) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAINER)
    case = folder / "case.yaml"
    case.write_text(CASE.format(name=name))
    return case


def run_quick(case: Path, args: Sequence[str] = (), cwd: Path | None = None
              ) -> subprocess.CompletedProcess:
    """``dcp-harness run CASE ARGS...`` in ``cwd`` (its exit code asserted 0)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "harness", "run", str(case), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done
