"""The sweep's run lock (``<sweep>/.run.lock``): held while a ``dcp-harness run`` (or ``report``)
writes into the folder, so a second writer is refused and a judge can tell a sweep still being
written from a finished one."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from harness.errors import ConfigError

from .files import PathLike

LOCK_FILE = ".run.lock"


@contextmanager
def sweep_lock(out_dir: PathLike, busy: str = "wait for it to end or pass another --out"
               ) -> Iterator[None]:
    """Hold ``<out_dir>/.run.lock`` while writing there: a second ``dcp-harness run`` into the
    same folder (resuming while the first still runs) would run the same arms twice into the same
    files, and a report written meanwhile would describe a sweep half done. ConfigError ending in
    ``busy`` when another process holds it (released when that one exits, however it exits)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK_FILE, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise ConfigError(f"{out_dir} is being written by another sweep ({holder}); "
                              f"{busy}") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        fh.flush()
        try:
            yield
        finally:
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_holder(sweep_dir: PathLike) -> Optional[str]:
    """Who holds the sweep's run lock (``pid N on HOST``), or None when nobody does: no lock
    file, or a lock nobody holds (a run that ended, also one that was killed). Only reads."""
    path = Path(sweep_dir) / LOCK_FILE
    if not path.is_file():
        return None
    with open(path, "r", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return fh.read().strip() or "another process"
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None
