"""The binary search itself: pure functions of the commit line and the verdicts so far.

``commits`` is the line from the good end (excluded) to the bad end (included, last), oldest
first. The search keeps the last commit known good (``lo``, -1 for the good end itself) and the
first known bad (``hi``); it tests the untested commit nearest the middle of ``lo..hi`` that has
not been skipped, as ``git bisect`` does when ``git bisect run`` answers 125 (skip) for a commit:
a skipped commit is passed over and its neighbours tested instead. When nothing between ``lo`` and
``hi`` is left to test, ``hi`` is the first bad commit, unless skipped commits lie between: then
the first bad commit is one of them or ``hi`` (:class:`Found` says which).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Optional, Sequence, Union


class Verdict(str, Enum):
    GOOD = "good"  # the sweep passed (exit 0)
    BAD = "bad"  # a check failed (exit 1)
    SKIP = "skip"  # an error or infrastructure failure (exit 2, a crash): no verdict, as 125


@dataclass(frozen=True)
class Probe:
    """Test this commit next."""

    sha: str


@dataclass(frozen=True)
class Found:
    """The search is over: ``first_bad`` is the first bad commit when ``maybe`` is empty; else the
    first bad commit is one of ``maybe`` (commits skipped, oldest first) or ``first_bad``."""

    first_bad: str
    last_good: Optional[str]  # None: the good end itself
    maybe: tuple[str, ...] = ()

    @property
    def unique(self) -> bool:
        return not self.maybe


def bounds(commits: Sequence[str], verdicts: Mapping[str, Verdict]) -> tuple[int, int]:
    """(lo, hi): the index of the last good commit below the first bad one (-1: the good end)
    and of the first bad one. ValueError when the bad end (the last commit) has no bad verdict
    (the search starts only once both ends are verified)."""
    if not commits or verdicts.get(commits[-1]) is not Verdict.BAD:
        raise ValueError("the bad end must be verified bad before the search")
    hi = min(i for i, c in enumerate(commits) if verdicts.get(c) is Verdict.BAD)
    lo = max((i for i in range(hi) if verdicts.get(commits[i]) is Verdict.GOOD), default=-1)
    return lo, hi


def next_step(commits: Sequence[str], verdicts: Mapping[str, Verdict]) -> Union[Probe, Found]:
    """What to do next: the commit to test, or the answer (module doc)."""
    lo, hi = bounds(commits, verdicts)
    untested = [i for i in range(lo + 1, hi) if commits[i] not in verdicts]
    if untested:
        middle = (lo + hi) / 2
        return Probe(commits[min(untested, key=lambda i: (abs(i - middle), i))])
    skipped = tuple(commits[i] for i in range(lo + 1, hi)
                    if verdicts.get(commits[i]) is Verdict.SKIP)
    return Found(commits[hi], commits[lo] if lo >= 0 else None, skipped)


def steps_bound(count: int) -> int:
    """The most commits a search over ``count`` commits tests without skips (ends aside):
    ceil(log2(count))."""
    return max(0, (count - 1).bit_length()) if count > 1 else 0
