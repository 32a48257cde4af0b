"""``harness.golden.diff``: a refresh against the committed file, the metrics a review chooses, and
which files are of a platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.golden import Golden, golden_file, read_golden, write_golden
from harness.golden.diff import diff_golden, on_platform, render_diff
from harness.results import RunEnvironment

from tests.golden.test_repeats import ENV
from tests.records import changed
from tests.test_golden_perf import STEPS, gpu_run

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


def test_golden_diff_gives_signed_mean_and_largest_difference(tmp_path: Path) -> None:
    old = read_golden(write_golden(golden_file(tmp_path / "old", "c1", "h200"), gpu_run(env=ENV)))
    newer = gpu_run(time_s=0.19, env=RunEnvironment("2.13.0+cu130", "13.0", "2.27.3", "NVIDIA H200"))
    newer = changed(newer, {3: {"loss": newer[0][2].loss * (1 + 3e-6)}})
    new = read_golden(write_golden(golden_file(tmp_path / "new", "c1", "h200"), newer))
    d = diff_golden(old, new)
    by = {m.metric: m for m in d.metrics}
    assert by["iteration-time"].mean_rel == pytest.approx(-0.05)
    assert by["iteration-time"].window_rel == pytest.approx(-0.05) and by["iteration-time"].window == (5, 12)
    assert by["lm loss"].largest_step == 3 and by["lm loss"].largest_rel == pytest.approx(3e-6)
    assert by["lm loss"].mean_rel == pytest.approx(3e-6 / STEPS)
    assert by["mem-allocated-bytes"].largest_rel == 0
    assert d.environment == ("torch 2.11.0+cu130 -> 2.13.0+cu130", "NCCL_GRAPH_REGISTER 0 -> (unset)")
    text = render_diff(d)
    assert "| iteration-time | 12 | -5.000% | -5.000% (step 1) | -5.000% (steps 5..12) |" in text
    assert "| lm loss | 12 | +2.5e-07 | +3e-06 (step 3) |" in text
    assert "environment changed: torch 2.11.0+cu130 -> 2.13.0+cu130" in text
    assert d.largest() == pytest.approx(0.05)
