"""An exception the command line did not expect: a bug in dcp-harness, never a regression.

``main`` hands every exception that no subcommand turned into an error of its own to
:func:`report_internal_error`: the full traceback goes to a file (in the folder the subcommand
works on, where it names one that exists: its sweep, ``--out`` or bisect folder; else the
system's temporary folder), stderr gets ONE line saying what broke and where the traceback is,
and the exit code is 2, the gate's "error without regressions". Python's default (a traceback
and exit 1) would tell CI that a check failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence, TextIO

from harness import __version__

EXIT_INTERNAL = 2
PREFIX = "internal-error"
# The arguments that name the folder a subcommand works on (a sweep, `--out`, a bisect folder).
_FOLDER_ARGS = ("dir", "out")


def work_folder(args: Optional[argparse.Namespace]) -> Optional[Path]:
    """The existing folder the subcommand was given (``DIR`` or ``--out``), if any."""
    for name in _FOLDER_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, (str, os.PathLike)) and Path(value).is_dir():
            return Path(value)
    return None


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _text(exc: BaseException, argv: Sequence[str]) -> str:
    return (f"dcp-harness {__version__}: internal error (a bug in dcp-harness, not in the "
            f"sweep)\ncommand: dcp-harness {' '.join(argv)}\ncwd: {os.getcwd()}\n"
            f"time: {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def write_traceback(exc: BaseException, argv: Sequence[str], folder: Optional[Path]) -> Path:
    """Write the report of ``exc`` into ``folder`` (else the temporary folder; also when
    ``folder`` cannot be written) and return its path. OSError when neither can be written."""
    text = _text(exc, argv)
    name = f"{PREFIX}-{_stamp()}-{os.getpid()}"
    if folder is not None:
        path = folder.resolve() / f"{name}.txt"
        try:
            path.write_text(text)
            return path
        except OSError:
            pass
    fd, where = tempfile.mkstemp(prefix=f"dcp-harness-{name}-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(where)


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (a message of several lines joined)."""
    message = " ".join(str(exc).split())
    return type(exc).__name__ + (f": {message}" if message else "")


def report_internal_error(exc: BaseException, argv: Sequence[str],
                          args: Optional[argparse.Namespace] = None,
                          err: Optional[TextIO] = None) -> int:
    """One line on ``err`` (stderr) naming ``exc`` and the file its traceback went to; exit 2."""
    err = err or sys.stderr
    try:
        path = write_traceback(exc, argv, work_folder(args))
        where = f"traceback in {path}"
    except OSError as write_exc:  # nowhere to write: the traceback goes to stderr after all
        where = f"traceback not written ({one_line(write_exc)}); it follows"
        print(f"internal error in dcp-harness: {one_line(exc)} ({where})", file=err)
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=err)
        return EXIT_INTERNAL
    print(f"internal error in dcp-harness: {one_line(exc)} ({where}; please report it with that "
          "file)", file=err)
    return EXIT_INTERNAL
