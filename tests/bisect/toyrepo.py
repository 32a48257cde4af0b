"""A throwaway git repository of a tiny training command, for bisect's end-to-end tests.

``train.py`` needs no torch: it writes one JSON line per step (``step``, ``loss``, ``grad_norm``)
into ``{arm_dir}/metrics/rank0.jsonl``, which a command case reads (``metrics: {source: jsonl}``).
Its history: a first commit, then one commit per index that changes only ``CHANGELOG``, except
the seeded bad commit (the loss turns NaN from step 3 on: the ``no_nan_inf`` check fails), and
optionally a broken commit (the script exits 3 before training: the arm errors, the gate says 2,
the step is skipped) fixed by the next commit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

TRAIN = '''import json, math, os, sys
steps, out = int(sys.argv[1]), sys.argv[2]
NAN_FROM = {nan_from}
{broken}os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f:
    for s in range(1, steps + 1):
        loss = float("nan") if s >= NAN_FROM else 2.0 * 0.9 ** s
        f.write(json.dumps({{"step": s, "loss": loss, "grad_norm": 1.0 / s}}) + "\\n")
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _train(bad: bool, broken: bool) -> str:
    return TRAIN.format(nan_from=3 if bad else 10**9,
                        broken="raise SystemExit(3)  # broken build\n" if broken else "")


def make_repo(root: Path, commits: int, bad_at: int, broken_at: Optional[int] = None) -> list[str]:
    """``root`` as a repository of ``commits + 1`` commits (index 0 the first); the commit at
    ``bad_at`` seeds the fault, the one at ``broken_at`` breaks the script (fixed by the next).
    The shas, index order."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "bisect@test")
    git(root, "config", "user.name", "bisect test")
    shas = []
    for i in range(commits + 1):
        (root / "train.py").write_text(_train(i >= bad_at, i == broken_at))
        with open(root / "CHANGELOG", "a") as fh:
            fh.write(f"change {i}\n")
        git(root, "add", "-A")
        what = ("seeded fault: NaN loss from step 3" if i == bad_at else
                "broken build" if i == broken_at else f"change {i}")
        git(root, "commit", "-q", "-m", what)
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas


def write_case(folder: Path, repo: Path, name: str = "toy") -> Path:
    """A command case outside ``repo`` whose command runs ``repo/train.py`` (cwd into repo)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    rel = Path("..") / repo.name if repo.parent == folder.parent else repo
    path.write_text(
        f"name: {name}\ntags: [command]\n"
        "resources: {gpus_per_node: 1, time_min: 2}\n"
        "train: {steps: 4, global_batch: 8, seq_length: 16, lr: 1.0e-3}\n"
        "command:\n"
        f"  argv: [{sys.executable}, train.py, '{{steps}}', '{{arm_dir}}/metrics/rank0.jsonl']\n"
        f"  cwd: {rel}\n"
        "  metrics: {source: jsonl}\n")
    return path
