"""`dcp-harness bisect`'s report and exit code for each way a bisect ends (no sweep runs)."""

from __future__ import annotations

from pathlib import Path

from harness.bisect import BisectState, Found, Outcome, Step, Verdict
from harness.bisect.state import BisectKey, Mode, Role
from harness.cli.bisect_cmd import EXIT_FOUND, EXIT_NOT_FOUND, exit_code, report_lines

KEY = BisectKey(repo="/r", mode=Mode.COMMAND, good="g" * 40, bad="c" * 40, paths=("/c.yaml",))


def state(*verdicts: tuple[str, Verdict]) -> BisectState:
    steps = tuple(Step(n=i + 1, sha=sha * 40, subject=f"subject {sha}", role=Role.SEARCH,
                       sweep=f"steps/{i + 1:02d}/sweep", started="t", verdict=v, exit_code=0)
                  for i, (sha, v) in enumerate(verdicts))
    return BisectState(key=KEY, commits=("a" * 40, "b" * 40, "c" * 40), steps=steps)


def test_only_skipped_commits_left_lists_every_candidate_and_is_not_found(tmp_path: Path) -> None:
    found = Found(first_bad="c" * 40, last_good=None, maybe=("a" * 40, "b" * 40))
    outcome = Outcome(tmp_path, state(("a", Verdict.SKIP), ("b", Verdict.SKIP), ("c", Verdict.BAD)),
                      found=found)
    lines = report_lines(outcome)
    assert "only skipped commits are left: the first bad commit is one of" in lines
    assert [ln for ln in lines if ln.startswith("  ") and "subject" in ln] == [
        f"  {'a' * 40} subject a", f"  {'b' * 40} subject b", f"  {'c' * 40} subject c"]
    assert exit_code(outcome) == EXIT_NOT_FOUND


def test_a_unique_answer_is_found_and_a_refusal_is_not(tmp_path: Path) -> None:
    done = Outcome(tmp_path, state(("c", Verdict.BAD)), found=Found("c" * 40, "b" * 40))
    assert f"first bad commit: {'c' * 40} subject c" in report_lines(done)
    assert exit_code(done) == EXIT_FOUND
    refused = Outcome(tmp_path, state(("g", Verdict.BAD)), refused="the good end ... fails")
    assert "refused: the good end ... fails" in report_lines(refused)
    assert exit_code(refused) == EXIT_NOT_FOUND
