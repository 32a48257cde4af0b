"""The environment a command inherits, recorded and replayed (``harness.results.inherited_env``):
a drift an inherited variable causes (the example trainer's ``TRAINER_LR_SCALE``) is in the
manifest and the arm's ``inherited_env.json``, secrets redacted, and the arm's repro line
reproduces it from a shell without the variable; the gate notes a pair whose arms inherited
different environments."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import differences, inherited, replayable

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"
SECRET = "inherited-s3cr3t-never-written"
LOSS = re.compile(r"iteration +(\d+)/ *\d+ \|.*?lm loss: ([0-9.E+-]+)")


def test_what_is_recorded_and_replayed() -> None:
    env = {"NCCL_ALGO": "Ring", "PWD": "/x", "SSH_TTY": "/dev/pts/1", "RANK": "3",
           "WANDB_API_KEY": "k", "MY_TOKEN": "t", "PLAIN": "p", "SLURM_JOB_ID": "7"}
    got = inherited(env, ["PLAIN"])
    assert got == {"MY_TOKEN": "***", "NCCL_ALGO": "Ring", "PLAIN": "***", "WANDB_API_KEY": "***"}
    assert replayable(got, {"NCCL_ALGO"}) == {}
    assert replayable({"A": "1", "B": "***"}) == {"A": "1"}
    assert differences({"A": "1", "B": "2"}, {"A": "1", "C": "3"}, ("x", "y")) == [
        "B=2 (x) vs no B (y)", "no C (x) vs C=3 (y)"]


def _losses(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in LOSS.finditer(text)}


@pytest.mark.slow
def test_a_drift_from_an_inherited_variable_reproduces_from_the_repro_line(tmp_path: Path
                                                                           ) -> None:
    case = tmp_path / "case.yaml"
    case.write_text(f"""\
name: envdrift
resources: {{gpus_per_node: 1, time_min: 3}}
train: {{steps: 3, global_batch: 8, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [python, {TRAINER}, --train-iters, "{{steps}}"]
  env: {{OMP_NUM_THREADS: "1"}}
  secret_env: [ENV_TEST_SECRET]
  arms: {{repeat: [--log-interval, "1"]}}
  metrics: {{source: megatron_log}}
compare:
  repeat: {{loss: exact}}
""")
    base = {k: v for k, v in os.environ.items() if k != "TRAINER_LR_SCALE"}
    base["PYTHONPATH"] = str(REPO)
    out = tmp_path / "out"
    env = {**base, "TRAINER_LR_SCALE": "1.5", "ENV_TEST_SECRET": SECRET}
    run = subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["starts"][-1]["environment"]
    assert recorded["TRAINER_LR_SCALE"] == "1.5" and recorded["ENV_TEST_SECRET"] == "***"
    arm_env = json.loads((out / "envdrift" / "eager" / "inherited_env.json").read_text())
    assert arm_env["inherited"]["TRAINER_LR_SCALE"] == "1.5"
    assert arm_env["set"]["OMP_NUM_THREADS"] == "1"
    logged = _losses((out / "envdrift" / "eager" / "log.txt").read_text())
    assert sorted(logged) == [1, 2, 3]

    outcome = json.loads((out / "envdrift" / "eager" / "outcome.json").read_text())
    assert "TRAINER_LR_SCALE=1.5" in outcome["repro"] and SECRET not in outcome["repro"]
    replay = subprocess.run(["bash", "-c", outcome["repro"]], env=base, capture_output=True,
                            text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert _losses(replay.stdout) == logged  # the drift, reproduced from the repro line alone
    clean = subprocess.run(["bash", "-c", outcome["repro"].replace("TRAINER_LR_SCALE=1.5 ", "")],
                           env=base, capture_output=True, text=True, timeout=300)
    assert _losses(clean.stdout)[2] != logged[2]  # it is a drift: without it step 2 differs
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if SECRET in p.read_text(errors="replace")]

    # The repeat arm run again from another shell: the gate notes the difference.
    (out / "envdrift" / "eager-repeat" / "outcome.json").unlink()
    (out / "envdrift" / "verdict.json").unlink()
    env["TRAINER_LR_SCALE"] = "1.25"
    subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out)],
                   env=env, capture_output=True, text=True, timeout=600)
    gate = subprocess.run([sys.executable, "-m", "harness", "gate", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert gate.returncode == 1, gate.stdout  # the repeat's losses differ
    assert ("NOTE  envdrift / repeat: the arms inherited different environments "
            "(inherited_env.json): TRAINER_LR_SCALE=1.5 (eager) vs TRAINER_LR_SCALE=1.25 "
            "(eager-repeat)") in gate.stdout


def test_a_script_run_by_python_is_asked_through_its_interpreter(tmp_path) -> None:
    """torchrun, deepspeed: console scripts whose `#!` line names the interpreter that runs the
    ranks; a program that is no Python script stays unasked."""
    import shutil
    import sys

    from harness.launch.ranks.command_env import interpreter_of

    direct, via_env, shell = (tmp_path / n for n in ("direct", "via_env", "shell"))
    direct.write_text(f"#!{sys.executable}\nprint(1)\n")
    via_env.write_text("#!/usr/bin/env -S python3 -u\nprint(1)\n")
    shell.write_text("#!/bin/sh\necho 1\n")
    assert interpreter_of(str(direct)) == sys.executable
    assert interpreter_of(str(via_env)) == shutil.which("python3")
    assert interpreter_of(str(shell)) == str(shell)
    assert interpreter_of(sys.executable) == sys.executable and interpreter_of(None) is None


