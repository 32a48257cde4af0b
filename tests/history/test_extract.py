"""What the history keeps of an arm for the drift rule: the median process CPU time per steady
step beside the wall-clock median, and each step-time median's own spread (its standard error
from the steps behind it)."""

from __future__ import annotations

import math
import statistics

import pytest

from harness.history.extract import figures_of, median_and_spread, spreads_of
from tests.history.sweeps import STEPS, arm_records


def test_a_median_and_its_standard_error_from_the_spread_of_its_values():
    mid, spread = median_and_spread([1.0, 2.0, 3.0, 4.0, 50.0])
    assert mid == 3.0  # one wild step moves neither
    assert spread == pytest.approx(math.sqrt(math.pi / 2) * 1.4826 * 1.0 / math.sqrt(5))
    assert median_and_spread([2.0, 4.0]) == (3.0, None)  # too few for a spread
    assert median_and_spread([]) == (None, None)


def test_the_cpu_time_per_step_is_a_figure_over_the_steady_steps_with_its_spread():
    steps = arm_records(cpu_s=0.1)
    figures = figures_of(steps, loss=True)
    steady = [0.1 * (1 + s / 100) for s in range(2, STEPS + 1)]  # the first step left out
    assert figures["step_cpu_median_s"] == pytest.approx(statistics.median(steady))
    spreads = spreads_of(steps)
    assert spreads["step_cpu_median_s"] > 0
    assert spreads["step_time_median_s"] == 0  # every step took 0.2 s: no spread
    assert "step_cpu_median_s" not in figures_of(arm_records(), loss=True)  # older records
