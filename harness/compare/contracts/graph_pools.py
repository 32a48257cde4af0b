"""``graph_pools``: the slot-shared graph pool against separate pools per CP size.

``pool_ratio`` = slot-shared pool / the largest single variant's pool (the largest of the separate
pools) per rank, worst rank <= ``max_ratio`` (the separate pools' sum over the largest in the
detail); loss and grad norm per step, by default bitwise."""

from __future__ import annotations

import math
from typing import Mapping, Optional

from pydantic import Field

from harness.spec.comparisons import CommandRole
from harness.spec.names import GRAPH, GRAPH_POOLS, SEPARATE_POOLS
from harness.spec.preflight import graph_arms_problem
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, LossBound, Strict

from ..pair import Pair
from ..registry import Comparison, Judged, Planner, register
from ..series import MIB, Steps, graph_stats, series_check
from ..verdicts import Check


class GraphPoolsContract(Strict):
    """``graph`` (every CP variant in ONE MemPool) against ``graph-separate-pools`` (one pool per
    CP size): graph-pool bytes of the slot-shared arm over the largest single variant's pool
    (the largest of the separate pools), per rank; the sum of the separate pools is reported."""

    max_ratio: float = Field(default=1.05, gt=0)
    # Both arms run the same layout and kernels (only the pool layout differs): LM loss and grad
    # norm per step, ``exact`` = bitwise; grad_norm None: the loss bound.
    loss: LossBound = "exact"
    grad_norm: Optional[LossBound] = None


def check_graph_pools(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """Slot-shared pool over the largest single variant's pool (the largest separate pool)."""
    p: GraphPoolsContract = pair.params
    arms = pair.two_arms()
    shared, separate = graph_stats(data[arms[0]]), graph_stats(data[arms[1]])
    gn = p.grad_norm if p.grad_norm is not None else p.loss
    numerics = (series_check("loss", "loss", data, arms, p.loss, pair),
                series_check("grad_norm", "grad_norm", data, arms, gn, pair))
    ranks = sorted(set(shared) & set(separate))
    if not ranks:
        return (Check("pool_ratio", None, p.max_ratio, False,
                      f"no capture statistics in both {arms[0]} and {arms[1]}"),) + numerics
    worst, parts = -math.inf, []
    for r in ranks:
        largest = float(separate[r].largest_pool_bytes)
        ratio = shared[r].pool_reserved_bytes / largest if largest > 0 else math.inf
        summed = separate[r].pool_reserved_bytes / largest if largest > 0 else math.inf
        worst = max(worst, ratio)
        parts.append(f"{pair.rank_name(r)} {ratio:.3f} (separate pools {summed:.3f}, largest variant "
                     f"{largest / MIB:.0f} MiB)")
    return (Check("pool_ratio", worst, p.max_ratio, worst <= p.max_ratio,
                  "graph pool / largest single variant's pool: " + ", ".join(parts)),) + numerics


class GraphPools(Comparison):
    name = GRAPH_POOLS
    settings = GraphPoolsContract
    order = 40
    emulated_figures = "pools"
    judged = {GRAPH_POOLS: Judged(GraphPoolsContract, check_graph_pools, figures=True)}

    def rules(self, case: Case, settings: GraphPoolsContract) -> list[Problem]:
        """Graph arms (a ``graphs:`` section) and two or more dynamic CP sizes."""
        if case.graphs is None or case.command is not None:
            return graph_arms_problem(case, "compare.graph_pools")
        if len(case.layout.cp_sizes) < 2:
            return [Problem(at("compare.graph_pools"), (
                "compares one MemPool for every CP variant with one pool per CP size: needs "
                "parallel.dynamic_cp with two or more sizes"))]
        return []

    def command_roles(self, case: Case, settings: GraphPoolsContract) -> tuple[CommandRole, ...]:
        return (CommandRole(GRAPH, "the graph arm runs it"),
                CommandRole(SEPARATE_POOLS, "the separate-pools arm runs it"))

    def plan(self, case: Case, settings: GraphPoolsContract, planner: Planner) -> list[Pair]:
        arms = (planner.arm(GRAPH, "graphs"), planner.arm(SEPARATE_POOLS, "graphs"))
        return [Pair(GRAPH_POOLS, GRAPH_POOLS, arms, settings)]


register(GraphPools())
