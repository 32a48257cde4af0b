"""The rough edges a new user hits: help texts, selection messages, plan's flag errors and
bounds, and `plan --json | head`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _subcommands() -> dict:
    return next(a for a in build_parser()._actions if a.dest == "command").choices


@pytest.mark.parametrize("name", ["validate", "plan", "run", "submit", "status", "collect",
                                  "report", "gate"])
def test_every_command_has_a_description(name: str) -> None:
    parser = _subcommands()[name]
    assert parser.description and len(parser.description) > 40, name


@pytest.mark.parametrize("command", ["run", "validate", "submit"])
def test_an_empty_selection_names_only_the_given_filters(command: str, capsys) -> None:
    argv = [command, str(REPO / "cases" / "focused"), "--tags", "no-such-tag"]
    if command == "submit":
        argv += ["--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "none matches --tags no-such-tag" in err and "None" not in err
    assert main([command, str(REPO / "cases" / "focused"), "-k", "zzz"]
                + (["--dry-run"] if command == "submit" else [])) == 2
    err = capsys.readouterr().err
    assert "none matches -k 'zzz'" in err and "--tags" not in err and "None" not in err


@pytest.mark.parametrize("argv, message", [
    (["--pp", "0"], "--pp must be >= 1, got 0"),
    (["--pp", "2"], "--microbatches is missing"),
    (["--microbatches", "4"], "--pp is missing"),
    ([], "--pp and --microbatches are missing"),
    (["--pp", "2", "--vpp", "0", "--microbatches", "4"], "--vpp must be >= 1, got 0"),
    (["--pp", "100000", "--microbatches", "4"], "--pp must be at most 256"),
    (["--pp", "2", "--microbatches", "4", "--cp", "1,4096"], "--cp must be at most 1024"),
    (["--pp", "2", "--microbatches", "4", "--slots", "99999"], "--slots must be at most 4096"),
    (["--pp", "2", "--microbatches", "4", "--layers-per-chunk", "99999"],
     "--layers-per-chunk must be at most 1024"),
])
def test_plan_flag_errors_name_the_flag(argv: list[str], message: str, capsys) -> None:
    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["100000000", "1..100000000", "8,100000000"])
def test_plan_refuses_huge_microbatch_counts_at_once_saying_why(spec: str, capsys) -> None:
    started = time.monotonic()
    assert main(["plan", "--pp", "2", "--microbatches", spec]) == 2
    assert time.monotonic() - started < 5  # it ran for 10 minutes and grew to 3 GB
    err = capsys.readouterr().err
    assert "--microbatches must be at most 4096, got 100000000: the slot planner walks" in err


def test_plan_json_into_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "plan", "--pp", "8", "--vpp", "4", "--microbatches",
         "64", "--cp", "1,2,4", "--json"],  # 250 kB: more than a pipe holds
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'{"ranks": '  # then the reader goes away, like `| head`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_run_gpu_jobs_below_one_is_refused_naming_the_flag(capsys) -> None:
    assert main(["run", "cases/focused", "--gpu-jobs", "0", "--out", "/nonexistent/x"]) == 2
    assert "--gpu-jobs must be at least 1 (1: one arm after another), got 0" in capsys.readouterr().err
