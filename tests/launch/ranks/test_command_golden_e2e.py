"""Golden values of a command case end to end (the example trainer, Megatron log lines, one CPU
rank): the harness asks the command's interpreter for the environment its metrics do not carry,
so the golden file names it; a file recorded once says to record ``--repeats 3`` to show the run
repeats, and that record makes the check bitwise, as the built-in workload's; a sweep in another
environment (``NCCL_ALGO`` and a variable the command inherited) is judged with a note on the
gate and in summary.md; a golden arm moved to another arm is an error naming both arms and the
command that re-records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"


def _case(tmp_path: Path) -> Path:
    path = tmp_path / "cases" / "gold.yaml"
    (path.parent / "golden" / "gold").mkdir(parents=True, exist_ok=True)
    path.write_text(f"""\
name: gold
resources: {{gpus_per_node: 1, time_min: 3}}
train: {{steps: 3, global_batch: 8, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [python, {TRAINER}, --train-iters, "{{steps}}", --log-interval, "1"]
  env: {{OMP_NUM_THREADS: "1"}}
  metrics: {{source: megatron_log, tags: {{aux_loss: z_loss}}}}
compare:
  golden: {{arm: eager, step_time: null}}
""")
    return path


def _loss(out: Path) -> dict:
    verdict = json.loads((out / "gold" / "verdict.json").read_text())
    (pair,) = [p for p in verdict["pairs"] if p["contract"] == "golden"]
    return {c["name"]: c for c in pair["checks"]}["loss"]


@pytest.mark.slow
def test_command_golden_values_name_their_environment_and_arm(tmp_path: Path, monkeypatch,
                                                              capsys) -> None:
    for name in ("NCCL_ALGO", "TRAINER_LR_SCALE", "DCP_TEST_FLAG"):
        monkeypatch.delenv(name, raising=False)
    case, out = _case(tmp_path), tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    assert main(["golden", "record", str(out)]) == 0, capsys.readouterr().out
    path = tmp_path / "cases" / "golden" / "gold" / "golden_values_cpu.json"
    entry = json.loads(path.read_text())["lm loss"]
    assert entry["arm"] == "eager" and entry["inherited_env"]["OMP_NUM_THREADS"] == "1"
    assert entry["environment"]["kernels"]["intra_op_threads"] == "1"  # the command's, probed
    assert "its metrics name no environment; " in (out / "gold" / "eager" / "log.txt").read_text()

    # Recorded once: not known to repeat; the detail says what to run, and running it works.
    assert main(["run", str(case), "--out", str(out)]) == 0  # judged again, the arm not re-run
    detail = _loss(out)["detail"]
    assert ("no repeats in the golden file show that it repeats (`dcp-harness golden record "
            f"{out} --case gold --platform cpu --repeats 3` to show it)") in detail
    assert main(["golden", "record", str(out), "--case", "gold", "--platform", "cpu",
                 "--repeats", "3"]) == 0, capsys.readouterr().out

    # Another shell: NCCL_ALGO (a setting the records name) and an inherited variable differ;
    # NCCL_ALGO picks no CPU kernel, so the check is bitwise, and the gate notes both.
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("DCP_TEST_FLAG", "on")
    out2 = tmp_path / "out2"
    assert main(["run", str(case), "--out", str(out2)]) == 0
    loss = _loss(out2)
    assert loss["passed"] and loss["bound"] == 0.0, loss
    assert ("bitwise: a deterministic run repeats its golden values with the kernels they were "
            "recorded with") in loss["detail"]
    assert "the golden file's 3 repeats agreed bitwise" in loss["detail"]
    assert loss["detail"].endswith("; recorded in another environment: NCCL_ALGO (unset) -> Tree")
    capsys.readouterr()
    assert main(["gate", str(out2)]) == 0
    gate = capsys.readouterr().out
    assert ("NOTE  gold / golden: arm 'eager' ran in another environment than its golden values "
            "(golden_values_cpu.json) were recorded in: NCCL_ALGO (unset) -> Tree; no "
            "DCP_TEST_FLAG (golden) vs DCP_TEST_FLAG=on (this sweep)") in gate
    summary = (out2 / "summary.md").read_text()
    assert "> **note**: gold / golden: arm 'eager' ran in another environment" in summary

    # The golden arm moved (here: the file was recorded from the graph arm, the case now judges
    # its eager arm): an error naming both and the command that re-records; no arm runs again.
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({m: {**e, "arm": "graph"} for m, e in doc.items()}))
    assert main(["run", str(case), "--out", str(out)]) == 2
    capsys.readouterr()
    assert main(["gate", str(out)]) == 2
    gate = capsys.readouterr().out
    assert ("ERROR gold / golden: contract 'golden' could not be evaluated: " in gate
            and "the golden values were recorded from arm 'graph', but compare.golden.arm judges "
            "arm 'eager' (the golden arm moved)" in gate)
    assert f"`dcp-harness golden record {out} --case gold --platform cpu`" in gate
