"""Bisect with every step a Slurm job (``submit --profile local --wait``) on the single-node
dev cluster (slurm/devcluster/start.sh): a throwaway repository of 9 commits, a seeded bad commit
and a broken one (skipped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bisect.search import Verdict
from harness.bisect.state import STATE_FILE, BisectState
from harness.cli import main
from tests.bisect.test_bisect_e2e import first_probe
from tests.bisect.toyrepo import git, make_repo, write_case

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900), pytest.mark.usefixtures("slurm_cluster")]

COMMITS = 8


def test_bisect_runs_each_step_as_a_slurm_job(tmp_path: Path, capsys) -> None:
    broken = first_probe(COMMITS) + 1
    bad_at = 6
    repo = tmp_path / "toy"
    shas = make_repo(repo, COMMITS, bad_at=bad_at, broken_at=broken)
    case = write_case(tmp_path / "cases", repo)
    out = tmp_path / "bisect"
    code = main(["bisect", str(case), "--good", shas[0], "--bad", "main", "--profile", "local",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"first bad commit: {shas[bad_at]} seeded fault" in text
    state = BisectState.model_validate(json.loads((out / STATE_FILE).read_text()))
    assert {shas.index(s.sha): s.verdict for s in state.steps}[broken] is Verdict.SKIP
    for step in state.steps:  # each step's sweep was a submitted one, its jobs collected
        assert (out / step.sweep / "slurm" / "jobs.json").is_file()
        assert "submit" in (out / step.sweep).parent.joinpath("step.log").read_text()
    assert git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1
