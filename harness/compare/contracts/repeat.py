"""``repeat``: the same arm run twice; loss and grad norm per step under ``compare.repeat.loss``
(``exact`` = bitwise, or a tolerance)."""

from __future__ import annotations

from typing import Mapping

from harness.spec.names import REPEAT
from harness.spec.schema import RepeatContract

from ..pair import Pair
from ..registry import contract
from ..series import Steps, series_check
from ..verdicts import Check


@contract(REPEAT, RepeatContract)
def repeat(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: RepeatContract = pair.params
    arms = pair.two_arms()
    return (series_check("loss", "loss", data, arms, p.loss, pair),
            series_check("grad_norm", "grad_norm", data, arms, p.loss, pair))
