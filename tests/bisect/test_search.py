"""The binary search (harness.bisect.search): pure, so every line shape is tried."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bisect.search import Found, Probe, Verdict, next_step, steps_bound


def run_search(n: int, first_bad: int,
               broken: frozenset[int] = frozenset()) -> tuple[Found, list[int]]:
    """Search a line of ``n`` commits whose first bad one is ``first_bad`` and whose ``broken``
    ones are skipped; the answer and the indices tested, in order."""
    commits = [f"c{i}" for i in range(n)]
    verdicts = {commits[-1]: Verdict.BAD}
    tested = []
    while True:
        decision = next_step(commits, verdicts)
        if isinstance(decision, Found):
            return decision, tested
        i = commits.index(decision.sha)
        assert decision.sha not in verdicts, "a commit is tested twice"
        tested.append(i)
        verdicts[decision.sha] = (Verdict.SKIP if i in broken else
                                  Verdict.BAD if i >= first_bad else Verdict.GOOD)


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
@settings(max_examples=100, deadline=None)
def test_finds_the_first_bad_commit_in_log2_steps(case: tuple[int, int]) -> None:
    n, first_bad = case
    found, tested = run_search(n, first_bad)
    assert found.unique and found.first_bad == f"c{first_bad}"
    assert found.last_good == (f"c{first_bad - 1}" if first_bad else None)
    assert len(tested) <= steps_bound(n)


@given(st.integers(2, 120).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(0, n - 1), st.frozensets(st.integers(0, n - 2), max_size=n // 3))))
@settings(max_examples=100, deadline=None)
def test_skipped_commits_are_passed_over_and_named_when_they_hide_the_answer(
        case: tuple[int, int, frozenset[int]]) -> None:
    n, first_bad, broken = case
    found, tested = run_search(n, first_bad, broken)
    answer = f"c{first_bad}"
    if found.unique:
        assert found.first_bad == answer
    else:  # the first bad commit is one of the skipped ones or the first known bad one
        assert answer in (*found.maybe, found.first_bad)
        assert all(int(c[1:]) in broken for c in found.maybe)
    if first_bad not in broken and first_bad - 1 not in broken:
        assert found.unique and found.first_bad == answer


def test_a_skip_moves_to_the_neighbour_of_the_middle() -> None:
    commits = [f"c{i}" for i in range(9)]
    verdicts = {"c8": Verdict.BAD}
    assert next_step(commits, verdicts) == Probe("c3")  # middle of -1..8 is 3.5: c3 (ties: older)
    verdicts["c3"] = Verdict.SKIP
    assert next_step(commits, verdicts) == Probe("c4")


def test_the_bad_end_must_be_known_bad_before_the_search() -> None:
    with pytest.raises(ValueError, match="bad end"):
        next_step(["a", "b"], {})


@pytest.mark.parametrize("n, bound", [(1, 0), (2, 1), (3, 2), (16, 4), (17, 5), (21, 5),
                                      (1024, 10)])
def test_steps_bound_is_ceil_log2(n: int, bound: int) -> None:
    assert steps_bound(n) == bound
