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


CPU_TIME = SeriesKey("c", "arm", "eager", -1, "step_cpu_median_s", "cpu")
CPU_WALL = SeriesKey("c", "arm", "eager", -1, "step_time_median_s", "cpu")
WALL = SeriesKey("c", "arm", "eager", -1, "wall_s", "h100")
MEMORY = SeriesKey("c", "arm", "eager", -1, "peak_allocated_bytes", "h100")


def points(values, hashes=None, spreads=None) -> list[Point]:
    return [Point(f"night{i}", f"/s/night{i}", f"2026-11-{i + 1:02d}", f"{i:x}" * 40, False,
                  (hashes or ["h"] * len(values))[i], v, (spreads or [None] * len(values))[i])
            for i, v in enumerate(values)]


def creep(pct: float, clean: int, after: int, base: float = 100.0) -> list[float]:
    return [base] * clean + [base * (1 + pct / 100 * (i + 1)) for i in range(after)]


def test_a_2_percent_creep_in_step_time_is_caught_within_5_sweeps_naming_its_start():
    for after in range(1, 6):
        j = judge_series(KEY, points(creep(2, 5, after)))
        if j.verdict == "drift":
            break
    assert j.verdict == "drift" and after <= 5
    # the creep began at night5 (+2 %): named there or one sweep later
    assert j.moved_at.sweep in ("night5", "night6")
    assert "moved first at sweep night" in j.line() and "bound 5.0%" in j.line()


def test_a_2_percent_creep_in_gpu_memory_is_caught_within_5_sweeps():
    found = [judge_series(MEMORY, points(creep(2, 6, n, 2e9))).verdict for n in range(1, 6)]
    assert "drift" in found and found.index("drift") <= 3


def test_a_step_is_placed_at_the_sweep_it_happened():
    j = judge_series(KEY, points([100, 100.2, 99.9, 100.1, 120, 120.1, 119.8]))
    assert j.verdict == "drift" and j.moved_at.sweep == "night4"


def test_one_slow_sweep_is_not_a_drift_and_two_must_both_be_beyond_the_bound():
    assert judge_series(KEY, points([100, 101, 99, 100, 100, 160])).verdict == "steady"
    assert judge_series(KEY, points([100, 101, 99, 100, 160, 101])).verdict == "steady"
    assert judge_series(KEY, points([100, 101, 99, 100, 160, 160])).verdict == "drift"


def test_noisy_clean_series_do_not_fire():
    rng = random.Random(7)
    fired = 0
    for _ in range(200):
        noisy = [100 * (1 + rng.gauss(0, 0.01)) for _ in range(10)]
        fired += judge_series(KEY, points(noisy)).verdict != "steady"
    assert fired == 0
    # a loaded CPU host: the CPU time per step scatters by +-20 % (its floor), never a drift
    for _ in range(200):
        noisy = [0.05 * (1 + rng.gauss(0, 0.12)) for _ in range(10)]
        fired += judge_series(CPU_TIME, points(noisy)).verdict == "drift"
    assert fired == 0


def test_the_sweeps_own_spread_widens_the_noise():
    values = [100, 100, 100, 100, 108, 108]
    assert judge_series(KEY, points(values)).verdict == "drift"
    j = judge_series(KEY, points(values, spreads=[4.0] * 6))  # each median +-4 by its steps
    assert j.verdict == "steady" and j.noise == pytest.approx(0.04)


def test_wall_time_and_the_step_time_not_judged_on_the_platform_are_shown_only():
    up = points(creep(50, 4, 4))
    assert judge_series(WALL, up).verdict == "shown"
    assert judge_series(CPU_WALL, up).verdict == "shown"
    assert judge_series(CPU_TIME, up).verdict == "drift"
    assert "wall time includes process start" in judge_series(WALL, up).line()


def test_too_few_points_are_said_and_the_check_is_not_a_pass():
    j = judge_series(KEY, points([1.0, 2.0, 3.0]))
    assert j.verdict == "too-few" and "3 point(s) of the 4 a trend needs; not judged" in j.line()
    report = check({KEY: points([1.0, 2.0])})
    assert report.exit_code == 2 and "nothing could be judged" in report.lines()[0]


def test_faster_is_a_move_not_a_failure_but_a_loss_fails_either_way():
    down = points([100, 100, 100 * 0.9, 100 * 0.85, 100 * 0.8])
    assert judge_series(KEY, down).verdict == "moved"
    assert judge_series(LOSS, down).verdict == "drift"
    assert check({KEY: down}).exit_code == 0


def test_a_changed_case_starts_its_window_again():
    values = [100 * 1.03 ** i for i in range(6)]
    j = judge_series(KEY, points(values, ["old"] * 3 + ["new"] * 3))
    assert j.verdict == "too-few" and len(j.points) == 3


def test_the_report_lists_drifts_first_then_one_line_of_counts():
    report = check({KEY: points(creep(10, 4, 3)), LOSS: points([4.2] * 6),
                    WALL: points([9.0] * 6), MEMORY: points([1e9] * 2)})
    lines = report.lines()
    assert lines[0].startswith("history check: FAIL (exit 1): 1 drifted of 4 figure(s)")
    assert lines[1].startswith("  DRIFT  c / eager step_time_median_s [h100]")
    assert lines[2] == ("  1 steady, 0 moved the better way, 1 with too few points, 1 shown only "
                        "(wall time; the step time not judged on the platform); -v lists them")
    assert len(lines) == 3 and len(report.lines(verbose=True)) == 6


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
    assert drift == ["  DRIFT  drift-case / eager step_time_median_s [h100]: +10.9% over 5 sweeps "
                     "(noise 1.0%, bound 5.0%); moved first at sweep night2 (222222222222, "
                     "2026-11-03T02:00:00+00:00)"]
    # The gate of the last night alone passes; with --history it fails on the drift.
    assert main(["gate", str(nights[-1]), "--history", "--history-url", url]) == 1
    out = capsys.readouterr().out
    assert "gate: PASS (exit 0)" in out and "history check: FAIL (exit 1)" in out
    # A window below what a trend needs is refused, saying why.
    with pytest.raises(SystemExit) as exc:
        main(["history", "check", "--window", "3", "--history", url])
    assert exc.value.code == 2
    assert "a trend needs 4 sweeps" in capsys.readouterr().err
    # A case the history does not hold is named, with the ones it does.
    assert main(["history", "check", "no-such-case", "--history", url]) == 2
    err = capsys.readouterr().err
    assert "no case matching 'no-such-case'" in err and "its cases: drift-case" in err
