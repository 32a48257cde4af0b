"""``graph_pools``: the slot-shared graph pool against separate pools per CP size.

``pool_ratio`` = slot-shared pool / the largest single variant's pool (the largest of the separate
pools) per rank, worst rank <= ``max_ratio`` (the separate pools' sum over the largest in the
detail); loss and grad norm per step, by default bitwise."""

from __future__ import annotations

import math
from typing import Mapping

from harness.spec.names import GRAPH_POOLS
from harness.spec.schema import GraphPoolsContract

from ..pair import Pair
from ..registry import contract
from ..series import MIB, Steps, graph_stats, series_check
from ..verdicts import Check


@contract(GRAPH_POOLS, GraphPoolsContract)
def graph_pools(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
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
