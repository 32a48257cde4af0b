"""Two real sweeps at two commits go into the history: a command case whose command lives in a
throwaway git repository (a small trainer that logs as Megatron-LM does, one rank, no torch, so it
starts in a blink) runs at commit A, the repository moves to commit B (its loss 1 % higher), it
runs again; `history add` takes both sweeps, `history show`
prints both points with their commits and writes the plot, the dashboard lists both sweeps and
plots their trend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
TRAINER = """\
import sys
BASE = 4.0
iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
for i in range(1, iters + 1):
    print(f" iteration {i:8d}/{iters:8d} | elapsed time per iteration (ms): 10.0 | learning rate: "
          f"3.0E-03 | lm loss: {BASE - 0.1 * i:.6E} | grad norm: 1.0 | number of skipped "
          "iterations:   0 | number of nan iterations:   0 |", flush=True)
"""
CASE = """\
name: two-commits
resources: {gpus_per_node: 1, time_min: 3}
train: {steps: 3, global_batch: 4, seq_length: 16, lr: 3.0e-3}
command:
  argv: [python, train.py, --train-iters, "{steps}"]
  env: {OMP_NUM_THREADS: "1"}
  metrics: {source: megatron_log}
compare:
  repeat: {loss: exact}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_sweep(case: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "harness", "run", str(case), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[str]]:
    root = tmp_path_factory.mktemp("two-commits")
    code = root / "trainer"
    code.mkdir()
    (code / "train.py").write_text(TRAINER)
    (code / "case.yaml").write_text(CASE)
    git(code, "init", "-q")
    git(code, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    commits, sweeps = [], []
    for n in (1, 2):
        if n == 2:  # the second commit: the command's loss 1 % higher
            (code / "train.py").write_text(TRAINER.replace("BASE = 4.0", "BASE = 4.04"))
        git(code, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", f"night {n}")
        commits.append(git(code, "rev-parse", "HEAD"))
        sweeps.append(root / f"sweep{n}")
        run_sweep(code / "case.yaml", sweeps[-1])
    return sweeps, commits


@pytest.mark.slow
def test_two_sweeps_at_two_commits_are_shown_and_on_the_dashboard(url, two_sweeps, tmp_path,
                                                                   capsys, monkeypatch):
    sweeps, commits = two_sweeps
    monkeypatch.chdir(tmp_path)
    assert main(["history", "add", *map(str, sweeps), "--history", url]) == 0
    assert capsys.readouterr().out.count("history: added") == 2
    assert main(["history", "show", "two-commits", "--metric", "final_loss", "--history",
                 url]) == 0
    out = capsys.readouterr().out.splitlines()
    # one line per arm: its two points, then where they came from (newest commit)
    assert out[0] == "two-commits / eager final_loss [cpu]: 3.7 3.74"
    assert (f"sweeps sweep1 {commits[0][:7]} .. sweep2 {commits[1][:7]} (2, label adhoc), newest"
            in out[1] and commits[1][:12] in out[1])
    assert (tmp_path / "results" / "history-show.png").stat().st_size > 1000
    assert main(["history", "dashboard", "--history", url]) == 0
    page = (tmp_path / "results" / "history.html").read_text()
    for sweep, commit in zip(sweeps, commits):
        assert f"<td>{sweep.name}</td>" in page and commit[:12] in page
    assert 'data-case="two-commits" data-platform="cpu" data-points="2"' in page
    # Two sweeps are too few for a trend: the check says so and does not pass.
    assert main(["history", "check", "--history", url]) == 2
    assert "nothing could be judged (a trend needs 4 sweeps)" in capsys.readouterr().out
    assert main(["history", "check", "-v", "--history", url]) == 2
    assert "TOO FEW two-commits / eager final_loss [cpu]" in capsys.readouterr().out
