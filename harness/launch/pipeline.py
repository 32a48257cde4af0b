"""One sweep pipeline: a sweep's cases go to a backend (``sweep_backend.SweepBackend``: this
machine, a Slurm cluster), which runs them, judges each case once and writes the reports
(a ``sweep_backend.Collection``); the pipeline's end hands the finished collection to the sweep
sinks, once, in one place for every backend.

``run_to_end(backend, plans, out, start, sinks)`` = ``submit``, then :func:`finish`: wait and
collect, again while the backend re-submitted cases, then :func:`deliver`: each sweep sink (a
``Callable[[Collection], None]`` the CLI passes in: the history database recording the sweep,
``cli.sinks``) gets the finished collection (its sweep folder, the verdicts, the reports and the
sweep view they came from) once per finished collection (every case judged, nothing queued,
running or re-submitted). ``dcp-harness run`` and ``submit`` are :func:`run_to_end` (``submit``
without ``--wait`` collects once, what has ended by then: the cases it could not queue),
``collect`` is :func:`finish` on the backend that runs the folder (``launch.backends``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.caseplan import CasePlan
from harness.launch.sweep_backend import Collection, Queued, SweepBackend
from harness.results import SweepStart

# Called with the finished collection (its sweep folder, the verdicts, the reports and the sweep
# view) once a collection is finished (module doc).
SweepSink = Callable[[Collection], None]


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
               wait: bool = True, timeout_s: Optional[float] = None,
               on_submit: Optional[Callable[[tuple[Queued, ...]], None]] = None,
               on_collect: Optional[Callable[[Collection], None]] = None) -> Collection:
    """Submit ``plans`` to ``backend`` (``on_submit`` sees what it queued), then :func:`finish`:
    wait for them (unless not ``wait``: collect what has ended by now), collect them and deliver
    the sweep to ``sinks``."""
    queued = backend.submit(plans, Path(out_dir), start)
    if on_submit is not None:
        on_submit(queued)
    return finish(backend, out_dir, sinks, wait=wait, timeout_s=timeout_s, on_collect=on_collect)
