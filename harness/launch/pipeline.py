"""One sweep pipeline: a sweep's cases go to a backend, which runs them where it runs them (this
machine, a Slurm cluster) and collects their verdicts; the pipeline's end hands the finished
sweep folder to the sweep sinks, once, in one place for every backend.

The shape is submitit's ``Executor`` / ``Job`` (``submitit/core/core.py``): one interface, local
and cluster implementations behind it, interchangeable. A :class:`SweepBackend` has four verbs,
each taking the sweep folder (everything a backend knows of a sweep is in that folder, so a
later process can ``state`` / ``wait`` / ``collect`` what an earlier one submitted):

* ``submit(plans, out_dir, start)``: list the cases in the sweep's manifest, write their case
  folders (``case.json``, ``plan.json``) and start them: the Slurm backend queues a job per case;
  the local backend, whose arms run in this process, starts them in ``wait`` (submitit's
  ``DebugExecutor`` runs its jobs when their result is asked for, too);
* ``state(out_dir)``: case id -> where the case stands (a ``case_status.CaseStatus``: its
  :data:`CaseState`, arms done, the arm in flight, ...; ``dcp-harness status`` shows them, for a
  sweep of any backend);
* ``wait(out_dir, timeout_s)``: until no case is queued or running (or the time is up);
* ``collect(out_dir)``: the outcomes of the cases that ended, their verdicts and the sweep's
  reports: a :class:`Collection`.

``dcp-harness run`` is the local backend's :func:`run_to_end` (submit, wait, collect);
``submit`` / ``collect`` are the Slurm backend's verbs, and ``submit --wait`` /
``collect --wait`` its :func:`finish`; ``status`` is the ``state`` of whichever backend runs the
folder (``cli.status_cmd.sweep_backend``). Both runs end in :func:`deliver`: each sweep sink (a
``Callable[[Collection], None]`` the CLI passes in: the history database recording the sweep,
``cli.sinks``) gets the finished collection (its sweep folder, the verdicts judged in this process,
the reports) once per finished collection (every case judged, nothing queued, running or
re-submitted).

Adding a backend is one module with a test of its own: a class with these four verbs
(``launch.local_backend.LocalBackend``, ``launch.slurm.backend.SlurmBackend``), and the line of
``cli.status_cmd.sweep_backend`` that knows its sweep folders.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from harness.caseplan import CasePlan
from harness.compare import CaseVerdict
from harness.launch.case_status import CaseState, CaseStatus, judged_state
from harness.results import SweepStart

__all__ = ["CaseState", "CaseStatus", "Collection", "SweepBackend", "SweepSink", "deliver", "finish",
           "judged_state", "run_to_end"]

# Called with the finished collection (its sweep folder, the verdicts judged in this process and
# the reports written) once a collection is finished (module doc).
SweepSink = Callable[["Collection"], None]


@dataclass(frozen=True)
class Collection:
    """What one ``collect`` of a sweep found and wrote.

    ``still_active``: cases still queued or running (not collected); ``resubmitted``: cases the
    backend queued again (Slurm's ``--retry-infra``: wait for them and collect again);
    ``problems``: cases that could not be judged, each a line naming the case; ``verdicts``: the
    verdicts judged in this process; ``summary``: the reports written (``report.ReportFiles``)
    where the backend keeps them."""

    out_dir: Path
    still_active: tuple[str, ...] = ()
    resubmitted: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    verdicts: tuple[CaseVerdict, ...] = ()
    summary: Any = None

    @property
    def finished(self) -> bool:
        """Every case is judged: nothing queued, running or queued again."""
        return not self.still_active and not self.resubmitted


class SweepBackend(Protocol):
    """Where a sweep's cases run (module doc)."""

    def submit(self, plans: Sequence[CasePlan], out_dir: Path,
               start: Optional[SweepStart] = None) -> None: ...

    def state(self, out_dir: Path) -> Mapping[str, CaseStatus]: ...

    def wait(self, out_dir: Path, timeout_s: Optional[float] = None) -> None: ...

    def collect(self, out_dir: Path) -> Collection: ...


def deliver(collection: Collection, sinks: Sequence[SweepSink]) -> None:
    """The pipeline's end, for every backend: each sink gets ``collection`` (its ``out_dir``, the
    verdicts and reports) once when it is finished; nothing while cases are queued, running or
    queued again."""
    if collection.finished:
        for sink in sinks:
            sink(collection)


def finish(backend: SweepBackend, out_dir: Path, sinks: Sequence[SweepSink] = (), *,
           wait: bool = True, timeout_s: Optional[float] = None,
           on_collect: Optional[Callable[[Collection], None]] = None,
           clock: Callable[[], float] = time.monotonic) -> Collection:
    """Collect a submitted sweep (after waiting for it, with ``wait``), again after every wait
    while the backend re-submits cases, then :func:`deliver` the last collection to ``sinks``.
    ``timeout_s`` bounds all the waiting together; ``on_collect`` sees every collection (the CLI
    prints it)."""
    out_dir = Path(out_dir)
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        if wait:
            backend.wait(out_dir, None if deadline is None else max(0.0, deadline - clock()))
        collection = backend.collect(out_dir)
        if on_collect is not None:
            on_collect(collection)
        if not (wait and collection.resubmitted and not collection.still_active):
            break
    deliver(collection, sinks)
    return collection


def run_to_end(backend: SweepBackend, plans: Sequence[CasePlan], out_dir: Path,
               start: Optional[SweepStart] = None, sinks: Sequence[SweepSink] = (), *,
               timeout_s: Optional[float] = None,
               on_collect: Optional[Callable[[Collection], None]] = None) -> Collection:
    """Submit ``plans`` to ``backend``, wait for them, collect them and deliver the sweep to
    ``sinks`` (:func:`finish`)."""
    backend.submit(plans, Path(out_dir), start)
    return finish(backend, out_dir, sinks, timeout_s=timeout_s, on_collect=on_collect)
