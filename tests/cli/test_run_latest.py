"""`results/latest` (under the directory `dcp-harness run` runs in) follows the sweep just run,
with or without `--out`, inside `results/` or anywhere else, so `report` and `gate` without DIR
judge that sweep; `--no-latest` leaves it (a bisect step's sweep)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.cli import main
from tests.quick_sweep import quick_case, run_quick


def test_latest_follows_out_wherever_it_is(tmp_path: Path, monkeypatch, capsys):
    work = tmp_path / "work"
    case = quick_case(work)
    latest = work / "results" / "latest"

    inside = work / "results" / "nightly"  # inside results/, given relative: a relative link
    run_quick(case, ["--out", "results/nightly"], cwd=work)
    assert os.readlink(latest) == "nightly" and latest.resolve() == inside

    elsewhere = tmp_path / "scratch" / "sweep"  # outside results/: an absolute link
    run_quick(case, ["--out", str(elsewhere)], cwd=work)
    assert os.readlink(latest) == str(elsewhere) and latest.resolve() == elsewhere

    monkeypatch.chdir(work)
    assert main(["report"]) == 0
    assert f"wrote {elsewhere}/summary.md" in capsys.readouterr().out
    assert main(["gate"]) == 0

    run_quick(case, ["--out", str(tmp_path / "bisect-step"), "--no-latest"], cwd=work)
    assert latest.resolve() == elsewhere
