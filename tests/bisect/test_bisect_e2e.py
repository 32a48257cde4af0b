"""End to end: bisect a throwaway repository of 22 commits with one seeded bad commit and one
broken commit (skipped), interrupted and resumed, through ``dcp-harness bisect``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bisect import Request, bisect
from harness.bisect.search import Probe, Verdict, next_step, steps_bound
from harness.bisect.state import STATE_FILE, BisectState
from harness.cli import main
from tests.bisect.toyrepo import git, make_repo, write_case

pytestmark = pytest.mark.slow

COMMITS = 22  # after the good end


def first_probe(n: int) -> int:
    """The index (in the line after the good end) the search tests first."""
    commits = [str(i) for i in range(n)]
    decision = next_step(commits, {commits[-1]: Verdict.BAD})
    assert isinstance(decision, Probe)
    return int(decision.sha)


class Interrupt(Exception):
    pass


def test_bisect_finds_the_seeded_commit_skips_a_broken_one_and_resumes(tmp_path: Path, capsys) -> None:
    broken = first_probe(COMMITS) + 1  # the sha index of the first commit the search tests
    bad_at = 16
    repo = tmp_path / "toy"
    shas = make_repo(repo, COMMITS, bad_at=bad_at, broken_at=broken)
    case = write_case(tmp_path / "cases", repo)
    out = tmp_path / "bisect"
    request = Request(good=shas[0], bad="main", paths=(str(case),), out=out)

    # Ctrl-C as the 4th step starts: the three steps before it are kept, judged
    def stop_at_step_4(line: str) -> None:
        if line.startswith("step 4 ("):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bisect(request, log=stop_at_step_4)
    state = BisectState.model_validate(json.loads((out / STATE_FILE).read_text()))
    assert [s.verdict for s in state.steps] == [Verdict.GOOD, Verdict.BAD, Verdict.SKIP, None]
    assert state.steps[2].sha == shas[broken] and "exit 2" in state.steps[2].detail

    # the same command resumes; it re-runs step 4 into its own folder and finds the seeded commit
    code = main(["bisect", str(case), "--good", shas[0], "--bad", "main", "--out", str(out)])
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
    # the user's checkout untouched, every worktree gone
    assert git(repo, "status", "--porcelain") == "" and git(repo, "rev-parse", "HEAD") == shas[-1]
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (out / "worktrees").exists()

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
