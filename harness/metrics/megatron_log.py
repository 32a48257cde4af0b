"""Megatron-LM's training log lines -> :class:`StepMetrics`.

Megatron's ``training_log`` (``megatron/training/training.py``) prints, on the last rank, one line
per ``--log-interval`` iterations::

     [2025-01-01 12:00:00.000000] iteration        3/      10 | consumed samples:           96 |
     elapsed time per iteration (ms): 512.3 | learning rate: 1.500000E-04 | global batch size:
     32 | lm loss: 1.052443E+01 | loss scale: 1.0 | grad norm: 5.125 | number of skipped
     iterations:   0 | number of nan iterations:   0 |

(one line), and ``report_memory`` the memory of each data-parallel rank 0 (one line each)::

    [Rank 0] (after 2 iterations) memory (MB) | allocated: 1234.56 | max allocated: 2345.67 |
    reserved: 3000.00 | max reserved: 3000.00

Megatron reports memory after a run's first logged iterations (the first, and the next, which
holds the optimizer's state; again after a ``--load``) and, with ``--log-memory-interval N``,
every N iterations; a trainer of one's own may print it every interval. Every such line is read
(``| total device memory used: ...``, with ``--log-device-memory-used``, is left alone); its step
is the iteration it names. Lines of other memory reports (``(before save_checkpoint for
iteration N)``) name no step and are left alone.

Each iteration line is a step; its fields are picked by :data:`LOG_KEYS` (field -> the name
Megatron prints; a case may name others, e.g. its MoE ``load_balancing_loss`` as ``aux_loss``).
Values are averages over the log interval, so a case logs every iteration (``--log-interval 1``).
Any other line is not Megatron's and is left alone; an iteration line that does not parse, or an
iteration logged twice, is a :class:`MetricsError` naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Optional

from .errors import MetricsError
from .series import StepMetrics

# field -> the key Megatron prints on an iteration line
LOG_KEYS: Mapping[str, str] = {
    "loss": "lm loss",
    "grad_norm": "grad norm",
    "lr": "learning rate",
    "params_norm": "params norm",  # with --log-params-norm
    "step_time_s": "elapsed time per iteration (ms)",
    "skipped": "number of skipped iterations",
    "nan": "number of nan iterations",
}
_MIB = 1024.0 * 1024.0
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)((?: \| [^|]+)+)\s*$")
# report_memory's keys -> the fields they fill (MB -> bytes)
_MEMORY_KEYS = {"allocated": "allocated_bytes", "max allocated": "max_allocated_bytes",
                "reserved": "reserved_bytes"}


def _fields(text: str, path: Path, line: int) -> dict[str, str]:
    """``key: value |`` parts of a line -> {key: value text}."""
    out = {}
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.rpartition(":")
        if not sep or not key.strip():
            raise MetricsError(path, f"cannot read '{part}' of a Megatron log line (expected "
                                     "'name: value')", line)
        out[key.strip()] = value.strip()
    return out


def _number(text: str, key: str, path: Path, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise MetricsError(path, f"'{key}: {text}' is not a number", line) from None


def _iteration(match: re.Match[str], keys: Mapping[str, str], path: Path,
               line: int) -> dict[str, float]:
    found = _fields(match.group(3), path, line)
    values = {}
    for name, key in keys.items():
        if key in found:
            value = _number(found[key], key, path, line)
            values[name] = value / 1000.0 if key.endswith("(ms)") else value
    return values


def _memory(match: re.Match[str], path: Path, line: int) -> dict[str, float]:
    found = _fields(match.group(3), path, line)
    return {name: _number(found[key], key, path, line) * _MIB
            for key, name in _MEMORY_KEYS.items() if key in found}


def read_megatron_log(path: Path, keys: Optional[Mapping[str, str]] = None,
                      start: int = 0, end: Optional[int] = None) -> StepMetrics:
    """The steps of one log file (see the module doc); ``keys``: field -> printed key (default
    :data:`LOG_KEYS`); ``start``: the byte offset the run's lines begin at (a log appended to by
    an earlier run); ``end``: where they end (None: the end of the file). A MetricsError naming the file (and line) for one that cannot be read."""
    path = Path(path)
    keys = dict(LOG_KEYS if keys is None else keys)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MetricsError(path, f"cannot read the log: {exc.strerror or exc}") from None
    text = data[start:end].decode("utf-8", errors="replace")
    first = data[:start].count(b"\n") + 1
    metrics = StepMetrics()
    seen: dict[int, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=first):
        if (m := _ITERATION.search(raw)) is not None:
            step = int(m.group(1))
            if step in seen:
                raise MetricsError(path, f"iteration {step} is logged twice (lines {seen[step]} "
                                         f"and {lineno}): two runs wrote one log", lineno)
            seen[step] = lineno
            metrics.shared[step] = _iteration(m, keys, path, lineno)
        elif (m := _MEMORY.search(raw)) is not None:
            rank, step = int(m.group(1)), int(m.group(2))
            if step < 1:  # before training: no step to put it on
                continue
            metrics.per_rank.setdefault(rank, {})[step] = _memory(m, path, lineno)
    return metrics
