"""A command case's resume pair on CPU (``compare.resume`` + ``command.resume``): the example
trainer saved after a step, stopped and loaded again, against its uninterrupted run. A good
resume passes; the trainer's seeded resume faults (a second run that ignores ``--load``, a
checkpoint without the optimizer state, a checkpoint of the wrong step) each fail the resume
pair, naming the check and the steps; a first run that does not stop is an error naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"


def _case(tmp_path: Path, fault: str = "none", metrics: str = "{source: megatron_log}",
          save: str = '--save-interval, "{stop}", --exit-interval, "{stop}"') -> Path:
    text = f"""\
name: resume
resources: {{gpus_per_node: 1, time_min: 3}}
train: {{steps: 4, global_batch: 8, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [python, {TRAINER}, --train-iters, "{{steps}}", --fault, {fault},
         --tensorboard-dir, "{{arm_dir}}/tensorboard"]
  env: {{OMP_NUM_THREADS: "1"}}
  resume:
    save: [--save, "{{arm_dir}}/ckpt", {save}]
    load: [--load, "{{arm_dir}}/ckpt"]
    iteration_file: "{{arm_dir}}/ckpt/latest_checkpointed_iteration.txt"
  metrics: {metrics}
compare:
  resume: {{at_step: 2, loss: exact, grad_norm: exact}}
"""
    path = tmp_path / f"{fault}.yaml"
    path.write_text(text)
    return path


def _run(case: Path, out: Path) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600)
    verdict = json.loads((out / "resume" / "verdict.json").read_text())
    return run.returncode, verdict, run.stdout + run.stderr


def _checks(verdict: dict) -> dict[str, dict]:
    (pair,) = [p for p in verdict["pairs"] if p["contract"] == "resume"]
    return {c["name"]: c for c in pair["checks"]}


@pytest.mark.slow
def test_a_good_resume_passes_and_each_seeded_resume_fault_fails_naming_it(tmp_path: Path
                                                                           ) -> None:
    code, verdict, text = _run(_case(tmp_path, metrics="{source: tensorboard}"),
                               tmp_path / "good")
    assert code == 0, text
    checks = _checks(verdict)
    assert all(c["passed"] for c in checks.values()), checks
    assert checks["resumed_after"]["detail"].startswith("every rank's step 3 came from a process "
                                                        "that loaded the checkpoint of step 2")
    log = (tmp_path / "good" / "resume" / "eager-resumed" / "log.txt").read_text()
    assert "--exit-interval 2" in log and "--load" in log  # both runs, as the case says

    # --load ignored: the losses after the stop match (the same seed), the guard does not.
    code, verdict, _ = _run(_case(tmp_path, "resume-from-zero"), tmp_path / "zero")
    checks = _checks(verdict)
    assert code == 1 and verdict["status"] == "fail"
    assert checks["loss"]["passed"]  # the reason the guard exists
    assert not checks["resumed_after"]["passed"]
    assert "step 3 was written by a process that started from step 1" in \
        checks["resumed_after"]["detail"]

    # No optimizer state in the checkpoint: step 3 is the same, the steps after it are not
    # (TensorBoard's per-iteration values: every step after the stop compared bitwise).
    code, verdict, _ = _run(_case(tmp_path, "resume-no-optimizer", "{source: tensorboard}"),
                            tmp_path / "noopt")
    checks = _checks(verdict)
    assert code == 1 and checks["resumed_after"]["passed"]
    assert not checks["loss"]["passed"] and "differs at step 4 (" in checks["loss"]["detail"]

    # The checkpoint of step 1 (saved one early): both guards name the step.
    code, verdict, _ = _run(_case(tmp_path, "resume-early-save"), tmp_path / "early")
    checks = _checks(verdict)
    assert code == 1
    assert "resumed after step 1" in checks["resumed_after"]["detail"]
    assert "loaded a checkpoint that holds step 1" in checks["loaded_checkpoint"]["detail"]


@pytest.mark.slow
def test_a_first_run_that_does_not_stop_is_an_error_naming_it(tmp_path: Path) -> None:
    code, verdict, text = _run(_case(tmp_path, save='--save-interval, "{stop}"'),
                               tmp_path / "out")
    assert code == 2, text
    outcome = json.loads((tmp_path / "out" / "resume" / "eager-resumed" / "outcome.json")
                         .read_text())
    assert "did not stop after step 2: it logged up to step 4" in outcome["detail"]
