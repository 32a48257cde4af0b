"""The repeat arm's processes start otherwise than the first arm's in everything the numbers must
not depend on (``harness.launch.ranks.variation``): a result that depends on the hash seed fails
the repeat pair in one sweep; each varied part is seen by the rank processes themselves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.cli import main
from harness.launch.ranks.processes import RankCommand, run_ranks
from harness.launch.ranks.variation import FIRST, PROC_DIR, VARIED
from harness.spec.names import REPEAT_SUFFIX

from tests.launch.cases import REPEAT, write_case_file

PROBE = """
import json, os, sys, tempfile
rank = int(os.environ["RANK"])
json.dump({"seed": os.environ.get("PYTHONHASHSEED"), "cwd": os.getcwd(),
           "tmp": tempfile.gettempdir(), "first_env": next(iter(os.environ)),
           "pid": os.getpid()}, open(sys.argv[1] + f"/seen{rank}.json", "w"))
"""


def seen(tmp_path: Path, variation) -> dict[int, dict]:
    arm = tmp_path / ("varied" if variation is VARIED else "first")
    arm.mkdir()
    cmd = RankCommand(argv=(sys.executable, "-c", PROBE, str(arm)), world_size=2, arm_dir=arm,
                      timeout_s=60, env={"CUDA_VISIBLE_DEVICES": ""}, variation=variation)
    assert run_ranks(cmd).status == "ok"
    return {k: json.loads((arm / f"seen{k}.json").read_text()) for k in (0, 1)}


def test_the_varied_start_changes_what_must_not_matter(tmp_path: Path) -> None:
    first, varied = seen(tmp_path, FIRST), seen(tmp_path, VARIED)
    assert {s["seed"] for s in first.values()} == {"0"}
    assert {s["seed"] for s in varied.values()} == {"1"}
    assert first[0]["cwd"] == str(Path.cwd())
    assert {s["cwd"] for s in varied.values()} == {str(tmp_path / "varied" / PROC_DIR / "cwd")}
    assert {s["tmp"] for s in varied.values()} == {str(tmp_path / "varied" / PROC_DIR / "tmp")}
    assert first[0]["tmp"] != varied[0]["tmp"]
    assert first[0]["first_env"] != varied[0]["first_env"]  # the environment's order reversed
    # process ids grow in the order the processes were created: the last rank first
    assert first[0]["pid"] < first[1]["pid"] and varied[1]["pid"] < varied[0]["pid"]


def test_a_hash_order_dependence_fails_the_repeat_pair_in_one_sweep(tmp_path, monkeypatch,
                                                                     capsys) -> None:
    from tests.launch.faults import patch_env

    case = write_case_file(tmp_path / "cases", "hashorder", compare=REPEAT,
                           train={"steps": 2})
    for key, value in patch_env("hash-order-grad-norm").items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out), "--no-history"]) == 1
    verdict = json.loads((out / "hashorder" / "verdict.json").read_text())
    (pair,) = [p for p in verdict["pairs"] if p["contract"] == "repeat"]
    failed = {c["name"] for c in pair["checks"] if not c["passed"]}
    assert "grad_norm" in failed, pair["checks"]
    log = (out / "hashorder" / f"eager{REPEAT_SUFFIX}" / "log.txt").read_text()
    assert "varied start: PYTHONHASHSEED=1" in log
