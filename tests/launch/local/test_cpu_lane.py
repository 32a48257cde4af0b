"""The CPU lane (``launch.local.cpu_lane``) with a launcher that runs no processes: one-rank arms
side by side within the cores, a judged step time alone, one core (``--gpu-jobs 1``) one arm
after another, the verdicts those of a serial run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.launch.local.backend import run_sweep
from harness.launch.local.cpu_lane import CpuArm, arm_cores, next_arm
from tests.launch.local.test_gpu_lane import cases, verdicts_of  # noqa: F401 (cases: a fixture)
from tests.launch.local.test_lanes import TimedLauncher, overlap


def test_one_rank_arms_run_side_by_side_but_a_judged_step_time_alone(cases, tmp_path):
    launcher = TimedLauncher(hold_s=0.3)
    result = run_sweep(cases, tmp_path / "out", launcher, cores=2)
    spans = launcher.spans
    assert len(spans) == 6
    timed = [s for s in spans if (s[0], s[1]) == ("judged", "eager")]
    others = [s for s in spans if s not in timed]
    assert not any(overlap(timed[0], o) for o in others)
    assert any(overlap(a, b) for a in others for b in others if a is not b)
    assert not any(overlap(a, b) and overlap(a, c) and overlap(b, c)  # never three on two cores
                   for a in spans for b in spans for c in spans if len({id(a), id(b), id(c)}) == 3)
    assert [v.case_id for v in result.verdicts] == [p.case_id for p in cases]  # plan order
    assert (tmp_path / "out" / "summary.md").is_file()


def test_one_core_runs_one_arm_after_another_with_the_same_verdicts(cases, tmp_path):
    serial_launcher = TimedLauncher(hold_s=0.05)
    serial = run_sweep(cases, tmp_path / "serial", serial_launcher, cores=1)
    spans = serial_launcher.spans
    assert not any(overlap(a, b) for a in spans for b in spans if a is not b)
    both = run_sweep(cases, tmp_path / "both", TimedLauncher(hold_s=0.05), cores=2)
    assert verdicts_of(both) == verdicts_of(serial)


def test_an_arm_starts_where_its_ranks_fit_in_the_free_cores(cases):
    plan = cases[1]
    arm = plan.arms[0]

    def of(name: str, ranks: int, alone: bool = False) -> CpuArm:
        return CpuArm(plan, replace(arm, name=name), Path("case"), ranks, alone)

    one, two, whole = of("one", 1), of("two", 2), of("whole", 2)
    assert next_arm([two, one], [of("running", 1)], 2) is one  # the first that fits
    assert next_arm([two], [of("running", 1)], 2) is None
    assert next_arm([whole], [], 2) is whole  # idle: any arm starts
    assert next_arm([one], [of("timed", 1, alone=True)], 2) is None  # nothing beside it
    assert next_arm([of("timed", 1, alone=True)], [one], 2) is None  # it waits for an idle machine
    assert arm_cores(arm, 2) == len(arm.ranks) == 1


def test_the_arms_that_start_cold_start_first(cases, tmp_path):
    cold = {(p.case_id, a.name) for p in cases for a in p.arms if a.case.execution.vary_processes}
    assert cold and len(cold) < sum(len(p.arms) for p in cases)
    launcher = TimedLauncher(hold_s=0.3)
    run_sweep(cases, tmp_path / "out", launcher, cores=2)
    spans = sorted(launcher.spans, key=lambda s: s[2])
    # The two cores start two cold arms; every cold arm starts before any other arm ends (an
    # arm started beside the last cold one may be timed a moment before it: threads).
    assert {(s[0], s[1]) for s in spans[:2]} <= cold
    first_end = min(s[3] for s in spans if (s[0], s[1]) not in cold)
    assert all(s[2] < first_end for s in spans if (s[0], s[1]) in cold)
