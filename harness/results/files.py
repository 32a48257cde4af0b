"""Standard JSON files written atomically: what every results file of a sweep is made of.

Files are standard JSON: a non-finite float is stored as the string ``"NaN"``, ``"Infinity"``
or ``"-Infinity"`` and read back as a float. Every file gets the mode an ordinary write would
(0666 less the umask), also the atomic ones, so others can read a sweep on a shared filesystem.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar, Union

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")

_NONFINITE_TO_STR = {math.inf: "Infinity", -math.inf: "-Infinity"}
_STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ResultsError(Exception):
    """A results file exists but cannot be used (corrupt line, wrong shape)."""


# --------------------------------------------------------------------------- JSON helpers
def encode_nonfinite(obj: Any) -> Any:
    """Return ``obj`` with non-finite floats replaced by their string names (tuples -> lists)."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        return _NONFINITE_TO_STR.get(obj, obj)
    if isinstance(obj, Mapping):
        return {str(k): encode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_nonfinite(v) for v in obj]
    return obj


def decode_float(value: Any) -> Optional[float]:
    """A JSON number, null or non-finite name -> float or None. Anything else is an error."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ResultsError(f"expected a number, got a boolean {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _STR_TO_NONFINITE:
        return _STR_TO_NONFINITE[value]
    raise ResultsError(f"expected a number, got {value!r}")


def decode_nonfinite(obj: Any) -> Any:
    """``obj`` (parsed JSON) with the non-finite names turned back into floats, at any depth."""
    if isinstance(obj, str) and obj in _STR_TO_NONFINITE:
        return _STR_TO_NONFINITE[obj]
    if isinstance(obj, dict):
        return {k: decode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_nonfinite(v) for v in obj]
    return obj


def dumps(obj: Any, *, indent: Optional[int] = 2) -> str:
    """Standard JSON (non-finite floats as strings)."""
    return json.dumps(encode_nonfinite(obj), indent=indent, allow_nan=False, ensure_ascii=False)


# --------------------------------------------------------------------------- atomic writes
def fsync_dir(path: Path) -> None:
    """fsync a folder, so a file just created or renamed in it survives a crash."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """This process's umask (read from /proc on Linux; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # pragma: no cover - platforms without /proc/self/status
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0666 less the umask."""
    return 0o666 & ~current_umask()


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + os.replace); the file
    gets the mode an ordinary write would (0644 under umask 022), not mkstemp's 0600."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)


def write_text_atomic(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder + fsync + os.replace."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Write ``obj`` as standard JSON atomically (readers see the old file or the new one)."""
    write_text_atomic(path, dumps(obj) + "\n")


# --------------------------------------------------------------------------- reads
def read_noting(read: Callable[[], T], problems: list[str], default: T) -> T:
    """``read()``; ``default`` when the file it reads cannot be used (ResultsError, OSError),
    the reason appended to ``problems`` (a reader that reports what it cannot read and goes on)."""
    try:
        return read()
    except (ResultsError, OSError) as exc:
        problems.append(str(exc))
        return default


def read_json(path: PathLike) -> Any:
    """Parse a JSON file; raises ResultsError naming the file when it is not valid JSON
    (torn, truncated or not UTF-8)."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ResultsError(f"{p}: not valid JSON ({exc}); delete it and re-run the case") from exc
