"""A command case under Slurm, without Slurm: the job's tasks started as srun would (one process
per task, a TaskIdentity by hand), then ``collect`` against a scripted scheduler and the gate.
The example trainer (examples/trainer/train.py) is the command, two gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

from harness.arms import plan_case
from harness.caseplan import read_plan
from harness.launch.slurm.collect import collect
from harness.launch.slurm.events import ProcessEnd, read_events
from harness.launch.slurm.profiles import load_profile
from harness.launch.slurm.submit import JobRef, record_jobs, shape_of
from harness.launch.sweep_folder import prepare_case_dir
from harness.report import gate
from harness.results import read_outcome, read_steps
from harness.spec import load_cases

from tests.launch.slurm_fakes import Scheduler

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"
SECRET = "slurm-s3cr3t-never-written"
LEAKY = f"""\
import os, runpy, sys
print("token:", os.environ["CMD_TEST_TOKEN"], flush=True)
sys.argv = [{str(TRAINER)!r}] + sys.argv[1:]
runpy.run_path({str(TRAINER)!r}, run_name="__main__")
"""


def command_sweep(tmp_path: Path, command: dict, compare: dict) -> tuple[Path, Path]:
    """(sweep folder, case folder) of command case ``cmd`` submitted as job 41 (not yet run)."""
    (tmp_path / "leaky.py").write_text(LEAKY)
    doc = {"name": "cmd", "resources": {"gpus_per_node": 2, "time_min": 3, "profile": "local"},
           "train": {"steps": 3, "global_batch": 8, "seq_length": 16, "lr": 3.0e-3},
           "command": {"env": {"OMP_NUM_THREADS": "1"}, **command}, "compare": compare}
    path = tmp_path / "cmd.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (case,) = load_cases([path])
    out = tmp_path / "sweep"
    case_dir = prepare_case_dir(plan_case(case), out)
    logs = out / "slurm" / "logs" / "round-0"
    logs.mkdir(parents=True)
    record_jobs(out, [JobRef("cmd", "41", 0, "dcp-g0", str(logs), time.time())], [])
    return out, case_dir


def run_tasks(case_dir: Path, tasks: int) -> list[subprocess.CompletedProcess]:
    """Every task of job 41 at once, each a process of its own, as srun starts them."""
    script = textwrap.dedent(f"""
        import sys
        from harness.caseplan import read_plan
        from harness.launch.slurm.job import TaskIdentity, run_case_arms
        k = int(sys.argv[1])
        plan = read_plan({str(case_dir)!r})
        print(run_case_arms(plan, {str(case_dir)!r},
                            TaskIdentity("41", k, k, {tasks}, "127.0.0.1", 0)))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CMD_TEST_TOKEN": SECRET}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(tasks)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def collected(out: Path, state: str = "COMPLETED", code: str = "0:0") -> int:
    result = collect(out, runner=Scheduler(squeue=f"41|{state}|None\n",
                                           sacct=f"41|{state}|{code}\n"))
    assert not result.problems and result.finalized == ("cmd",), result
    return gate(out)


def test_per_rank_tasks_run_their_ranks_and_task_0_records_the_metrics(tmp_path):
    out, case_dir = command_sweep(
        tmp_path, {"argv": ["python", "leaky.py", "--train-iters", "{steps}"],
                   "secret_env": ["CMD_TEST_TOKEN"],
                   "arms": {"graph": ["--cuda-graph-impl", "local"]},
                   "metrics": {"source": "megatron_log", "tags": {"aux_loss": "z_loss"}}},
        {"graph_vs_eager": {"loss": "exact", "grad_norm": "exact"}})
    tasks = run_tasks(case_dir, 2)
    assert all(t.returncode == 0 for t in tasks), [t.stderr[-3000:] for t in tasks]
    for arm in ("eager", "graph"):
        steps = read_steps(case_dir / arm)
        assert sorted(steps) == [0, 1] and all(len(s) == 3 for s in steps.values())
        outcome = read_outcome(case_dir / arm)
        assert outcome.ok and "wrote 3 of 3 planned steps" in outcome.detail
        assert "slurm job 41" in outcome.detail and "for k in 0 1" in outcome.repro
        log = (case_dir / arm / "log.txt").read_text()
        assert "[rank 0] token: ***" in log and "[rank 1] token: ***" in log
    ends = [e for e in read_events(case_dir) if isinstance(e, ProcessEnd)]
    assert sorted((e.arm, e.process) for e in ends) == [
        ("eager", 0), ("eager", 1), ("graph", 0), ("graph", 1)]
    assert collected(out) == 0
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if SECRET in p.read_text(errors="replace")]


def test_a_resumed_arm_runs_twice_in_the_job_and_the_resume_pair_judges_it(tmp_path):
    """The -resumed arm's two runs in one job: every task runs its rank's process of the first
    run (save after step 2, exit), task 0 reads the iteration file and starts the second (its
    events say leg 1), then joins both runs' log lines; the second run ignores --load (the
    trainer's seeded fault), so the resume pair fails on resumed_after, its losses equal."""
    out, case_dir = command_sweep(
        tmp_path, {"argv": ["python", str(TRAINER), "--train-iters", "{steps}",
                            "--fault", "resume-from-zero"],
                   "resume": {"save": ["--save", "{arm_dir}/ckpt", "--save-interval", "{stop}",
                                       "--exit-interval", "{stop}"],
                              "load": ["--load", "{arm_dir}/ckpt"],
                              "iteration_file": "{arm_dir}/ckpt/latest_checkpointed_iteration.txt"},
                   "metrics": {"source": "megatron_log", "tags": {"aux_loss": "z_loss"}}},
        {"resume": {"at_step": 2, "loss": "exact"}})
    tasks = run_tasks(case_dir, 2)
    assert all(t.returncode == 0 for t in tasks), [t.stderr[-3000:] for t in tasks]
    outcome = read_outcome(case_dir / "eager-resumed")
    assert outcome.ok and "second run: steps 1-3" in outcome.detail, outcome
    assert "slurm job 41" in outcome.detail and " && " in outcome.repro  # both runs
    assert [len(s) for s in read_steps(case_dir / "eager-resumed").values()] == [3, 3]
    ends = [e for e in read_events(case_dir) if isinstance(e, ProcessEnd)
            and e.arm == "eager-resumed"]
    assert sorted((e.leg or 0, e.process) for e in ends) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    log = (case_dir / "eager-resumed" / "log.txt").read_text()
    assert "second run (command.resume.load): loading the checkpoint; the iteration file " \
           "names step 2" in log
    assert collected(out) == 1
    verdict = json.loads((case_dir / "verdict.json").read_text())
    (pair,) = verdict["pairs"]
    checks = {c["name"]: c for c in pair["checks"]}
    assert not checks["resumed_after"]["passed"] and checks["loss"]["passed"]
    assert checks["loaded_checkpoint"]["passed"]  # the file said 2; the run ignored it


def test_a_launcher_case_runs_one_task_per_node(tmp_path):
    out, case_dir = command_sweep(
        tmp_path, {"argv": ["python", "-m", "torch.distributed.run", "--nproc-per-node",
                            "{nproc_per_node}", str(TRAINER), "--train-iters", "{steps}",
                            "--tensorboard-dir", "{arm_dir}/tb"],
                   "ranks": "launcher", "arms": {"repeat": ["--log-interval", "1"]},
                   "metrics": {"source": "tensorboard", "path": "tb",
                               "tags": {"aux_loss": "z_loss"}}},
        {"repeat": {"loss": "exact"}})
    (case,) = load_cases([tmp_path / "cmd.yaml"])
    assert shape_of(case, load_profile("local")).tasks_per_node == 1  # the launcher's task
    (task,) = run_tasks(case_dir, 1)  # torchrun finds its rendezvous in PET_* variables
    assert task.returncode == 0, task.stderr[-3000:]
    for arm in ("eager", "eager-repeat"):
        assert [len(s) for s in read_steps(case_dir / arm).values()] == [3, 3]
    assert collected(out) == 0


def test_a_failing_process_ends_the_job_and_collect_says_what_did_not_run(tmp_path):
    out, case_dir = command_sweep(
        tmp_path, {"argv": ["python", str(TRAINER), "--train-iters", "{steps}", "--no-such-option"],
                   "arms": {"graph": ["--cuda-graph-impl", "local"]},
                   "metrics": {"source": "megatron_log"}},
        {"graph_vs_eager": {"loss": "exact"}})
    first, second = [arm.name for arm in read_plan(case_dir).arms]
    tasks = run_tasks(case_dir, 2)
    assert all(t.returncode != 0 for t in tasks)
    failed = read_outcome(case_dir / first)
    assert failed.status == "failed" and "exited with exit code 2" in failed.detail
    assert "slurm job 41" in failed.detail and "unrecognized arguments" in failed.log_tail
    assert read_outcome(case_dir / second) is None  # never started
    assert collected(out, "FAILED", "1:0") == 2
    not_run = read_outcome(case_dir / second)
    assert not_run.status == "infra" and not_run.detail == f"not run: arm '{first}' failed"
