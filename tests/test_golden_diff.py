"""``harness.golden_diff``: the metrics a review chooses, and which files are of a platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.golden import Golden
from harness.golden_diff import diff_golden, on_platform, render_diff

OLD = Golden(Path("old/golden_values_cpu.json"), {
    "lm loss": {1: 4.0, 2: 3.0}, "aux loss": {1: 1.0, 2: 1.0}, "grad norm": {1: 2.0, 2: 2.0}})
NEW = Golden(Path("new/golden_values_cpu.json"), {
    "lm loss": {1: 4.0, 2: 3.3}, "aux loss": {1: 1.0, 2: 1.0}, "iteration-time": {1: 0.1, 2: 0.1}})


def test_chosen_metrics_only() -> None:
    every = diff_golden(OLD, NEW)
    assert [m.metric for m in every.metrics] == ["lm loss", "aux loss"]
    assert (every.only_old, every.only_new) == (("grad norm",), ("iteration-time",))
    assert every.largest() == pytest.approx(0.1)
    chosen = diff_golden(OLD, NEW, metrics=["aux loss", "grad norm"])
    assert [m.metric for m in chosen.metrics] == ["aux loss"]
    assert (chosen.only_old, chosen.only_new) == (("grad norm",), ())
    assert chosen.largest() == 0.0 and "lm loss" not in render_diff(chosen)


@pytest.mark.parametrize("name, platform, result", [
    ("golden_values_h200.json", "h200", True),
    ("golden_values_torch2.13-cu13.0_h200.json", "h200", True),
    ("golden_values_gb200.json", "h200", False),  # not a suffix match of the name
    ("golden_values_dgx_h100.json", "dgx_h100", True),
    ("golden_values_cpu.json", "h200", False),
])
def test_on_platform(name: str, platform: str, result: bool) -> None:
    assert on_platform(Path("case") / name, platform) is result
