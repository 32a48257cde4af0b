"""End to end: bisect a throwaway repository of 22 commits with one seeded bad commit and one
broken commit (skipped), interrupted and resumed, through ``dcp-harness bisect``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.bisect.search import Probe, Verdict, next_step, steps_bound
from harness.bisect.state import STATE_FILE, BisectState
from harness.cli import main
from harness.history import last_sweeps, open_history
from tests.bisect.toyrepo import git, make_repo, write_case

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # minutes on a loaded machine

COMMITS = 22  # after the good end


def first_probe(n: int) -> int:
    """The index (in the line after the good end) the search tests first."""
    commits = [str(i) for i in range(n)]
    decision = next_step(commits, {commits[-1]: Verdict.BAD})
    assert isinstance(decision, Probe)
    return int(decision.sha)


def test_bisect_finds_the_seeded_commit_skips_a_broken_one_and_resumes(tmp_path: Path,
                                                                       capsys) -> None:
    broken = first_probe(COMMITS) + 1  # the sha index of the first commit the search tests
    bad_at = 16
    repo = tmp_path / "toy"
    shas = make_repo(repo, COMMITS, bad_at=bad_at, broken_at=broken)
    case = write_case(tmp_path / "cases", repo)
    out = tmp_path / "bisect"

    # Ctrl-C (SIGINT to bisect alone, as a terminal's would reach it) while the 4th step's sweep
    # runs: bisect passes it on to the step, waits for it, exits 130; the steps before it are kept
    argv = ["bisect", str(case), "--good", shas[0], "--bad", "main", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    step_log = None
    deadline = time.monotonic() + 600
    while step_log is None or not step_log.is_file() or "$ (cd" not in step_log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        found = list((out / "steps").glob("04-*/step.log")) if (out / "steps").is_dir() else []
        step_log = found[0] if found else None
        time.sleep(0.2)
    time.sleep(1.0)  # the step's dcp-harness is starting or running its arm
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted in step 4" in stdout and "run the same command again to resume" in stdout
    state = BisectState.model_validate(json.loads((out / STATE_FILE).read_text()))
    assert [s.verdict for s in state.steps] == [Verdict.GOOD, Verdict.BAD, Verdict.SKIP, None]
    assert state.steps[2].sha == shas[broken] and "exit 2" in state.steps[2].detail
    assert not (out / "worktrees").exists()  # the step ended before its worktree was removed
    # the step's dcp-harness got the SIGINT (on failure: its log and any traceback it wrote)
    traces = [t.read_text() for t in (out / "steps").glob("04-*/sweep/internal-error-*.txt")]
    assert "nterrupt" in step_log.read_text(), (step_log.read_text(), traces)

    # the same command resumes; it re-runs step 4 into its own folder and finds the seeded commit
    code = main(argv)
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"first bad commit: {shas[bad_at]} seeded fault: NaN loss from step 3" in text
    assert "toy / checks / eager.no_nan_inf: 2.0 (bound 0.0)" in text
    state = BisectState.model_validate(json.loads((out / STATE_FILE).read_text()))
    assert all(s.verdict is not None for s in state.steps)
    assert [s.n for s in state.steps] == list(range(1, len(state.steps) + 1))
    verdicts = {shas.index(s.sha): s.verdict for s in state.steps}
    assert verdicts[bad_at] is Verdict.BAD and verdicts[bad_at - 1] is Verdict.GOOD
    assert verdicts[broken] is Verdict.SKIP
    assert len(state.steps) - 2 <= steps_bound(COMMITS) + 1  # ~log2 steps, plus the skipped one
    for s in state.steps:  # every step's sweep folder and verdict are listed
        assert f"{s.sha[:12]}" in text and str(out / s.sweep) in text
        assert (out / s.sweep / "manifest.json").is_file()
    # every step's sweep went into the history (the test's own database: tests/conftest.py)
    history = open_history(create=False)
    with history.read() as conn:
        recorded = {Path(r.path).resolve() for r in last_sweeps(conn, 100)}
    history.close()
    assert {(out / s.sweep).resolve() for s in state.steps} <= recorded
    # bisect's own line per step: "added", or "unchanged" where the step's harness (this one)
    # already recorded its sweep into the same database
    assert re.search(r"^history: (added|unchanged) ", text, re.M), text
    # the user's checkout untouched, every worktree gone
    assert git(repo, "status", "--porcelain") == "" and git(repo, "rev-parse", "HEAD") == shas[-1]
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (out / "worktrees").exists()

    assert (out / "result.txt").read_text() == text[text.index("first bad commit"):]
    # run again: nothing left to run, the same answer
    before = (out / STATE_FILE).read_text()
    assert main(["bisect", str(case), "--good", shas[0], "--bad", "main", "--out", str(out)]) == 0
    assert f"first bad commit: {shas[bad_at]}" in capsys.readouterr().out
    assert (out / STATE_FILE).read_text() == before

    # another command on the same folder is refused, naming what differs; nothing changes
    assert main(["bisect", str(case), "--good", shas[1], "--bad", "main", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out.resolve()} holds another bisect (good: '{shas[0]}'" in err
    assert (out / STATE_FILE).read_text() == before


def test_a_good_end_that_fails_is_refused_with_its_failing_checks(tmp_path: Path, capsys) -> None:
    repo = tmp_path / "toy"
    shas = make_repo(repo, 4, bad_at=0)
    case = write_case(tmp_path / "cases", repo)
    out = tmp_path / "bisect"
    assert main(["bisect", str(case), "--good", shas[1], "--bad", shas[4], "--out", str(out)]) == 2
    text = capsys.readouterr().out
    assert f"refused: the good end {shas[1][:12]} (change 1) fails" in text
    assert "pick an older --good that passes" in text
    assert "toy / checks / eager.no_nan_inf" in text
    state = BisectState.model_validate(json.loads((out / STATE_FILE).read_text()))
    assert [(s.sha, s.verdict) for s in state.steps] == [(shas[1], Verdict.BAD)]  # nothing more ran
    assert git(repo, "status", "--porcelain") == ""
