"""A command case run and gated through the CLI in processes of their own (the end-to-end tests of
command cases' guards and memory), its verdict's checks by pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def run_and_gate(case: Path, out: Path, case_id: str) -> tuple[int, str, dict]:
    """(gate's exit code, everything run and gate printed, {pair: {check name: check, "": pair}})."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out),
                          "--no-history"], env=env, capture_output=True, text=True, timeout=600)
    gate = subprocess.run([sys.executable, "-m", "harness", "gate", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    verdict = json.loads((out / case_id / "verdict.json").read_text())
    pairs = {p["pair"]: {c["name"]: c for c in p["checks"]} | {"": p} for p in verdict["pairs"]}
    return gate.returncode, run.stdout + run.stderr + gate.stdout + gate.stderr, pairs
