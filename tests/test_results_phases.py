"""Phase marks (``harness.results.phases``) and the split of an arm's wall time by phase
(``harness.results.timing``)."""

import dataclasses
import json
import os
import time

import pytest

from harness.results import ArmOutcome, ResultsError, record_json, write_outcome
from harness.results.phases import (
    Leg,
    PhaseRecorder,
    RankPhases,
    StepMark,
    phases_file,
    process_spawned_at,
    read_arm_phases,
    read_phases,
)
from harness.results.timing import Phases, arm_timing, checkpoint_rule, leg_phases


def _known(p: Phases) -> float:
    """The sum of the phases that are known."""
    return sum(v for v in (getattr(p, f.name) for f in dataclasses.fields(p)) if v is not None)


def test_the_recorder_appends_one_leg_per_process_run(tmp_path):
    first = PhaseRecorder()
    first.mark("main_at", at=10.0)
    first.mark("imported_at", at=11.5)
    first.note(device="cpu", stop_after=2)
    first.step(1, 0.25, recorded_at=12.0)
    first.write(tmp_path, 3)
    second = PhaseRecorder()
    second.mark("done_at", at=20.0)
    second.write(tmp_path, 3)
    got = read_phases(tmp_path, 3)
    assert got.rank == 3 and len(got.legs) == 2
    leg = got.legs[0]
    assert (leg.pid, leg.device, leg.stop_after, leg.main_at, leg.imported_at) == (
        os.getpid(), "cpu", 2, 10.0, 11.5)
    (step,) = leg.steps
    assert (step.step, step.step_s, step.recorded_at) == (1, 0.25, 12.0)
    assert step.started_at == 11.75 and step.written_at >= 12.0
    assert got.legs[1].done_at == 20.0 and got.legs[1].steps == ()
    assert read_arm_phases(tmp_path) == {3: got}
    assert read_arm_phases(tmp_path / "missing") == {}


def test_the_process_start_is_before_now_and_recent():
    spawned = process_spawned_at()
    assert spawned is not None  # Linux: /proc/self/stat
    assert time.time() - 3600 * 24 < spawned <= time.time()


def test_a_bad_marks_file_is_an_error_naming_file_and_field(tmp_path):
    phases_file(tmp_path, 0).write_text(json.dumps({"rank": 0, "legs": [{"pid": "x"}]}))
    with pytest.raises(ResultsError, match=r"phases\.rank0\.json.*field 'legs\.0\.pid'"):
        read_phases(tmp_path, 0)


def test_an_unknown_key_in_a_written_marks_file_is_named(tmp_path):
    recorder = PhaseRecorder()
    recorder.step(1, 0.5, 10.0)
    path = recorder.write(tmp_path, 0)
    data = json.loads(path.read_text())
    data["legs"][0]["steps"][0]["wrote_at"] = 11.0
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=r"phases\.rank0\.json.*field 'legs\.0\.steps\.0\."
                                           r"wrote_at': unknown key 'wrote_at'"):
        read_phases(tmp_path, 0)


def test_a_rank_replaces_a_marks_file_it_cannot_read(tmp_path):
    phases_file(tmp_path, 1).write_text("{torn")
    rec = PhaseRecorder()
    rec.mark("done_at", at=5.0)
    rec.write(tmp_path, 1)
    assert [leg.done_at for leg in read_phases(tmp_path, 1).legs] == [5.0]


def _leg(t0, steps, *, first_step=1, stop_after=None, setup=0.5, pid=1):
    """A leg starting at ``t0``: 0.1 s start, 1 s imports, 0.2 s rendezvous + groups, 0.3 s
    build, ``setup``, then ``steps`` steps of 1 s each, each written 0.05 s after it reached the
    rank, 0.4 s between steps; trained 0.6 s after the last, done 0.1 s later."""
    marks, t = [], t0 + 1.6 + setup
    for i in range(steps):
        marks.append(StepMark(first_step + i, 1.0, t + 1.0, t + 1.05))
        t += 1.05 + 0.4
    trained = marks[-1].written_at + 0.6
    return Leg(pid=pid, device="cpu", stop_after=stop_after, spawned_at=t0, main_at=t0 + 0.1,
               entered_at=t0 + 0.2, imported_at=t0 + 1.1, rendezvous_at=t0 + 1.2,
               build_started_at=t0 + 1.3, built_at=t0 + 1.6, steps=tuple(marks),
               trained_at=trained, done_at=trained + 0.1)


def test_a_leg_splits_into_its_phases():
    leg = _leg(100.0, 3)
    p = leg_phases(leg, checkpoint_rule(2))  # step 2 saves a checkpoint
    assert p.start == pytest.approx(0.1) and p.imports == pytest.approx(1.0)
    assert p.rendezvous == pytest.approx(0.2) and p.build == pytest.approx(0.3)
    assert p.setup == pytest.approx(0.5) and p.steps == pytest.approx(3.0)
    assert p.records == pytest.approx(0.15)
    assert p.checkpoint == pytest.approx(0.4)  # after step 2
    assert p.other == pytest.approx(0.4 + 0.6 + 0.1)  # after step 1, after the last, teardown
    assert _known(p) == pytest.approx(leg.done_at - leg.spawned_at)


def test_a_stop_after_step_saves_and_a_resumed_legs_extra_setup_is_the_load():
    stopped = _leg(0.0, 2, stop_after=2)
    assert leg_phases(stopped, checkpoint_rule(0)).checkpoint == pytest.approx(0.6)
    resumed = _leg(50.0, 2, first_step=3, setup=2.5)
    p = leg_phases(resumed, checkpoint_rule(0), fresh_setup=0.5)
    assert p.setup == pytest.approx(0.5) and p.checkpoint == pytest.approx(2.0)
    alone = leg_phases(resumed, checkpoint_rule(0))  # no fresh leg to compare: all of it
    assert alone.setup == pytest.approx(0.0) and alone.checkpoint == pytest.approx(2.5)


def _write(arm_dir, rank, *legs):
    arm_dir.mkdir(parents=True, exist_ok=True)
    phases_file(arm_dir, rank).write_text(json.dumps(record_json(RankPhases(rank, legs))))


def test_an_arms_legs_run_one_after_another_and_its_ranks_side_by_side(tmp_path):
    arm = tmp_path / "eager-resumed"
    first = [_leg(0.0, 2, stop_after=2, pid=1), _leg(0.2, 2, stop_after=2, pid=2)]
    second = [_leg(20.0, 2, first_step=3, setup=1.5, pid=3), _leg(20.0, 2, first_step=3, pid=4)]
    _write(arm, 0, first[0], second[0])
    _write(arm, 1, first[1], second[1])
    spans = (first[1].done_at - first[1].spawned_at) + (second[0].done_at - second[0].spawned_at)
    write_outcome(arm, ArmOutcome(status="ok", returncode=0, wall_s=spans + 1.5))
    t = arm_timing(arm, checkpoint_rule(0))
    assert (t.status, t.runs, t.ranks, t.steps, t.device) == ("ok", 2, 2, 4, "cpu")
    # each run counts the rank the arm waited for: rank 1 (started last) in the first, rank 0
    # (its 1 s longer setup: the checkpoint load beside rank 0's fresh setup) in the second
    assert t.phases.steps == pytest.approx(4.0)
    assert t.phases.checkpoint == pytest.approx(0.6 + 1.0)
    assert t.exit == pytest.approx(1.5)
    assert _known(t.phases) + t.exit == pytest.approx(t.wall_s)
    steps_of_a_run = first[0].steps[-1].written_at - first[0].steps[0].started_at
    assert t.step_span_s == pytest.approx(2 * steps_of_a_run)
    assert t.fixed_s == pytest.approx(t.wall_s - t.step_span_s)


def test_an_arm_without_marks_has_its_wall_time_only(tmp_path):
    arm = tmp_path / "graph"
    write_outcome(arm, ArmOutcome(status="skipped", detail="needs CUDA"))
    t = arm_timing(arm, checkpoint_rule(1))
    assert (t.status, t.wall_s, t.exit, t.runs, t.steps, t.device) == (
        "skipped", 0.0, None, 0, 0, None)
    assert arm_timing(tmp_path / "none", checkpoint_rule(1)).status == "no outcome"
