"""The Slurm backend (``launch.slurm.backend``) behind the pipeline, against a scripted
scheduler (``slurm_fakes``): its state, wait and collect, the sinks once at the end of
``collect --wait`` (also after re-submissions), and none while a job still runs. The real
cluster runs it in ``test_cluster.py`` (marked ``slurm``)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import harness.cli.submit_cmd as submit_cmd
import harness.launch.slurm.backend as backend_mod
from harness.cli import main
from harness.launch.pipeline import finish
from harness.launch.slurm.backend import SlurmBackend
from harness.launch.slurm.events import ArmStart, append_event
from harness.launch.slurm.submit import JobRef
from harness.results import ArmOutcome, write_outcome
from tests.launch.slurm_fakes import Scheduler, steps

RUNNING = Scheduler(squeue="41|RUNNING|None\n", sacct="41|RUNNING|\n")
ENDED = Scheduler(squeue="", sacct="41|COMPLETED|0:0\n")


def states(backend: SlurmBackend, out: Path) -> dict[str, str]:
    return {cid: s.state for cid, s in backend.state(out).items()}


def finished_arms(case_dir: Path) -> None:
    for arm in ("eager", "eager-repeat"):
        steps(case_dir / arm, 3)
        write_outcome(case_dir / arm, ArmOutcome(status="ok", returncode=0))


def test_state_wait_and_collect_of_a_finished_job_reach_the_sinks_once(sweep):
    out, plan, ref = sweep
    running = SlurmBackend(runner=RUNNING).state(out)["t"]
    assert (running.state, running.job_id, running.scheduler_state, running.terminal) == (
        "running", "41", "RUNNING", False)
    finished_arms(out / "t")
    got: list[Path] = []
    polls: list[list] = []
    backend = SlurmBackend(runner=ENDED, poll_s=0.01, on_poll=polls.append)
    done = finish(backend, out, [lambda c: got.append(c.out_dir)])
    assert done.finished and got == [out] and len(polls) == 1
    assert states(backend, out) == {"t": "done"}
    assert (out / "t" / "verdict.json").is_file() and (out / "summary.md").is_file()


def test_a_running_job_is_not_delivered(sweep):
    out, plan, ref = sweep
    got: list[Path] = []
    done = finish(SlurmBackend(runner=RUNNING, poll_s=0.01), out, [lambda c: got.append(c.out_dir)], timeout_s=0.05)
    assert done.still_active == ("t",) and got == []
    assert not (out / "t" / "verdict.json").exists()


def test_a_case_queued_again_is_collected_again_then_delivered_once(sweep, monkeypatch):
    out, plan, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 3)
    write_outcome(case_dir / "eager", ArmOutcome(status="ok", returncode=0))
    append_event(case_dir, ArmStart(arm="eager-repeat", job_id="41", restarts=0, time=time.time()))
    retries: list[int] = []

    def retry(sweep_dir, n, max_parallel):  # the first collect finds an infra arm: queue it again
        retries.append(n)
        if len(retries) > 1:
            return []
        (case_dir / "eager-repeat" / "outcome.json").unlink()
        (case_dir / "verdict.json").unlink()
        finished_arms(case_dir)  # the new job (scripted: it has ended) ran the arm
        return [JobRef("t", "42", 1, "dcp-g0", str(ref.folder), time.time())]

    monkeypatch.setattr(backend_mod, "retry_infra", retry)
    got: list[Path] = []
    backend = SlurmBackend(runner=ENDED, poll_s=0.01, retry_infra=1)
    done = finish(backend, out, [lambda c: got.append(c.out_dir)])
    assert retries == [1, 1] and done.finished and got == [out]
    assert states(backend, out) == {"t": "done"}


def test_collect_wait_of_the_cli_calls_its_sinks_once(sweep, monkeypatch, capsys):
    out, plan, ref = sweep
    finished_arms(out / "t")
    got: list[Path] = []
    monkeypatch.setattr(backend_mod, "SlurmBackend", functools.partial(SlurmBackend, runner=ENDED))
    monkeypatch.setattr(submit_cmd, "sweep_sinks", lambda args: [lambda c: got.append(c.out_dir)])
    assert main(["collect", str(out), "--wait", "--poll-s", "0.01"]) == 0
    assert got == [out.resolve()]
    got.clear()  # a plain collect of the finished sweep is a finished collection too
    assert main(["collect", str(out)]) == 0
    assert got == [out.resolve()]
