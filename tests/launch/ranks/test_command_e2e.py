"""Command cases through the harness on CPU: the example trainer (examples/trainer/train.py) as
an external command, two gloo ranks; a seeded fault fails the verdict, a command that cannot run
is an error naming the arm, and a secret's value is written nowhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"
SECRET = "s3cr3t-value-never-written"


# A trainer that prints the secret it is given, as a careless command might.
LEAKY = f"""\
import os, runpy, sys
print("token:", os.environ["CMD_TEST_TOKEN"], flush=True)
sys.argv = [{str(TRAINER)!r}] + sys.argv[1:]
runpy.run_path({str(TRAINER)!r}, run_name="__main__")
"""


def _case(tmp_path: Path, extra_graph: str = "", metrics: str = "{source: megatron_log}",
          program: str = "python", compare: str = "graph_vs_eager: {loss: exact}",
          script: Path = TRAINER) -> Path:
    text = f"""\
name: cmd
resources: {{gpus_per_node: 2, time_min: 3}}
train: {{steps: 3, global_batch: 8, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [{program}, {script}, --train-iters, "{{steps}}"]
  env: {{OMP_NUM_THREADS: "1"}}
  secret_env: [CMD_TEST_TOKEN]
  arms: {{graph: [--cuda-graph-impl, local{extra_graph}]}}
  metrics: {metrics}
compare:
  {compare}
"""
    path = tmp_path / "case.yaml"
    path.write_text(text)
    return path


def _run(case: Path, out: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CMD_TEST_TOKEN": SECRET}
    run = subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=600)
    gate = subprocess.run([sys.executable, "-m", "harness", "gate", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    return gate.returncode, run.stdout + run.stderr + gate.stdout


def _verdict(out: Path) -> dict:
    return json.loads((out / "cmd" / "verdict.json").read_text())


def test_a_seeded_fault_in_the_trainer_fails_the_verdict(tmp_path: Path) -> None:
    (tmp_path / "leaky.py").write_text(LEAKY)
    code, text = _run(_case(tmp_path, extra_graph=", --fault, graph-drift",
                            script=tmp_path / "leaky.py"), tmp_path / "out")
    assert code == 1, text
    (pair,) = _verdict(tmp_path / "out")["pairs"]
    assert pair["status"] == "fail"
    loss = next(c for c in pair["checks"] if c["name"] == "loss")
    assert not loss["passed"]
    for name in ("graph", "eager"):  # a real step record of each rank of each arm
        assert (tmp_path / "out" / "cmd" / name / "rank1.jsonl").read_text().count("\n") == 3
    for name in ("graph", "eager"):  # what the command printed of its secret is redacted
        log = (tmp_path / "out" / "cmd" / name / "log.txt").read_text()
        assert "[rank 0] token: ***" in log and "[rank 1] token: ***" in log
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not [p for p in files if SECRET in p.read_text(errors="replace")]


def test_nan_from_the_trainer_fails_the_arm(tmp_path: Path) -> None:
    code, text = _run(_case(tmp_path, extra_graph=", --fault, nan"), tmp_path / "out")
    assert code == 1, text
    checks = {c["name"]: c for c in _verdict(tmp_path / "out")["pairs"][0]["checks"]}
    assert not checks["graph.no_nan_inf"]["passed"] and checks["eager.no_nan_inf"]["passed"]


@pytest.mark.parametrize("kwargs, says", [
    ({"program": "no-such-trainer-program"}, "arm 'graph' failed after 0.0 s (returncode "
                                             "None): command not found: no-such-trainer-program"),
    ({"metrics": "{source: tensorboard}"}, "no TensorBoard event file"),
])
def test_a_command_that_cannot_run_is_an_error_naming_the_arm(tmp_path: Path, kwargs: dict,
                                                              says: str) -> None:
    code, text = _run(_case(tmp_path, **kwargs), tmp_path / "out")
    assert code == 2, text
    (pair,) = _verdict(tmp_path / "out")["pairs"]
    assert pair["status"] == "error" and says in pair["error"], pair["error"]
    # JUnit says the user's command failed, not the harness
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert '<error type="CommandFailed"' in junit and "HarnessError" not in junit


def test_a_launcher_case_runs_torchrun_once_and_passes(tmp_path: Path) -> None:
    case = REPO / "cases" / "command" / "trainer-torchrun.yaml"
    code, text = _run(case, tmp_path / "out")
    assert code == 0, text
    arm = tmp_path / "out" / "command-trainer-torchrun" / "graph"
    log = (arm / "log.txt").read_text()
    assert log.count("[launcher] ") >= 2 and "x1 port" in log  # one launcher, its port fixed
    port = log.split("x1 port ")[1].split()[0]
    assert f"--master-port {port} " in log  # the same port in its arguments ({master_port})
    # torchrun's workers keep their ranks apart under the node's prefix: the last rank's lines
    # (Megatron's iteration lines) are rank 1's, not the launcher's
    assert "[node 0] [rank1]:  [" in log and " iteration " in log.split("[node 0] [rank1]:")[-1]
    assert "[rank 0]" not in log
    assert (arm / "rank1.jsonl").read_text().count("\n") == 4
    outcome = json.loads((arm / "outcome.json").read_text())
    assert "NNODES=1 NODE_RANK=0 NPROC_PER_NODE=2" in outcome["repro"]
