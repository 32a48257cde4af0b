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
up to ``every_case_up_to`` cases, else the ones that did not pass).
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
                self._drawn[(case.case_id, pair.pair)] = (pair, case.arms, entry_svg(case, pair))
        except Exception:  # noqa: BLE001  the page draws it again, and says what is wrong
            return

    def finish(self) -> None:
        """Wait for every figure asked for so far (nothing is drawn ahead after this)."""
        with self._lock:
            pool, self._pool, self.enabled = self._pool, None, False
        if pool is not None:
            pool.shutdown(wait=True)

    def close(self) -> None:
        """Stop drawing: figures not started yet are left out, the one being drawn finishes."""
        with self._lock:
            pool, self._pool, self.enabled = self._pool, None, False
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

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
