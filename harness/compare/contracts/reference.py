"""``reference``: a candidate layout against the single-rank ``reference`` arm
(``compare.reference``), compared where the math says the two must agree.

``k = regroup_step(...)`` is the first step at which the candidate groups tokens into other
microbatches than the single rank (1 when it regroups: DP, EP over DP, dynamic CP; for a layout
without DP the first step whose ``microbatches`` count differs; None: never)."""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional

from pydantic import Field

from harness.spec.schema import LossBound, ReferenceContract

from ..pair import Pair
from ..registry import contract
from ..series import Steps, series_check_on, step_series
from ..verdicts import Check


class ReferencePairParams(ReferenceContract):
    """A reference pair's settings: the case's ``compare.reference`` bounds plus what the planner
    (``harness.arms``) knows about the candidate: whether its layout groups tokens like the single
    rank (``dp == 1``), which decides what the math lets the pair compare, and the aux-loss
    coefficient."""

    groups_like_reference: bool
    aux_loss_coeff: float = Field(ge=0)


def regroup_step(same_grouping: bool, cand: Steps, ref: Steps) -> Optional[int]:
    """The first step at which the candidate groups tokens into other microbatches than the
    reference: 1 for a regrouping layout, else the first step whose microbatch count differs
    (None: never)."""
    if not same_grouping:
        return 1
    a, b = step_series(cand, "microbatches"), step_series(ref, "microbatches")
    return next((s for s in sorted(set(a) & set(b)) if a[s] != b[s]), None)


@contract("reference", ReferencePairParams)
def reference(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """A candidate layout against the single-rank ``reference`` arm (``compare.reference``).

    With ``k`` = :func:`regroup_step`: loss on steps <= k, grad norm and aux loss on steps < k
    under the exact bounds (the weights are identical until step k's update, and step k's LM loss
    does not depend on the grouping); after that loss (steps > k) and grad norm (steps >= k)
    under the ``regrouped_*`` bounds when the aux loss is on (its gradient depends on the
    grouping), else still under the exact bounds; the aux loss from step k is not compared."""
    p: ReferencePairParams = pair.params
    same, coeff = p.groups_like_reference, p.aux_loss_coeff
    arms = pair.two_arms()
    k = regroup_step(same, data[arms[0]], data[arms[1]])
    if k is None:
        why = f"{arms[0]} groups tokens like the single rank on every step"
    elif not same:
        why = f"{arms[0]} regroups tokens into other microbatches (DP, EP over DP or dynamic CP)"
    else:
        why = f"{arms[0]} packs other microbatches than the single rank from step {k}"
    last = math.inf if k is None else k
    drift = coeff > 0

    def check(name: str, key: str, bound: LossBound, keep: Callable[[int], bool], what: str) -> Check:
        steps = [s for s in step_series(data[arms[0]], key) if keep(s)]
        if not steps:
            return Check.not_applicable(name, f"{why}: no step {what}")
        return series_check_on(name, key, data, arms, bound, keep, f"{why}; {what}")

    checks = [check("loss", "loss", p.loss, lambda s: s <= last, "up to the regrouping")
              if drift else check("loss", "loss", p.loss, lambda s: True, "every step (aux loss off)"),
              check("grad_norm", "grad_norm", p.grad_norm, lambda s: s < last, "before the regrouping")
              if drift else check("grad_norm", "grad_norm", p.grad_norm, lambda s: True,
                                  "every step (aux loss off)"),
              check("aux_loss", "aux_loss", p.aux_loss, lambda s: s < last,
                    "before the regrouping (the per-microbatch aux loss depends on the grouping)")]
    if drift and k is not None:
        checks.append(check("loss_regrouped", "loss", p.regrouped_loss, lambda s: s > k,
                            "after the regrouping (the aux-loss gradient moved the weights)"))
        checks.append(check("grad_norm_regrouped", "grad_norm", p.regrouped_grad_norm,
                            lambda s: s >= k, "from the regrouping"))
    return tuple(checks)
