"""Labels: which series of the history a sweep belongs to (docs/history.md, "Labels").

A sweep carries the label it asked for (``--label nightly`` on ``run`` / ``submit``, default
``$DCP_HARNESS_LABEL``; recorded in its manifest's start) or one it gets by itself: a bisect step
is ``bisect`` (bisect sets the variable for its steps and records their sweeps so); a fault drill
(``bench/mutations.py``) is ``drill``; code with local changes is ``dirty`` whatever it asked (it
is not the code of any commit, so it belongs to no commit's series); nothing asked is ``adhoc``.
``history check``, ``show`` and the dashboard follow one label: ``--label``, else
:data:`NIGHTLY` when the history holds a sweep labelled so, else :data:`DEFAULT_LABEL`.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from .schema import DEFAULT_LABEL

NIGHTLY = "nightly"
BISECT_LABEL = "bisect"
DRILL_LABEL = "drill"
DIRTY_LABEL = "dirty"
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LABEL_ENV = "DCP_HARNESS_LABEL"  # the default of --label (a nightly job may set it once)

__all__ = ["BISECT_LABEL", "DEFAULT_LABEL", "DIRTY_LABEL", "DRILL_LABEL", "LABEL_ENV", "LABEL_PATTERN",
           "NIGHTLY", "followed", "sweep_label"]


def sweep_label(asked: Optional[str], dirty: Optional[bool]) -> str:
    """The label a sweep is kept under: ``dirty`` for code with local changes, else the one it
    asked for, else :data:`DEFAULT_LABEL`."""
    if dirty:
        return DIRTY_LABEL
    return asked or DEFAULT_LABEL


def followed(asked: Optional[str], present: Iterable[str]) -> str:
    """The label a reader follows: ``asked``, else nightly where there is one, else adhoc."""
    if asked:
        return asked
    return NIGHTLY if NIGHTLY in set(present) else DEFAULT_LABEL
