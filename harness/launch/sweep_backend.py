"""The sweep backend seam: where a sweep's cases run, and what one ``collect`` of them gives.

The shape is submitit's ``Executor`` / ``Job`` (``submitit/core/core.py``): one interface, local
and cluster implementations behind it, interchangeable. A :class:`SweepBackend` has four verbs,
each taking the sweep folder (everything a backend knows of a sweep is in that folder, so a
later process can ``state`` / ``wait`` / ``collect`` what an earlier one submitted):

* ``submit(plans, out_dir, start)``: list the cases in the sweep's manifest, write their case
  folders (``case.json``, ``plan.json``) and start them: the Slurm backend queues a job per case;
  the local backend, whose arms run in this process, starts them in ``wait`` (submitit's
  ``DebugExecutor`` runs its jobs when their result is asked for, too). It answers with what it
  queued (:class:`Queued`, one per case started, with the backend's word for where);
* ``state(out_dir)``: case id -> where the case stands (a ``case_status.CaseStatus``: its
  ``CaseState``, arms done, the arm in flight, ...; ``dcp-harness status`` shows them);
* ``wait(out_dir, timeout_s)``: until no case is queued or running (or the time is up);
* ``collect(out_dir)``: judges every case that ended and has no verdict yet, once, writes the
  sweep's reports from those verdicts, and answers with a :class:`Collection`: the verdicts it
  judged, the report files and the sweep view they were written from (the one the history sink
  and the gate reuse: nothing judges a case again in the same process).

A backend is a folder beside ``local/`` and ``slurm/`` whose ``backend`` module is a
:class:`BackendKind`: ``owns(sweep_dir)`` tells its sweep folders apart, ``follow(options)``
gives a backend that follows a folder some earlier command started (``status``, ``collect``:
``launch.backends.backend_of``); the command that starts a sweep (``run``, ``submit``) makes its
backend itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, Sequence

from harness.caseplan import CasePlan
from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict
from harness.launch.case_status import CaseStatus
from harness.report import ReportFiles, SweepView
from harness.results import SweepStart


@dataclass(frozen=True)
class Queued:
    """A case a backend started or queued: ``where`` is the backend's word for it (``job 1234``
    for Slurm; '' where the case runs in this process)."""

    case_id: str
    where: str = ""

    def line(self) -> str:
        return f"{self.case_id} ({self.where})" if self.where else self.case_id


@dataclass(frozen=True)
class Collection:
    """What one ``collect`` of a sweep found, judged and wrote.

    ``reports``: the report files written from this collection (``report.ReportFiles``; its
    ``sweep`` is the sweep view every case's verdict is in: :attr:`sweep`); ``verdicts``: the
    verdicts this ``collect`` judged (the cases that ended since the last one); ``still_active``:
    cases still queued or running (not judged); ``resubmitted``: cases the backend queued again
    (Slurm's ``--retry-infra``: wait for them and collect again); ``problems``: cases that could
    not be judged, each a line naming the case."""

    out_dir: Path
    reports: ReportFiles
    verdicts: tuple[CaseVerdict, ...] = ()
    still_active: tuple[str, ...] = ()
    resubmitted: tuple[Queued, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def sweep(self) -> SweepView:
        """The sweep as the reports show it: every case with its one verdict."""
        return self.reports.sweep

    @property
    def finished(self) -> bool:
        """Every case is judged: nothing queued, running or queued again."""
        return not self.still_active and not self.resubmitted


class SweepBackend(Protocol):
    """Where a sweep's cases run (module doc)."""

    def submit(self, plans: Sequence[CasePlan], out_dir: Path,
               start: Optional[SweepStart] = None) -> tuple[Queued, ...]: ...

    def state(self, out_dir: Path) -> Mapping[str, CaseStatus]: ...

    def wait(self, out_dir: Path, timeout_s: Optional[float] = None) -> None: ...

    def collect(self, out_dir: Path) -> Collection: ...


@dataclass(frozen=True)
class FollowOptions:
    """How a command follows a sweep folder (``status``, ``collect``): the skip kinds the gate
    accepts, how often an infrastructure failure is queued again (a backend that cannot queue
    again refuses a nonzero ``retry_infra``), the concurrency of such re-submissions, the seconds
    between two polls while waiting, and who sees every poll's statuses."""

    allowed_skips: tuple[str, ...] = DEFAULT_ALLOWED_SKIPS
    retry_infra: int = 0
    max_parallel: Optional[int] = None
    poll_s: float = 2.0
    on_poll: Optional[Callable[[list[CaseStatus]], None]] = None


class BackendKind(Protocol):
    """A backend's module (``launch/<name>/backend.py``) as ``launch.backends`` sees it."""

    NAME: str

    def owns(self, sweep_dir: Path) -> bool:
        """Whether ``sweep_dir`` holds a sweep this backend started."""

    def follow(self, options: FollowOptions) -> SweepBackend:
        """A backend that follows (``state`` / ``wait`` / ``collect``) a sweep it started."""
