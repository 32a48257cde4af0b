"""``dcp_vs_fixed_cp``: the dynamic-CP arm against the fixed-CP arm.

Loss, aux loss and grad norm per step, and the memory probes per rank, one-sided (candidate minus
reference): ``device_delta_pct`` = whole-device used delta in % of the device,
``active_delta_pct`` / ``reserved_delta_pct`` in % of the reference arm's figure, each with its
MiB in the detail. A delta is checked against its declared bound; ``device_delta_pct`` between
graph arms without one against TE PR #3353's (:data:`TE3353_DEVICE_DELTA_PCT`); a delta with
neither is a figure (``Check.figure_of``), never a passed check. Not applicable without a probe
(CPU; a command whose metrics carry none); a bounded delta fails where an arm on CUDA recorded
none (nothing measured). ``graph_pool_bytes``: both arms' graph pools and arenas, a figure. The
per-step allocated / max allocated deltas and the allocated growth (``compare.pair_memory``, the
same rule as ``graph_vs_eager``'s)."""

from __future__ import annotations

from typing import Mapping, Optional

from pydantic import Field

from harness.spec.comparisons import CommandRole
from harness.spec.derive import ArmSpec, has_graph_arms
from harness.spec.layout import ParallelLayout, cp_size_problem
from harness.spec.names import DCP, DCP_VS_FIXED_CP, FIXED_CP, GRAPH, GRAPH_FIXED_CP
from harness.spec.preflight import fixed_fill, microbatch_fill_applies
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, LossBound, Tolerance

from ..pair import Pair
from ..registry import EMULATED_LOSSES, Comparison, Judged, Planner, register
from ..pair_memory import PairMemoryBounds, pool_figures, probe_check, step_memory_checks
from ..series import Steps, graph_stats, records_of, series_check
from ..verdicts import Check


class DcpVsFixedCpContract(PairMemoryBounds):
    """The dynamic-CP arm against the same data at one fixed CP size: LM loss, aux loss and grad
    norm per step, and memory deltas. Dynamic CP regroups tokens into other microbatches, which
    changes the per-microbatch aux loss (and through its gradient every later step) legitimately;
    the default bounds are the measured clean differences of the focused cases with a margin
    (docs/internals.md, "Measured noise")."""

    # The CP size of the fixed-CP arm (a power of two dividing the DP x CP ranks of a stage).
    fixed_cp: int = Field(ge=1)
    loss: LossBound = Tolerance(max_rel=1e-3)
    aux_loss: LossBound = Tolerance(max_rel=0.03)
    grad_norm: LossBound = Tolerance(max_rel=2e-4)
    # Memory deltas (CUDA only), per rank, measured after train.memory_probe_step and
    # torch.cuda.empty_cache(), one-sided (DCP arm minus fixed-CP arm): whole-device used memory
    # in percent of the device's memory (None: +0.10 between graph arms, TE PR #3353's figure;
    # between eager arms a figure, reported, not checked),
    device_delta_pct: Optional[float] = Field(default=None, ge=0)
    # allocated (active) bytes and reserved bytes in percent of the fixed-CP arm's figure (None:
    # a figure, reported, not checked).
    active_delta_pct: Optional[float] = Field(default=None, ge=0)
    reserved_delta_pct: Optional[float] = Field(default=None, ge=0)

# TE PR #3353 (8 GB200, DCP {1, 2} against fixed CP2, both with CUDA graphs): the device used
# after empty_cache differed by at most +0.10 % of the device (+0.1001 %). The default bound of
# ``device_delta_pct`` between graph arms; eager arms have no measured bound (a figure).
TE3353_DEVICE_DELTA_PCT = 0.10


def _graphed(data: Mapping[str, Steps], arms: tuple[str, str]) -> bool:
    """Whether either arm captured or replayed CUDA graphs."""
    return any(graph_stats(data[a]) or any(rec.graphed for _, rec in records_of(data[a]))
               for a in arms)


def device_bound(p: DcpVsFixedCpContract, graphed: bool) -> tuple[Optional[float], str]:
    """``device_delta_pct``'s bound and where it comes from (None: no bound, a figure)."""
    if p.device_delta_pct is not None:
        return p.device_delta_pct, "compare.dcp_vs_fixed_cp.device_delta_pct"
    if graphed:
        return TE3353_DEVICE_DELTA_PCT, "the default for graph arms, TE PR #3353's"
    return None, ""


def check_dcp_vs_fixed_cp(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: DcpVsFixedCpContract = pair.params
    arms = pair.two_arms()
    where = "compare.dcp_vs_fixed_cp."
    return (series_check("loss", "loss", data, arms, p.loss, pair),
            series_check("aux_loss", "aux_loss", data, arms, p.aux_loss, pair),
            series_check("grad_norm", "grad_norm", data, arms, p.grad_norm, pair),
            probe_check("device_delta_pct", data, arms, "device_used_bytes",
                        device_bound(p, _graphed(data, arms)), True, pair.rank_name),
            probe_check("active_delta_pct", data, arms, "active_bytes",
                        (p.active_delta_pct, where + "active_delta_pct"), False, pair.rank_name),
            probe_check("reserved_delta_pct", data, arms, "reserved_bytes",
                        (p.reserved_delta_pct, where + "reserved_delta_pct"), False,
                        pair.rank_name),
            pool_figures(data, arms, pair.rank_name),
            *step_memory_checks(p, where, data, arms, pair.rank_name))


FIELD = "compare.dcp_vs_fixed_cp.fixed_cp"
# Why an emulated case does not compare the losses of the two layouts.
_NOT_COMPARABLE = ("the DCP and fixed-CP arms lay the tokens over other ranks, so their local "
                   "figures differ by more than the model's (the memory checks stand)")


def _arm_text(fixed: ParallelLayout) -> str:
    return f"the fixed-CP arm (compare.dcp_vs_fixed_cp.fixed_cp {fixed.max_cp}, dp={fixed.dp}): "


def _fixed_layout(case: Case, settings: DcpVsFixedCpContract) -> Optional[ParallelLayout]:
    """The fixed-CP arm's layout, where it has one (a dynamic-CP case whose ``fixed_cp`` is a
    power of two dividing the pool)."""
    lay = case.layout
    if not lay.dynamic or lay.world % lay.pp or cp_size_problem(settings.fixed_cp, lay.dp_cp):
        return None
    return lay.at_fixed_cp(settings.fixed_cp)


class DcpVsFixedCp(Comparison):
    name = DCP_VS_FIXED_CP
    settings = DcpVsFixedCpContract
    order = 30
    emulated_figures = "memory"
    judged = {DCP_VS_FIXED_CP: Judged(
        DcpVsFixedCpContract, check_dcp_vs_fixed_cp, figures=True,
        capture_checks=("graph_pool_bytes",),
        probe_checks=("device_delta_pct", "active_delta_pct", "reserved_delta_pct"))}
    emulated_not_comparable = (("loss", "aux_loss", "grad_norm"),
                               f"{EMULATED_LOSSES}: {_NOT_COMPARABLE}")

    def rules(self, case: Case, settings: DcpVsFixedCpContract) -> list[Problem]:
        """A dynamic-CP case; ``fixed_cp`` a power of two dividing the pool; the problems the
        fixed-CP arm's layout has beyond the case's own, and (built-in workload) its microbatch
        fill, at ``fixed_cp``. The arm's case passes the whole preflight when it is derived."""
        lay = case.layout
        fixed = _fixed_layout(case, settings)
        problems: list[Problem] = []
        if fixed is not None and case.command is None and microbatch_fill_applies(case):
            problems += fixed_fill(case, fixed, _arm_text(fixed))
        if not lay.dynamic:
            problems.append(Problem(at("compare.dcp_vs_fixed_cp"),
                                    "needs parallel.dynamic_cp (a dynamic-CP case)"))
        elif lay.world % lay.pp == 0:
            why = cp_size_problem(settings.fixed_cp, lay.dp_cp)
            if why is not None:
                problems.append(Problem(at(FIELD), f"fixed_cp={settings.fixed_cp}: {why}"))
            elif fixed is not None:
                own = lay.problems()  # reported by the layout rules
                problems += [Problem(at(FIELD), f"{_arm_text(fixed)}{p.field}: {p.message}")
                             for p in fixed.problems() if p not in own]
        return problems

    def command_roles(self, case: Case, settings: DcpVsFixedCpContract) -> tuple[CommandRole, ...]:
        """``graph-fixed-cp`` where the case has graph arguments, else ``fixed-cp``."""
        return (CommandRole(GRAPH_FIXED_CP if has_graph_arms(case) else FIXED_CP,
                            "the fixed-CP arm runs it (e.g. [--context-parallel-size, "
                            "'{fixed_cp}'])"),)

    def plan(self, case: Case, settings: DcpVsFixedCpContract, planner: Planner) -> list[Pair]:
        if not case.layout.dynamic:
            raise self.error(case, "compare.dcp_vs_fixed_cp", "dcp_vs_fixed_cp needs a dynamic-CP "
                             "case: set parallel.dynamic_cp (not parallel.cp)")
        graphed = has_graph_arms(case)
        fixed = ArmSpec(GRAPH_FIXED_CP if graphed else FIXED_CP, settings.fixed_cp).name
        arms = (planner.arm(GRAPH if graphed else DCP, FIELD), planner.arm(fixed, FIELD))
        return [Pair(DCP_VS_FIXED_CP, DCP_VS_FIXED_CP, arms, settings)]

    def fixed_cp_sizes(self, case: Case, settings: DcpVsFixedCpContract) -> tuple[int, ...]:
        return (settings.fixed_cp,)


register(DcpVsFixedCp())
