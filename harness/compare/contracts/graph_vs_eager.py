"""``graph_vs_eager``: the graphed arm against the eager arm; loss, aux loss and grad norm per
step (aux loss and grad norm default to the loss bound)."""

from __future__ import annotations

from typing import Mapping

from harness.spec.schema import GraphVsEagerContract

from ..pair import Pair
from ..registry import contract
from ..series import Steps, series_check
from ..verdicts import Check


@contract("graph_vs_eager", GraphVsEagerContract)
def graph_vs_eager(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: GraphVsEagerContract = pair.params
    arms = pair.two_arms()
    aux = p.aux_loss if p.aux_loss is not None else p.loss
    gn = p.grad_norm if p.grad_norm is not None else p.loss
    return (series_check("loss", "loss", data, arms, p.loss),
            series_check("aux_loss", "aux_loss", data, arms, aux),
            series_check("grad_norm", "grad_norm", data, arms, gn))
