"""``repeat``: the same arm run twice with the same seed (``compare.repeat``): ``<arm>`` and
``<arm>-repeat``; loss and grad norm per step under ``compare.repeat.loss`` (``exact`` = bitwise,
which needs ``train.deterministic``)."""

from __future__ import annotations

from typing import Mapping

from harness.spec.names import EAGER, REPEAT, REPEAT_SUFFIX
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, LossBound, Strict

from ..pair import Pair
from ..registry import Comparison, Judged, Planner, register
from ..series import Steps, series_check
from ..verdicts import Check


class RepeatContract(Strict):
    """Run the same arm twice with the same seed; deterministic runs must match bitwise."""

    # The arm run twice (a name of the arms the case can have; ``eager`` is the dcp arm of a
    # dynamic-CP case).
    arm: str = EAGER
    # Bound of the loss and grad norm; ``exact`` = bitwise.
    loss: LossBound = "exact"


def check_repeat(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: RepeatContract = pair.params
    arms = pair.two_arms()
    return (series_check("loss", "loss", data, arms, p.loss, pair),
            series_check("grad_norm", "grad_norm", data, arms, p.loss, pair))


class Repeat(Comparison):
    name = REPEAT
    settings = RepeatContract
    order = 10
    judged = {REPEAT: Judged(RepeatContract, check_repeat)}

    def rules(self, case: Case, settings: RepeatContract) -> list[Problem]:
        if settings.loss == "exact" and not case.train.deterministic:
            return [Problem(at("compare.repeat.loss"), "an exact repeat needs "
                            "train.deterministic: true (or give a tolerance)")]
        return []

    def plan(self, case: Case, settings: RepeatContract, planner: Planner) -> list[Pair]:
        field = "compare.repeat.arm"
        base = planner.arm(settings.arm, field)
        return [Pair(REPEAT, REPEAT, (base, planner.arm(base + REPEAT_SUFFIX, field)), settings)]


register(Repeat())
