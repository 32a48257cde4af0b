"""Two lanes on a machine with GPUs: cases of CPU ranks run beside the GPU cases, never beside an
arm whose step time is judged, and Ctrl-C stops both (with a launcher that runs no processes)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from harness.arms import plan_cases
from harness.launch.local.backend import run_sweep
from harness.launch.local.gpu_demand import timing_judged_arms
from harness.report import gate
from harness.results import ArmOutcome, StepWriter
from harness.spec import load_cases
from tests.records import record


@dataclass
class TimedLauncher:
    """Records each arm's (case, arm, start, end) and writes its step records; ``hold_s`` per arm;
    ``interrupt`` raises KeyboardInterrupt in that (case, arm) run by the calling thread."""

    hold_s: float = 0.3
    interrupt: tuple = ()
    spans: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def run_arm(self, plan, arm, arm_dir, case_json):
        start = time.monotonic()
        if (plan.case_id, arm.name) == self.interrupt:
            raise KeyboardInterrupt
        while time.monotonic() - start < self.hold_s:
            if self.stopped.is_set():  # the sweep was interrupted in the other lane
                raise KeyboardInterrupt
            time.sleep(0.01)
        for rank in arm.ranks:
            writer = StepWriter(arm_dir, rank)
            for s in range(1, plan.steps + 1):
                writer.append(record(s, 5.0 - 0.1 * s, aux_loss=1.0))
        with self.lock:
            self.spans.append((plan.case_id, arm.name, start, time.monotonic()))
        return ArmOutcome(status="ok", returncode=0)

    def stop(self) -> None:
        self.stopped.set()


def overlap(a, b) -> bool:
    return a[2] < b[3] and b[2] < a[3]


@pytest.fixture
def cases(write_case):
    paths = [write_case("gpu-judged", compare={"repeat": {}, "golden": {}}),
             write_case("gpu-plain", compare={"repeat": {}}),
             write_case("cpu-a", compare={"repeat": {}}),
             write_case("cpu-b", compare={"repeat": {}})]
    return plan_cases(load_cases(paths))


def beside(plan) -> bool:
    return plan.case_id.startswith("cpu-")


def test_cpu_cases_run_beside_the_others_but_never_beside_a_judged_step_time(cases, tmp_path):
    launcher = TimedLauncher()
    result = run_sweep(cases, tmp_path / "out", launcher, beside=beside)
    spans = launcher.spans
    assert len(spans) == 8
    judged = [s for s in spans if s[0] == "gpu-judged" and s[1] in timing_judged_arms(cases[0])]
    assert [s[1] for s in judged] == ["eager"]  # the golden pair's arm
    cpu = [s for s in spans if s[0].startswith("cpu-")]
    gpu = [s for s in spans if not s[0].startswith("cpu-")]
    assert any(overlap(c, g) for c in cpu for g in gpu)  # the lanes ran side by side
    assert not any(overlap(c, j) for c in cpu for j in judged)  # never beside a judged step time
    assert not any(overlap(a, b) for a in cpu for b in cpu if a is not b)  # one CPU case at a time
    assert not any(overlap(a, b) for a in gpu for b in gpu if a is not b)
    assert [v.case_id for v in result.verdicts] == [p.case_id for p in cases]  # plan order
    assert gate(tmp_path / "out") == 0


def test_ctrl_c_in_one_lane_stops_the_other(cases, tmp_path):
    launcher = TimedLauncher(hold_s=3.0, interrupt=("gpu-plain", "eager"))
    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cases, tmp_path / "out", launcher, beside=beside)
    assert launcher.stopped.is_set()
    cpu_done = [s for s in launcher.spans if s[0].startswith("cpu-")]
    assert len(cpu_done) < 4  # the CPU lane did not run on to its end
    assert time.monotonic() - begun < 60  # and nothing waited for it


def test_without_a_second_lane_nothing_changes(cases, tmp_path):
    launcher = TimedLauncher(hold_s=0.01)
    run_sweep(cases, tmp_path / "out", launcher)
    assert [(s[0], s[1]) for s in launcher.spans] == [
        (p.case_id, a.name) for p in cases for a in p.arms]


def test_the_progress_lines_of_two_lanes_name_their_own_cases(cases, tmp_path):
    import io

    from harness.launch.local.progress import make_progress

    stream = io.StringIO()
    run_sweep(cases, tmp_path / "out", TimedLauncher(hold_s=0.2), beside=beside,
              progress=make_progress(stream, cases, tmp_path / "no-history"))
    lines = stream.getvalue().splitlines()
    for i, plan in enumerate(cases, 1):
        for arm in plan.arms:
            assert any(line.startswith(f"[{i}/4] {plan.case_id} / {arm.name}: ok") for line in lines)
