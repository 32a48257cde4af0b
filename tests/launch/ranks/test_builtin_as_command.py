"""The built-in workload run as a command case (examples/builtin/train.py, the record API) gives
the built-in case's losses, grad norms and verdict, bitwise: both through `dcp-harness run` on
CPU, two gloo ranks, DCP{1,2} vs fixed CP2 and the one-rank reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BUILTIN = REPO / "examples" / "builtin" / "workload.yaml"
COMMAND = REPO / "cases" / "command" / "builtin-workload.yaml"
ARMS = {"dcp": [0, 1], "fixed-cp2": [0, 1], "reference": [0]}
SERIES = ("loss", "grad_norm", "aux_loss", "lr", "tokens")


def run(case: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (case_dir,) = [p.parent for p in out.glob("*/verdict.json")]
    records = {(arm, rank): [json.loads(line) for line in
                             (case_dir / arm / f"rank{rank}.jsonl").read_text().splitlines()]
               for arm, ranks in ARMS.items() for rank in ranks}
    return {"records": records, "verdict": json.loads((case_dir / "verdict.json").read_text())}


def checks(verdict: dict) -> dict:
    return {(p["pair"], c["name"]): c for p in verdict["pairs"] for c in p["checks"]}


def test_the_builtin_workload_as_a_command_case_matches_the_builtin_case(tmp_path):
    builtin, command = run(BUILTIN, tmp_path / "builtin"), run(COMMAND, tmp_path / "command")
    for key, records in builtin["records"].items():
        assert [r["step"] for r in records] == [1, 2, 3, 4], key
        for field in SERIES:  # bitwise: the same float, not merely close
            assert [r[field] for r in records] == [r[field] for r in command["records"][key]], \
                (key, field)
    b, c = builtin["verdict"], command["verdict"]
    assert b["status"] == c["status"] == "pass"
    assert [(p["pair"], p["status"]) for p in b["pairs"]] == \
        [(p["pair"], p["status"]) for p in c["pairs"]]
    b_checks, c_checks = checks(b), checks(c)
    assert b_checks.keys() == c_checks.keys()
    differ = {k for k in b_checks if b_checks[k] != c_checks[k]}
    # Only the built-in packer's rule is n/a for a command (it packs its own batches), with why.
    assert differ and all(name.endswith(".packing") for _, name in differ)
    for key in differ:
        assert b_checks[key]["applicable"] and b_checks[key]["passed"]
        assert not c_checks[key]["applicable"] and "a command packs its own" in c_checks[key]["detail"]
