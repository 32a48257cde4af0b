"""bench/arm_phases.py on a finished sweep with known figures (``tests/launch/timed.py``): one row
per arm split by phase, each case's judging, the totals and the critical path."""

from __future__ import annotations

import json

from tests.benches import load_bench
from tests.launch.cases import write_case_file
from tests.launch.timed import FIXED_PER_RUN, STEP_S, finished_sweep


def test_the_table_splits_each_arm_and_adds_up(tmp_path, capsys):
    cases = [write_case_file(tmp_path / "cases", "a", compare={"repeat": {}}),
             write_case_file(tmp_path / "cases", "b", compare={"resume": {}})]
    sweep, _ = finished_sweep(tmp_path / "sweep", cases)
    assert load_bench("arm_phases").main([str(sweep), "--json", str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines()
            if line.startswith("| a") or line.startswith("| b")}
    # a one-run arm of 3 steps: 0.1 start, 0.9 imports, 0.1 rendezvous, 0.1 build, 0.3 setup,
    # 3 s of steps, 0.2 after the last (it saves a checkpoint: train.checkpoint_every 1), 0.1
    # teardown, 0.2 exit (tests/launch/timed.py)
    eager = rows["a / eager"]
    assert eager[1:6] == ["cpu", "1", "1", "3", "ok"]
    assert eager[6:17] == ["0.10", "0.90", "0.10", "0.10", "0.30", "3.00", "0.20", "0.00",
                           "0.10", "0.20", f"{FIXED_PER_RUN + 3 * STEP_S:.2f} |"]
    resumed = rows["b / eager-resumed"]  # two runs, each saving after its last step
    assert resumed[3] == "2" and resumed[12] == "0.40" and resumed[7] == "1.80"
    assert "a: judging" in rows and "b: judging" in rows
    total = 4 * FIXED_PER_RUN + 4 * 3 * STEP_S + FIXED_PER_RUN
    assert f"| arms' wall (sum) | {total:.2f} | |" in out
    assert "critical path, CPU-rank arms beside CUDA-rank arms" in out
    assert f"(lanes: cpu {total:.1f} s)" in out
    data = json.loads((tmp_path / "rows.json").read_text())
    assert [c["case_id"] for c in data] == ["a", "b"]


def test_a_folder_that_is_no_sweep_is_an_error(tmp_path, capsys):
    assert load_bench("arm_phases").main([str(tmp_path)]) == 2
    assert "holds no case folder" in capsys.readouterr().err
