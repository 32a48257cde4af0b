"""`dcp-harness status` of a submitted sweep (the Slurm backend's ``state``): its columns, and a
case skipped at submit time shows none of its arms as done."""

import functools
from pathlib import Path

from rich.console import Console

import harness.launch.slurm.backend as slurm_backend
from harness.cli import main
from harness.cli.status_cmd import status_renderable
from harness.launch.slurm.backend import SlurmBackend
from harness.launch.slurm.status import skipped_status
from tests.launch.slurm_fakes import Scheduler, steps


def test_a_case_skipped_at_submit_is_not_shown_with_its_arms_done() -> None:
    status = skipped_status("gpu1-qwen3-graphs.scope-attn", "needs CUDA; profile 'local' "
                            "requests no GPUs", arms_total=4)
    assert (status.arms_done, status.arms_total, status.state) == (0, 4, "skipped")
    console = Console(width=200, record=True)
    console.print(status_renderable([status], Path("sweep")))
    row = next(line for line in console.export_text().splitlines() if "gpu1-qwen3" in line)
    assert "0/4" in row and "4/4" not in row


def test_status_of_a_submitted_sweep_asks_the_slurm_backend(sweep, monkeypatch, capsys) -> None:
    out, plan, ref = sweep
    steps(out / "t" / "eager", 2)
    running = Scheduler(squeue="41|RUNNING|None\n", sacct="41|RUNNING|\n")
    monkeypatch.setattr(slurm_backend, "SlurmBackend", functools.partial(SlurmBackend, runner=running))
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [[w for w in line.split() if w not in "┃│"] for line in text.splitlines()]
    assert ["case", "job", "slurm", "state", "arms", "progress", "detail"] in lines
    assert ["t", "41", "RUNNING", "running", "0/2", "eager", "2/3"] in lines
    assert "0/1 ended: 0 pending, 1 running" in " ".join(text.split())
