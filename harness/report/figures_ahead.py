"""The page's figures drawn while the sweep still runs: each case's once it is judged.

Drawing a pair's curves (``pair_figures.entry_svg``, matplotlib) costs ~0.1 s a figure, ~2-3 s for
the focused suite; drawn after the last arm, all of it sits on the run's critical path with the
other CPU cores idle. :class:`FiguresAhead` draws each judged case's figures in one thread of its
own while later arms run (``case_judged``), and the page takes them from it (``figure``, a
``page.FigureFn``) after waiting for that thread (``finish``).

A figure drawn ahead is used only for the very pair and records the page shows: its pair verdict
and its arms (steps, outcome) must equal the page's, else it is drawn again there, so the page is
the one drawing everything at the end would give. One thread draws, and nothing else draws
until it finished (matplotlib keeps caches that are not shared safely between threads). A
figure that failed to draw ahead is drawn again by the page (which reports what went wrong).
Only the cases the page draws are drawn ahead (``load.shown_in_full``: every case of a sweep of
up to ``every_case_up_to`` cases, else the ones that did not pass). Nothing is drawn while an
arm that must run alone runs (its step time is judged: ``launch.local.gpu_demand.
timing_judged_arms``): :meth:`FiguresAhead.hold` waits for the figure being drawn, then keeps the
thread still until :meth:`FiguresAhead.release`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Optional, Sequence

from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict, PairVerdict

from .load import EVERY_CASE_UP_TO, ArmView, CaseView, judged_case
from .pair_figures import entry_svg
from .plots import matplotlib_available


class FiguresAhead:
    """Figures of the cases of the sweep in ``sweep_dir`` (of ``total_cases`` cases), drawn as
    each is judged (module doc). Call :meth:`finish` (or :meth:`close`) before drawing anything
    else."""

    def __init__(self, sweep_dir: Path, total_cases: int,
                 allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS,
                 every_case_up_to: int = EVERY_CASE_UP_TO) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.allowed_skips = tuple(allowed_skips)
        self.only_not_passing = total_cases > every_case_up_to
        self.enabled = True  # until finish(); without matplotlib the drawing thread draws nothing
        self._drawn: dict[tuple[str, str], tuple[PairVerdict, Mapping[str, ArmView],
                                                 Optional[str]]] = {}
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._held: set[object] = set()  # what holds the drawing still (hold / release)
        self._still = threading.Condition()  # guards _held; held by the thread while it draws

    def case_judged(self, verdict: CaseVerdict) -> None:
        """Draw the figures of the case judged to ``verdict`` (in the drawing thread)."""
        if not self.enabled or (self.only_not_passing and verdict.status == "pass"):
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="page-figures")
            self._pool.submit(self._draw, verdict)

    def _draw(self, verdict: CaseVerdict) -> None:
        if not matplotlib_available():  # imported here, in the drawing thread, not on the way
            return  # to the first arm (0.3-1 s); the page says there are no figures
        try:
            case = judged_case(self.sweep_dir / verdict.case_id, verdict, self.allowed_skips)
            for pair in case.verdict.pairs:
                with self._still:  # one figure at a time, none while an arm runs alone
                    self._still.wait_for(lambda: not self._held)
                    self._drawn[(case.case_id, pair.pair)] = (pair, case.arms,
                                                              entry_svg(case, pair))
        except Exception:  # noqa: BLE001  the page draws it again, and says what is wrong
            return

    def hold(self, key: object) -> None:
        """Keep the drawing still for ``key`` (an arm that runs alone): returns once the figure
        being drawn, if any, is done; nothing is drawn until every key is released."""
        with self._still:
            self._held.add(key)

    def release(self, key: object) -> None:
        """Let the drawing go on as far as ``key`` is concerned (a key not held: nothing)."""
        with self._still:
            self._held.discard(key)
            self._still.notify_all()

    def finish(self) -> None:
        """Wait for every figure asked for so far (nothing is drawn ahead after this)."""
        self._stop(cancel=False)

    def close(self) -> None:
        """Stop drawing: figures not started yet are left out, the one being drawn finishes."""
        self._stop(cancel=True)

    def _stop(self, cancel: bool) -> None:
        with self._lock:
            pool, self._pool, self.enabled = self._pool, None, False
        with self._still:  # nothing runs alone any more: a held thread goes on (or stops)
            self._held.clear()
            self._still.notify_all()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=cancel)

    def figure(self, case: CaseView, pair: PairVerdict) -> Optional[str]:
        """``pair``'s figure in ``case`` (``page.FigureFn``): the one drawn ahead where its pair
        and arms are the page's, else drawn now."""
        self.finish()
        ahead = self._drawn.get((case.case_id, pair.pair))
        if ahead is not None and ahead[0] == pair and ahead[1] == case.arms:
            return ahead[2]
        return entry_svg(case, pair)

    def drawn(self) -> frozenset[tuple[str, str]]:
        """The (case, pair) figures drawn ahead so far."""
        return frozenset(self._drawn)
