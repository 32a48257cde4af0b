"""Drift across sweeps: the rule on series (a creep, a step, noise, too few points, the better
way, a changed case), and end to end: five nightly sweeps whose step time grows 3 % a night each
pass the gate against their golden values, and `history check` / `gate --history` fail naming
the case, figure, size, and the first sweep and commit where it moved."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.cli import main
from harness.history.drift import check, judge_series
from harness.history.query import Point, SeriesKey
from tests.history.sweeps import drifting_sweeps

KEY = SeriesKey("c", "arm", "eager", -1, "step_time_median_s", "h100")
LOSS = SeriesKey("c", "arm", "eager", -1, "final_loss", "h100")


def points(values, hashes=None) -> list[Point]:
    return [Point(f"night{i}", f"/s/night{i}", f"2026-11-{i + 1:02d}", f"{i:x}" * 40, False,
                  (hashes or ["h"] * len(values))[i], v) for i, v in enumerate(values)]


def test_a_creep_of_3_percent_a_sweep_drifts_from_the_first_sweep_it_moved():
    j = judge_series(KEY, points([100 * 1.03 ** i for i in range(5)]), max_drift=0.05)
    assert j.verdict == "drift" and j.change == pytest.approx(0.1255, abs=0.005)
    assert j.moved_at is not None and j.moved_at.sweep == "night1"
    assert "+12.6% over 5 sweeps" in j.line() and "moved first at sweep night1" in j.line()


def test_a_step_is_placed_at_the_sweep_it_happened():
    j = judge_series(KEY, points([100, 100.2, 99.9, 100.1, 120, 120.1, 119.8]), max_drift=0.05)
    assert j.verdict == "drift" and j.moved_at.sweep == "night4"


def test_noise_without_a_trend_is_steady_and_a_trend_inside_the_noise_is_not_drift():
    rng = random.Random(7)
    noisy = [100 * (1 + rng.gauss(0, 0.03)) for _ in range(10)]
    assert judge_series(KEY, points(noisy), max_drift=0.05).verdict == "steady"
    # +6 % over the window on a figure whose points scatter by +-15 %: not beyond its noise.
    wild = [100 + 0.6 * i + (15 if i % 2 else -15) for i in range(10)]
    j = judge_series(KEY, points(wild), max_drift=0.05)
    assert j.verdict == "steady" and j.noise > 0.1


def test_too_few_points_are_said_and_the_check_is_not_a_pass():
    j = judge_series(KEY, points([1.0, 2.0, 3.0]))
    assert j.verdict == "too-few" and "3 point(s) of the 4 a trend needs; not judged" in j.line()
    report = check({KEY: points([1.0, 2.0])})
    assert report.exit_code == 2 and "nothing could be judged" in report.lines()[0]


def test_faster_is_a_move_not_a_failure_but_a_loss_fails_either_way():
    down = points([100 * 0.97 ** i for i in range(5)])
    assert judge_series(KEY, down).verdict == "moved"
    assert judge_series(LOSS, down).verdict == "drift"
    assert check({KEY: down}).exit_code == 0


def test_a_changed_case_starts_its_window_again():
    values = [100 * 1.03 ** i for i in range(6)]
    j = judge_series(KEY, points(values, ["old"] * 3 + ["new"] * 3))
    assert j.verdict == "too-few" and len(j.points) == 3


def test_five_passing_sweeps_that_creep_fail_history_check(url: str, tmp_path: Path, capsys,
                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    nights = drifting_sweeps(tmp_path)
    for night in nights:
        assert main(["gate", str(night)]) == 0  # each passes its golden step-time bound
    capsys.readouterr()
    assert main(["history", "add", *map(str, nights), "--history", url]) == 0
    capsys.readouterr()
    assert main(["history", "check", "--history", url]) == 1
    out = capsys.readouterr().out
    assert out.startswith("history check: FAIL (exit 1):")
    drift = [line for line in out.splitlines() if "DRIFT" in line]
    assert drift == ["  DRIFT  drift-case / eager step_time_median_s [h100]: +12.6% over 5 sweeps "
                     "(noise 0.1%); moved first at sweep night1 (2026-11-02T02:00:00+00:00, "
                     "111111111111)"]
    # The gate of the last night alone passes; with --history it fails on the drift.
    assert main(["gate", str(nights[-1]), "--history", "--history-url", url]) == 1
    out = capsys.readouterr().out
    assert "gate: PASS (exit 0)" in out and "history check: FAIL (exit 1)" in out
    # A tighter window of the last three nights: too few points, said, not passed.
    assert main(["history", "check", "--window", "3", "--history", url]) == 2
    assert "TOO FEW drift-case / eager step_time_median_s [h100]" in capsys.readouterr().out
