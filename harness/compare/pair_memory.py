"""The memory of a pair's two arms: one rule for every pair that compares it (``graph_vs_eager``,
``dcp_vs_fixed_cp``), built-in workload arms and command arms alike: both read the same step
record fields, whatever wrote them (the workload, or a command's metrics through
``harness.metrics``).

* The memory probe (``StepRecord.memory_probe``: one rank's memory after
  ``train.memory_probe_step`` and ``empty_cache``): :func:`probe_check`, candidate minus
  reference per rank, in % of the device or of the reference's figure.
* The graph pools and arenas of both arms (``StepRecord.graph_stats``): :func:`pool_figures`.
* Allocated and max allocated bytes per step (``allocated_bytes``, ``max_allocated_bytes``: the
  workload's, or a command's TensorBoard ``mem-*`` scalars and Megatron memory lines):
  :func:`level_check`, the worst (rank, step) of candidate minus reference in % of the
  reference, and :func:`growth_check`, what the candidate's allocated grew by over the steady
  window beyond what the reference's grew by, in % of the reference's at the window's start,
  two-sided (a leak in either arm; :data:`GROWTH_DEFAULT_PCT` unless the case declares one).

A figure without a bound is reported (``Check.figure_of``), never a passed check. What the records
cannot feed is not applicable with the reason (no memory in either arm, in one arm only, memory at
one step only where a check needs a series), except that a bounded check fails when an arm that
ran on CUDA recorded nothing: there memory was expected and nothing was measured.
"""

from __future__ import annotations

import math
from typing import Callable, Literal, Mapping, Optional, Sequence

from pydantic import Field

from harness.results import GraphStats
from harness.spec.schema import Strict

from .golden_perf import MEMORY_DEFAULT
from .series import MIB, Steps, graph_stats, memory_probes, ran_on_cuda, records_of
from .verdicts import Check

RankName = Callable[[int], str]
ProbeFigure = Literal["device_used_bytes", "active_bytes", "reserved_bytes"]  # MemoryProbe fields
StepFigure = Literal["allocated_bytes", "max_allocated_bytes"]  # per-step StepRecord fields

# The default bound of ``allocated_growth_pct``: golden memory's default (memory repeated to the
# byte over four sessions on the lent H200s; golden_perf.MEMORY_DEFAULT), in percent.
GROWTH_DEFAULT_PCT = MEMORY_DEFAULT * 100.0
# The default level bound of a graph arm over its eager arm (``graph_vs_eager``'s
# ``allocated_delta_pct`` and ``max_allocated_delta_pct``), in percent: a graph pool keeps the
# captured steps' activations (Megatron's tiny GPT on an H200: graph +138 % allocated, +95 % max
# allocated over eager, bench/runs/megatron_h200_2026-12-06.md), so the bound is loose; it stops a
# graph arm that holds many times the eager arm's memory from passing where the source reports
# memory at too few steps for a growth (Megatron's log by default).
GRAPH_LEVEL_DEFAULT_PCT = 400.0
_WHAT = {"allocated_bytes": "allocated bytes", "max_allocated_bytes": "max allocated bytes"}
WHERE_FROM = ("CPU ranks of the built-in workload record no device memory; a command's metrics "
              "carry it where the command writes it: docs/command-cases.md, \"Memory\"")


class PairMemoryBounds(Strict):
    """Bounds of the per-step memory of a pair's two arms (both ``graph_vs_eager`` and
    ``dcp_vs_fixed_cp`` have them): candidate minus reference, in percent of the reference."""

    # Allocated / max allocated bytes at each step both arms recorded, the worst (rank, step),
    # one-sided (the candidate may take this much more); None: a figure, reported, not checked.
    allocated_delta_pct: Optional[float] = Field(default=None, ge=0)
    max_allocated_delta_pct: Optional[float] = Field(default=None, ge=0)
    # What the candidate's allocated bytes grew by over the steady window (the second half of the
    # steps both recorded, after any capture) beyond what the reference's grew by, in percent of
    # the reference's at the window's start, two-sided; None: a figure.
    allocated_growth_pct: Optional[float] = Field(default=GROWTH_DEFAULT_PCT, ge=0)


def _rank_steps(steps: Steps, key: str) -> dict[int, dict[int, float]]:
    """Rank -> step -> ``key`` of its first record of that step (ranks and steps without one left
    out)."""
    out: dict[int, dict[int, float]] = {}
    for rank, rec in records_of(steps):
        value = getattr(rec, key)
        if value is not None:
            out.setdefault(rank, {}).setdefault(rec.step, float(value))
    return out


def _unrecorded(name: str, what: str, arms: tuple[str, str], data: Mapping[str, Steps],
                has: tuple[bool, bool], bound: Optional[float]) -> Optional[Check]:
    """The entry of a check whose figure not both arms recorded (None: both did): it fails when
    bounded and an arm without it ran on CUDA (nothing measured), else it is not applicable."""
    if all(has):
        return None
    lacking = [a for a, h in zip(arms, has) if not h]
    cuda = [a for a in lacking if ran_on_cuda(data[a])]
    if cuda and bound is not None:
        return Check(name, None, bound, False, f"{', '.join(cuda)} ran on CUDA but recorded no "
                                                f"{what}: nothing measured")
    if not any(has):
        return Check.not_applicable(name, f"neither {arms[0]} nor {arms[1]} recorded {what} "
                                          f"({WHERE_FROM})", bound)
    (have,) = [a for a, h in zip(arms, has) if h]
    return Check.not_applicable(name, f"only {have} recorded {what}, {lacking[0]} none: "
                                      f"nothing to compare it with ({WHERE_FROM})", bound)


def _bounded(name: str, value: float, bound: tuple[Optional[float], str], detail: str,
             two_sided: bool = False) -> Check:
    pct, source = bound
    if pct is None:
        return Check.figure_of(name, value, detail + " (a figure: no bound declared)")
    sign = "+-" if two_sided else "+"
    passed = (-pct <= value <= pct) if two_sided else value <= pct
    return Check(name, value, pct, passed, detail + f"; bound {sign}{pct:g}% ({source})",
                 lower=-pct if two_sided else None)


def _size(n: float) -> str:
    """Bytes in the unit that shows them (KiB below 10 MiB: a CPU trainer's tiny figures)."""
    return f"{n / MIB:.1f} MiB" if abs(n) >= 10 * MIB else f"{n / 1024:.1f} KiB"


def _signed(n: float) -> str:
    return ("+" if n >= 0 else "") + _size(n)


def _pct(a: float, b: float) -> float:
    return (a - b) / b * 100.0 if b > 0 else (0.0 if a == b else math.inf)


def probe_check(name: str, data: Mapping[str, Steps], arms: tuple[str, str], key: ProbeFigure,
                bound: tuple[Optional[float], str], of_device: bool, rank_name: RankName) -> Check:
    """Per-rank delta of a memory-probe figure (candidate minus reference), in MiB and in percent
    of the device (``of_device``) or of the reference figure; the worst rank is the value.
    Without a bound (``bound[0]`` None) a figure."""
    cand, ref = memory_probes(data[arms[0]]), memory_probes(data[arms[1]])
    ranks = sorted(set(cand) & set(ref))
    if not ranks:
        has = (bool(cand), bool(ref))
        what = "a memory probe"
        if all(has):  # each on other ranks: as if neither had one
            has = (False, False)
            what += (f" on a common rank ({arms[0]} ranks {sorted(cand)}, {arms[1]} ranks "
                     f"{sorted(ref)})")
        missing = _unrecorded(name, what, arms, data, has, bound[0])
        assert missing is not None
        return missing
    worst, parts = -math.inf, []
    for r in ranks:
        a, b = float(getattr(cand[r], key)), float(getattr(ref[r], key))
        base = float(ref[r].device_total_bytes) if of_device else b
        pct = (a - b) / base * 100.0 if base > 0 else math.inf
        worst = max(worst, pct)
        parts.append(f"{rank_name(r)} {(a - b) / MIB:+.0f} MiB ({pct:+.2f}%)")
    of = "of the device" if of_device else f"of {arms[1]}"
    return _bounded(name, worst, bound, f"{key} {arms[0]} - {arms[1]}, % {of}: " + ", ".join(parts))


def pool_figures(data: Mapping[str, Steps], arms: tuple[str, str], rank_name: RankName) -> Check:
    """``graph_pool_bytes``: the graph pool and arena bytes of both arms per rank (a figure)."""
    cand, ref = graph_stats(data[arms[0]]), graph_stats(data[arms[1]])
    if not cand and not ref:
        return Check.not_applicable("graph_pool_bytes", f"neither {arms[0]} nor {arms[1]} "
                                                        "captured CUDA graphs")
    ranks = sorted(set(cand) | set(ref))

    def txt(stats: Mapping[int, GraphStats], r: int, key: str) -> str:
        return f"{float(getattr(stats[r], key)) / MIB:.0f}" if r in stats else "-"

    parts = [f"{rank_name(r)} {txt(cand, r, 'pool_reserved_bytes')} vs "
             f"{txt(ref, r, 'pool_reserved_bytes')} MiB (arenas {txt(cand, r, 'arena_bytes')} vs "
             f"{txt(ref, r, 'arena_bytes')})" for r in ranks]
    return Check.figure_of("graph_pool_bytes", None,
                           f"graph pool reserved, {arms[0]} vs {arms[1]}: " + ", ".join(parts))


def level_check(name: str, data: Mapping[str, Steps], arms: tuple[str, str], key: StepFigure,
                bound: tuple[Optional[float], str], rank_name: RankName) -> Check:
    """``key`` at each (rank, step) both arms recorded, candidate minus reference in % of the
    reference; the worst is the value (one-sided). Without a bound a figure."""
    what = _WHAT[key]
    cand, ref = _rank_steps(data[arms[0]], key), _rank_steps(data[arms[1]], key)
    missing = _unrecorded(name, what, arms, data, (bool(cand), bool(ref)), bound[0])
    if missing is not None:
        return missing
    common = [(r, s) for r in sorted(set(cand) & set(ref)) for s in sorted(set(cand[r]) & set(ref[r]))]
    if not common:
        return Check.not_applicable(name, f"no step where both recorded {what} ({arms[0]}: "
                                          f"{_where(cand)}; {arms[1]}: {_where(ref)})", bound[0])
    worst = max(common, key=lambda rs: _pct(cand[rs[0]][rs[1]], ref[rs[0]][rs[1]]))
    r, s = worst
    a, b = cand[r][s], ref[r][s]
    detail = (f"{what} {arms[0]} - {arms[1]} over {len(common)} rank-step(s), worst {rank_name(r)} "
              f"step {s}: {_size(a)} vs {_size(b)}, {_signed(a - b)} "
              f"({_pct(a, b):+.2f}%)")
    return _bounded(name, _pct(a, b), bound, detail)


def _where(series: Mapping[int, Mapping[int, float]]) -> str:
    return ", ".join(f"rank {r} step(s) {sorted(v)}" for r, v in sorted(series.items())) or "none"


def _window(steps: Sequence[int], after: int) -> list[int]:
    """The steady window of the common ``steps`` (ascending): the second half of them, never the
    first (the optimizer's state is allocated in it) and none at or before ``after`` (the last
    capture step)."""
    start = max(steps[(len(steps) - 1) // 2], steps[min(1, len(steps) - 1)], after + 1)
    return [s for s in steps if s >= start and s > steps[0]]


def _captured_at(data: Mapping[str, Steps], arms: tuple[str, str], rank: int) -> int:
    """The last step after which either arm's ``rank`` captured graphs (0: none)."""
    return max((rec.step for a in arms for rec in data[a].get(rank, ())
                if rec.graph_stats is not None), default=0)


def growth_check(name: str, data: Mapping[str, Steps], arms: tuple[str, str],
                 bound: tuple[Optional[float], str], rank_name: RankName) -> Check:
    """Per rank, over the steady window of the steps both arms recorded allocated bytes at
    (:func:`_window`): the candidate's growth minus the reference's, in % of the reference's at
    the window's start; the value is the rank furthest from zero (two-sided: a leak in either
    arm). Not applicable where no rank has two steps in its window (memory at one step only)."""
    what = _WHAT["allocated_bytes"]
    cand, ref = _rank_steps(data[arms[0]], "allocated_bytes"), _rank_steps(data[arms[1]],
                                                                           "allocated_bytes")
    missing = _unrecorded(name, what, arms, data, (bool(cand), bool(ref)), bound[0])
    if missing is not None:
        return missing
    worst: Optional[float] = None
    parts, short = [], []
    for r in sorted(set(cand) & set(ref)):
        common = sorted(set(cand[r]) & set(ref[r]))
        window = _window(common, _captured_at(data, arms, r)) if common else []
        if len(window) < 2:
            short.append(f"{rank_name(r)} step(s) {common}")
            continue
        first, last = window[0], window[-1]
        grew_a, grew_b = cand[r][last] - cand[r][first], ref[r][last] - ref[r][first]
        pct = _pct(ref[r][first] + grew_a - grew_b, ref[r][first])
        if worst is None or abs(pct) > abs(worst):
            worst = pct
        parts.append(f"{rank_name(r)} steps {first}..{last}: {arms[0]} {_signed(grew_a)}, "
                     f"{arms[1]} {_signed(grew_b)} ({pct:+.2f}% of {arms[1]}'s "
                     f"{_size(ref[r][first])} at step {first})")
    if worst is None:
        return Check.not_applicable(name, (
            f"{what} at too few steps for a growth over a steady window (two or more steps of the "
            "second half, after the first step and any capture; both arms recorded it at "
            f"{'; '.join(short) or 'no common step'}): memory at the first steps only, as "
            "Megatron's log reports it by default (--log-memory-interval 1, or "
            "--log-memory-to-tensorboard with TensorBoard metrics, gives every step)"), bound[0])
    detail = (f"growth of {what} over the steady window, {arms[0]} - {arms[1]}: " + "; ".join(parts)
              + (f" (too few steps on {', '.join(short)})" if short else ""))
    return _bounded(name, worst, bound, detail, two_sided=True)


def step_memory_checks(p: PairMemoryBounds, where: str, data: Mapping[str, Steps],
                       arms: tuple[str, str], rank_name: RankName) -> tuple[Check, ...]:
    """``allocated_delta_pct``, ``max_allocated_delta_pct`` and ``allocated_growth_pct`` of a
    pair whose settings ``p`` sit at ``where`` (``compare.<name>.``)."""
    return (level_check("allocated_delta_pct", data, arms, "allocated_bytes",
                        _source(p, where, "allocated_delta_pct"), rank_name),
            level_check("max_allocated_delta_pct", data, arms, "max_allocated_bytes",
                        _source(p, where, "max_allocated_delta_pct"), rank_name),
            growth_check("allocated_growth_pct", data, arms,
                         _source(p, where, "allocated_growth_pct"), rank_name))


def _source(p: Strict, where: str, name: str) -> tuple[Optional[float], str]:
    """The bound ``name`` of ``p`` and where it comes from (``compare.<pair>.<name>``, ``by
    default`` where the case left it at its default)."""
    value = getattr(p, name)
    source = where + name
    if value is not None and value == type(p).model_fields[name].default:
        source += (", by default golden memory's bound" if name == "allocated_growth_pct"
                   else ", by default")
    return value, source
