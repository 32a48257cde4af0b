"""The sweep sinks of the CLI: what gets a sweep folder once its verdicts are written (``run``,
``collect``, ``submit --wait``: ``launch.pipeline.deliver``, once per finished collection).

Each sink is a ``Callable[[Path], None]`` (``launch.pipeline.SweepSink``); a sink that records
sweeps elsewhere (a history database) is added here, in one place for both backends.
"""

from __future__ import annotations

import argparse

from harness.launch.pipeline import SweepSink


def sweep_sinks(args: argparse.Namespace) -> list[SweepSink]:
    """The sinks of this invocation (``args``: its options). None so far."""
    return []
