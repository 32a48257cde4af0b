"""Bisect the harness itself: a throwaway git repository holding a copy of this repository's
``harness/`` package and a tiny CPU case, one of whose commits seeds a workload fault of the
mutation table (``bench/mutations.py``: ``cp-causality``). Each step must run *that commit's*
harness (``PYTHONPATH`` at its worktree), so only the seeded commit's descendants fail."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import harness
from harness.cli import main
from tests.benches import load_bench
from tests.bisect.toyrepo import git

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # minutes on a loaded machine

REPO = Path(harness.__file__).resolve().parents[1]
CASE = """name: tiny-bisect
tags: [cpu, dcp]
model: {preset: tiny, layers: 1}
parallel: {pp: 1, ep: 1, dynamic_cp: [1, 2]}
train: {steps: 2, global_batch: 4, seq_length: 64, max_seqlen_per_rank: 32, lr: 3.0e-3,
        seed: 2024, deterministic: true, dtype: fp32}
data: {lengths: {distribution: lognormal, min: 8, max: 64, sigma: 0.9}}
compare: {reference: {}}
resources: {nodes: 1, gpus_per_node: 2, time_min: 5}
"""
COMMITS = 7  # after the first: 2 ends + 3 steps


def copy_harness(into: Path) -> None:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "harness"], check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, into / rel)


def test_bisect_finds_the_commit_that_seeded_a_workload_fault(tmp_path: Path, capsys) -> None:
    fault = next(m for m in load_bench("mutations").MUTATIONS if m.name == "cp-causality")
    repo = tmp_path / "harness-copy"
    repo.mkdir()
    copy_harness(repo)
    (repo / "cases").mkdir()
    (repo / "cases" / "tiny.yaml").write_text(CASE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bisect@test")
    git(repo, "config", "user.name", "bisect test")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "harness copy")
    bad_at = 5
    for i in range(1, COMMITS + 1):
        if i == bad_at:
            source = repo / fault.file
            text = source.read_text()
            assert text.count(fault.old) == 1
            source.write_text(text.replace(fault.old, fault.new))
            subject = f"seeded fault: {fault.name}"
        else:
            with open(repo / "NOTES", "a") as fh:
                fh.write(f"note {i}\n")
            subject = f"note {i}"
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    out = tmp_path / "bisect"
    code = main(["bisect", str(repo / "cases" / "tiny.yaml"), "--good", "main~7", "--bad", "main",
                 "--repo", str(repo), "--out", str(out)])
    text = capsys.readouterr().out
    seeded = git(repo, "rev-parse", f"main~{COMMITS - bad_at}")
    assert code == 0, text
    assert f"first bad commit: {seeded} seeded fault: cp-causality" in text
    assert "tiny-bisect / reference / " in text  # the failing checks of the reference pair
    assert git(repo, "status", "--porcelain") == ""
