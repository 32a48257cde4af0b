"""``dcp_vs_fixed_cp``: the dynamic-CP arm against the fixed-CP arm.

Loss, aux loss and grad norm per step, and the memory probes per rank, one-sided (candidate minus
reference): ``device_delta_pct`` = whole-device used delta in % of the device,
``active_delta_pct`` / ``reserved_delta_pct`` in % of the reference arm's figure, each with its
MiB in the detail and recorded without a bound when none is declared (not applicable without
CUDA figures); ``graph_pool_bytes`` records both arms' graph pools and arenas (figures only)."""

from __future__ import annotations

import math
from typing import Callable, Literal, Mapping, Optional

from harness.results import GraphStats
from harness.spec.schema import DcpVsFixedCpContract

from ..pair import Pair
from ..registry import contract
from ..series import MIB, Steps, graph_stats, memory_probes, series_check
from ..verdicts import Check

ProbeFigure = Literal["device_used_bytes", "active_bytes", "reserved_bytes"]  # MemoryProbe fields


def _probe_check(name: str, data: Mapping[str, Steps], arms: tuple[str, str], key: ProbeFigure,
                 bound_pct: Optional[float], of_device: bool,
                 rank_name: Callable[[int], str]) -> Check:
    """Per-rank delta of a probe figure (candidate minus reference), in MiB and in percent of the
    device (``of_device``) or of the reference figure; the worst rank is the check's value. A check
    without a bound is recorded (applicable, passed) with the figures."""
    cand, ref = memory_probes(data[arms[0]]), memory_probes(data[arms[1]])
    ranks = sorted(set(cand) & set(ref))
    if not ranks:
        return Check.not_applicable(name, f"no memory probe in both arms ({arms[0]} vs {arms[1]}; "
                                    "CPU runs record no device memory)", bound_pct)
    worst: Optional[float] = None
    parts = []
    for r in ranks:
        a, b = float(getattr(cand[r], key)), float(getattr(ref[r], key))
        base = float(ref[r].device_total_bytes) if of_device else b
        pct = (a - b) / base * 100.0 if base > 0 else math.inf
        worst = pct if worst is None else max(worst, pct)
        parts.append(f"{rank_name(r)} {(a - b) / MIB:+.0f} MiB ({pct:+.2f}%)")
    assert worst is not None
    of = "of the device" if of_device else f"of {arms[1]}"
    detail = f"{key} {arms[0]} - {arms[1]}, % {of}: " + ", ".join(parts)
    if bound_pct is None:
        return Check(name, worst, None, True, detail + " (no bound declared)")
    return Check(name, worst, bound_pct, worst <= bound_pct, detail + f"; bound +{bound_pct:g}%")


def _pool_figures(data: Mapping[str, Steps], arms: tuple[str, str],
                  rank_name: Callable[[int], str]) -> Check:
    """Graph-pool and arena bytes of both arms per rank (recorded, never failing)."""
    cand, ref = graph_stats(data[arms[0]]), graph_stats(data[arms[1]])
    if not cand and not ref:
        return Check.not_applicable("graph_pool_bytes", "eager arms")
    ranks = sorted(set(cand) | set(ref))

    def txt(stats: Mapping[int, GraphStats], r: int, key: str) -> str:
        return f"{float(getattr(stats[r], key)) / MIB:.0f}" if r in stats else "-"

    parts = [f"{rank_name(r)} {txt(cand, r, 'pool_reserved_bytes')} vs "
             f"{txt(ref, r, 'pool_reserved_bytes')} MiB (arenas {txt(cand, r, 'arena_bytes')} vs "
             f"{txt(ref, r, 'arena_bytes')})" for r in ranks]
    return Check("graph_pool_bytes", None, None, True,
                 f"graph pool reserved, {arms[0]} vs {arms[1]}: " + ", ".join(parts))


@contract("dcp_vs_fixed_cp", DcpVsFixedCpContract)
def dcp_vs_fixed_cp(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: DcpVsFixedCpContract = pair.params
    arms = pair.two_arms()
    return (series_check("loss", "loss", data, arms, p.loss, pair),
            series_check("aux_loss", "aux_loss", data, arms, p.aux_loss, pair),
            series_check("grad_norm", "grad_norm", data, arms, p.grad_norm, pair),
            _probe_check("device_delta_pct", data, arms, "device_used_bytes", p.device_delta_pct,
                         True, pair.rank_name),
            _probe_check("active_delta_pct", data, arms, "active_bytes", p.active_delta_pct, False,
                         pair.rank_name),
            _probe_check("reserved_delta_pct", data, arms, "reserved_bytes", p.reserved_delta_pct,
                         False, pair.rank_name),
            _pool_figures(data, arms, pair.rank_name))
