"""The one error of the metrics readers: a source that cannot be read, named by file (and line)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union


class MetricsError(ValueError):
    """A training command's metrics could not be read: ``FILE[:LINE]: what was wrong`` (and how to
    fix it). Raised by every reader of :mod:`harness.metrics`; the launcher turns it into the
    arm's error."""

    def __init__(self, path: Union[str, Path], message: str, line: Optional[int] = None) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {message}")
