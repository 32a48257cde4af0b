"""The sweep sinks of the CLI: what gets a sweep once its verdicts are written (``run``,
``collect``, ``submit --wait``: ``launch.pipeline.deliver``, once per finished collection).

Each sink is a ``Callable[[Collection], None]`` (``launch.pipeline.SweepSink``). The one sink
today is the history database (docs/history.md): every finished sweep goes into it, with the
verdicts this process judged (nothing is judged twice). A history problem is one line on stderr
and never changes the gate's verdict: the sweep folder stays the source of truth, and
``dcp-harness history add SWEEP`` adds it later.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Optional, TextIO

from harness.errors import ConfigError
from harness.history import record_sweep
from harness.history.labels import DEFAULT_LABEL, DIRTY_LABEL, LABEL_ENV, LABEL_PATTERN
from harness.launch.pipeline import SweepSink
from harness.launch.sweep_backend import Collection


def add_history_arguments(parser: argparse.ArgumentParser) -> None:
    """``--history URL`` / ``--no-history`` of the commands whose sweeps end in the sinks."""
    parser.add_argument("--history", default=None, metavar="URL",
                        help="the history database the finished sweep goes into (default: "
                             "$DCP_HARNESS_HISTORY, else results/history.sqlite here; "
                             "docs/history.md)")
    parser.add_argument("--no-history", action="store_true",
                        help="do not record the sweep in the history database")


def _label(text: str) -> str:
    if not LABEL_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a label: use letters, digits and . _ - (up to 64), e.g. nightly")
    return text


def add_label_argument(parser: argparse.ArgumentParser) -> None:
    """``--label L`` of the commands that start a sweep (``run``, ``submit``)."""
    parser.add_argument("--label", type=_label, default=os.environ.get(LABEL_ENV) or None,
                        metavar="L",
                        help="the history series this sweep belongs to, e.g. nightly (default: "
                             f"${LABEL_ENV}, else {DEFAULT_LABEL}; a sweep of a checkout with "
                             f"local changes is '{DIRTY_LABEL}' whatever it asks; docs/history.md, "
                             "Labels)")


@dataclass(frozen=True)
class HistorySink:
    """Records a finished sweep in the history database at ``url`` (None: the default)."""

    url: Optional[str] = None
    out: Optional[TextIO] = None  # None: sys.stdout / sys.stderr as they are at the call
    err: Optional[TextIO] = None

    def __call__(self, collection: Collection) -> None:
        try:  # the sweep view the collection's reports came from: nothing is judged again
            recorded = record_sweep(collection.out_dir, url=self.url, view=collection.sweep)
        except ConfigError as exc:  # the history's own errors (HistoryError) included
            print(f"history: not recorded ({exc}); add it later with `dcp-harness history add "
                  f"{collection.out_dir}`", file=self.err or sys.stderr, flush=True)
            return
        print(recorded.line(), file=self.out or sys.stdout, flush=True)


def sweep_sinks(args: argparse.Namespace) -> list[SweepSink]:
    """The sinks of this invocation (``args``: its options)."""
    if getattr(args, "no_history", False):
        return []
    return [HistorySink(getattr(args, "history", None))]
