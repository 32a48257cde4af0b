"""The first bad commit: ``dcp-harness bisect`` (docs/bisect.md).

``driver.bisect`` checks a request (``target``: what runs, from which repository; ``git``: the
commits), verifies both ends, then searches (``search``: pure), running each step as a sweep
through the ``dcp-harness`` command line in a worktree of its own (``step``), and keeps the
resumable state in ``<out>/bisect.json`` (``state``).
"""

from harness.bisect.driver import Outcome, Request, bisect, default_out, plan
from harness.bisect.search import Found, Probe, Verdict, next_step
from harness.bisect.state import STATE_FILE, BisectState, Step
from harness.bisect.step import FailedCheck

__all__ = ["BisectState", "FailedCheck", "Found", "Outcome", "Request", "STATE_FILE",
           "Step", "Probe", "Verdict", "bisect", "default_out", "next_step", "plan"]
