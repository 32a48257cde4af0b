"""Per-step series of an arm's records, the figures its records carry (memory probes, capture
statistics, forward replays per frame) and the tolerance rule two series are compared under.

Tolerances follow numpy/torch ``isclose``: a step passes when ``|a - b| <= max_abs +
max_rel * |ref|`` (a missing bound counts as 0); ``exact`` means bitwise-equal floats.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from harness.results import GraphStats, MemoryProbe, StepRecord, field_of
from harness.spec.schema import LossBound, Tolerance

from .verdicts import Check

if TYPE_CHECKING:
    from .pair import Pair

Record = StepRecord  # what every reader takes (``harness.results``)
Steps = Mapping[int, Sequence[StepRecord]]  # rank -> that rank's step records, in step order

MIB = 2.0 ** 20


def fmt_value(x: Optional[float]) -> str:
    if x is None:
        return "null"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return repr(x)
    return f"{x:.6g}"


def first_rank_records(steps: Steps) -> list[StepRecord]:
    """The records of the lowest rank that has any (losses are identical on every rank)."""
    for rank in sorted(steps):
        if steps[rank]:
            return list(steps[rank])
    return []


def step_series(steps: Steps, key: str, rank: Optional[int] = None) -> dict[int, Optional[float]]:
    """Step -> the field ``key`` of the first record of that step on the lowest rank with
    records, or on ``rank`` (None where the value is missing or not a number)."""
    out: dict[int, Optional[float]] = {}
    for rec in first_rank_records(steps) if rank is None else list(steps.get(rank, ())):
        if rec.step not in out:
            value = field_of(rec, key)
            out[rec.step] = float(value) if is_number(value) else None
    return out


def same_bits(a: float, b: float) -> bool:
    """Bitwise the same float (NaN equal to NaN)."""
    if math.isnan(a) and math.isnan(b):
        return True
    return struct.pack("<d", a) == struct.pack("<d", b)


def _rel(a: float, ref: float) -> float:
    diff = abs(a - ref)
    if diff == 0:
        return 0.0
    return diff / abs(ref) if ref != 0 else math.inf


def compare_series(
    name: str,
    cand: Mapping[int, Optional[float]],
    ref: Mapping[int, Optional[float]],
    bound: Union[str, Tolerance, Mapping[str, Any]],
    labels: tuple[str, str],
) -> Check:
    """Compare two per-step series under ``exact`` or a tolerance; report the worst step.

    Value/bound: exact -> (max |a-b|, 0); max_rel only -> (worst rel, max_rel); max_abs only
    -> (worst abs, max_abs); both -> (|a-b| at the worst step, max_abs + max_rel*|ref| there).
    Steps missing from either arm are compared only where both have them (the arm checks
    report missing steps); a step where a value is null counts as a mismatch.
    """
    tol: Optional[Tolerance]
    if isinstance(bound, str):
        if bound != "exact":
            raise ValueError(f"{name}: a bound is 'exact' or a tolerance, got {bound!r}")
        tol = None
    elif isinstance(bound, Tolerance):
        tol = bound
    else:
        tol = Tolerance.model_validate(bound)
    common = sorted(set(cand) & set(ref))
    if not common:
        return Check(name, None, 0.0 if tol is None else _tol_bound(tol), False,
                     f"no step recorded by both {labels[0]} and {labels[1]}")
    worst_step, worst_ratio = common[0], -1.0
    mismatches = 0
    max_abs_diff = 0.0
    for step in common:
        a, b = cand[step], ref[step]
        if a is None or b is None:
            ratio, diff = math.inf, math.inf
        elif tol is None:
            diff = 0.0 if same_bits(a, b) else (abs(a - b) if not math.isnan(a - b) else math.inf)
            ratio = 0.0 if same_bits(a, b) else math.inf
        else:
            diff = abs(a - b) if not math.isnan(a - b) else math.inf
            allowed = (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * abs(b)
            ratio = 0.0 if diff == 0 else (diff / allowed if allowed > 0 else math.inf)
        if ratio > 1.0 or (tol is None and ratio > 0):
            mismatches += 1
        max_abs_diff = max(max_abs_diff, diff)
        if ratio > worst_ratio:
            worst_step, worst_ratio = step, ratio
    a, b = cand[worst_step], ref[worst_step]
    passed = mismatches == 0
    where = (f"step {worst_step}: {fmt_value(a)} ({labels[0]}) vs {fmt_value(b)} ({labels[1]})")
    if a is not None and b is not None and math.isfinite(a - b):
        where += f", abs {abs(a - b):.2g}, rel {_rel(a, b):.2g}"
    summary = f"{mismatches} of {len(common)} steps out of bound" if mismatches else f"all {len(common)} steps within bound"
    if tol is None:
        return Check(name, max_abs_diff, 0.0, passed,
                     f"exact: {summary}; worst {where}" if not passed else f"exact: bitwise equal over {len(common)} steps")
    if tol.max_rel is not None and tol.max_abs is None:
        value = _rel(a, b) if a is not None and b is not None else math.inf
        bnd = tol.max_rel
    elif tol.max_abs is not None and tol.max_rel is None:
        value = abs(a - b) if a is not None and b is not None and not math.isnan(a - b) else math.inf
        bnd = tol.max_abs
    else:
        value = abs(a - b) if a is not None and b is not None and not math.isnan(a - b) else math.inf
        bnd = (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * (abs(b) if b is not None else 0.0)
    return Check(name, value, bnd, passed, f"{summary}; worst {where}")


def _tol_bound(tol: Tolerance) -> float:
    if tol.max_rel is not None and tol.max_abs is None:
        return tol.max_rel
    return tol.max_abs or 0.0


def records_of(steps: Steps) -> list[tuple[int, StepRecord]]:
    """(rank, record) of every record, ranks ascending."""
    return [(rank, rec) for rank in sorted(steps) for rec in steps[rank]]


def is_number(value: Any) -> bool:
    """An int or float (not a bool), finite or not."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return is_number(value) and math.isfinite(value)


def ran_on_cuda(steps: Steps) -> bool:
    """Whether any record of the arm names a CUDA device (its ``device``)."""
    return any((rec.device or "").startswith("cuda") for _, rec in records_of(steps))


def memory_probes(steps: Steps) -> dict[int, MemoryProbe]:
    """Rank -> the last memory probe it recorded (ranks without one left out)."""
    return {rank: rec.memory_probe for rank, rec in records_of(steps) if rec.memory_probe is not None}


def graph_stats(steps: Steps) -> dict[int, GraphStats]:
    """Rank -> the last capture statistics it recorded (ranks without any left out)."""
    return {rank: rec.graph_stats for rank, rec in records_of(steps) if rec.graph_stats is not None}


def frame_replays(steps: Steps) -> dict[int, dict[tuple[int, int], int]]:
    """Rank -> (CP size, physical slot) -> forward replays over its graphed steps."""
    out: dict[int, dict[tuple[int, int], int]] = {}
    for rank, records in steps.items():
        frames = out.setdefault(rank, {})
        for rec in records:
            for f in rec.replays or ():
                key = (f.cp_size, f.slot)
                frames[key] = frames.get(key, 0) + f.replays
    return out


def frames_text(frames: Mapping[tuple[int, int], int]) -> str:
    """``cp1/slot0 6, cp2/slot1 8``: replays per frame, by CP size then slot."""
    return ", ".join(f"cp{c}/slot{s} {n}" for (c, s), n in sorted(frames.items())) or "none"


def series_check(name: str, key: str, data: Mapping[str, Steps], arms: tuple[str, str],
                 bound: LossBound, pair: Optional["Pair"] = None) -> Check:
    """``key`` of the candidate arm (``arms[0]``) against the reference arm per step; for a pair
    of emulated ranks (``pair.emulated``: each rank's figures are its own) rank by rank."""
    if pair is None or pair.emulated is None:
        return compare_series(name, step_series(data[arms[0]], key),
                              step_series(data[arms[1]], key), bound, arms)
    ranks = sorted(r for r in set(data[arms[0]]) & set(data[arms[1]])
                   if data[arms[0]][r] and data[arms[1]][r])
    if not ranks:
        return Check(name, None, None, False, f"no rank recorded by both {arms[0]} and {arms[1]}")
    per = [(r, compare_series(name, step_series(data[arms[0]], key, r),
                              step_series(data[arms[1]], key, r), bound, arms)) for r in ranks]
    failed = [c for _, c in per if not c.passed]
    worst = max(failed or [c for _, c in per],
                key=lambda c: math.inf if c.value is None or math.isnan(c.value) else c.value)
    return Check(name, worst.value, worst.bound, not failed,
                 "; ".join(f"{pair.rank_name(r)}: {c.detail}" for r, c in per))


def series_check_on(name: str, key: str, data: Mapping[str, Steps], arms: tuple[str, str],
                    bound: LossBound, keep: Callable[[int], bool], what: str) -> Check:
    """``series_check`` on the steps ``keep`` accepts; ``what`` prefixes the detail."""
    cand = {s: v for s, v in step_series(data[arms[0]], key).items() if keep(s)}
    ref = {s: v for s, v in step_series(data[arms[1]], key).items() if keep(s)}
    check = compare_series(name, cand, ref, bound, arms)
    return Check(check.name, check.value, check.bound, check.passed, f"{what}: {check.detail}")
