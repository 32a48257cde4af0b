"""The Slurm job's typed events (harness.launch.slurm.events): validated when made and when read,
the lines the earlier untyped writer left read back, a damaged file an error naming file:line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.launch.slurm.collect import collect
from harness.launch.slurm.events import (EVENTS_FILE, ArmEnd, ArmStart, ProcessEnd, TaskStart,
                                         append_event, read_events)
from harness.results import ResultsError, read_outcome

from tests.launch.slurm_fakes import Scheduler, steps

# Lines as the untyped writer (json.dumps(dict, sort_keys=True)) left them, one per kind of arm.
OLD_LINES = [
    '{"arm": "eager", "event": "arm_start", "job_id": "41", "restarts": 0, '
    '"resumed_after_step": 2, "time": 1700000000.5}',
    '{"arm": "eager", "event": "arm_end", "job_id": "41", "restarts": 0, "time": 1700000009.25, '
    '"wall_s": 8.75}',
    '{"arm": "eager", "event": "arm_start", "job_id": "41", "processes": 2, "restarts": 1, '
    '"time": 1700000010}',
    '{"arm": "eager", "event": "process_end", "job_id": "41", "process": 1, "restarts": 1, '
    '"status": "ok", "time": 1700000020.0}',
    '{"arm": "eager", "event": "arm_end", "job_id": "41", "restarts": 1, "status": "ok", '
    '"time": 1700000021.0, "wall_s": 11.0}',
    '{"arm": "e", "emulated": [0, 3], "event": "arm_start", "job_id": "41", '
    '"recorded_steps": {"0": 3}, "restarts": 0, "time": 1700000030.0}',
]


def test_lines_the_untyped_writer_left_read_back_and_are_written_again_the_same(tmp_path):
    (tmp_path / EVENTS_FILE).write_text("\n".join(OLD_LINES) + "\n")
    events = read_events(tmp_path)
    assert [type(e) for e in events] == [ArmStart, ArmEnd, ArmStart, ProcessEnd, ArmEnd, ArmStart]
    assert events[0].resumed_after_step == 2 and events[1].wall_s == 8.75
    assert events[3].process == 1 and events[5].emulated == (0, 3)
    again = tmp_path / "again"
    again.mkdir()
    for event in events:
        append_event(again, event)
    assert read_events(again) == events
    written = (again / EVENTS_FILE).read_text().splitlines()
    assert written[:2] == OLD_LINES[:2]  # same keys, same order; a kind's unused keys left out


def test_a_task_start_says_where_a_task_ran(tmp_path):
    event = TaskStart(arm="dcp", job_id="41", restarts=0, time=1700000040.0, task=3, node=1,
                      host="node2")
    append_event(tmp_path, event)
    assert (tmp_path / EVENTS_FILE).read_text() == (
        '{"arm": "dcp", "event": "task_start", "host": "node2", "job_id": "41", "node": 1, '
        '"restarts": 0, "task": 3, "time": 1700000040.0}\n')
    assert read_events(tmp_path) == [event]
    with pytest.raises(ValidationError):
        TaskStart(arm="dcp", job_id="41", restarts=0, time=1.0, task=3, node=-1, host="node2")


def test_a_torn_line_is_left_out(tmp_path):
    (tmp_path / EVENTS_FILE).write_text(OLD_LINES[0] + "\n" + OLD_LINES[1][:30] + "\n"
                                        + OLD_LINES[3] + "\n" + OLD_LINES[4][:20])
    assert [type(e) for e in read_events(tmp_path)] == [ArmStart, ProcessEnd]
    assert read_events(tmp_path / "no-such-case") == []


@pytest.mark.parametrize("line, said", [
    (OLD_LINES[1].replace('"wall_s"', '"wall"'), "wall: Extra inputs are not permitted"),
    (OLD_LINES[3].replace(', "process": 1', ""), "process: Field required"),
    (OLD_LINES[0].replace('"job_id": "41"', '"job_id": 41'), "job_id: Input should be a valid "
                                                              "string"),
    (OLD_LINES[3].replace('"ok"', '"fine"'), "status: Input should be 'ok', 'failed'"),
    (OLD_LINES[0].replace("arm_start", "arm_go"), "does not match any of the expected tags"),
])
def test_a_line_that_is_not_an_event_is_an_error_naming_file_and_line(tmp_path, line, said):
    (tmp_path / EVENTS_FILE).write_text(OLD_LINES[0] + "\n" + line + "\n" + OLD_LINES[2] + "\n")
    with pytest.raises(ResultsError, match=f"{EVENTS_FILE}:2: not a Slurm job event") as err:
        read_events(tmp_path)
    assert said in str(err.value)


def test_an_event_is_validated_when_made():
    with pytest.raises(ValidationError, match="job_id"):
        ArmStart(arm="eager", job_id=41, restarts=0, time=1.0)
    with pytest.raises(ValidationError, match="restarts"):
        ArmEnd(arm="eager", job_id="41", restarts=-1, time=1.0, wall_s=1.0)


def test_collect_names_a_case_whose_events_file_is_damaged_and_writes_it_no_outcome(sweep):
    out, plan, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 2)
    (case_dir / EVENTS_FILE).write_text(OLD_LINES[0].replace('"restarts": 0', '"restarts": "0"')
                                        + "\n")
    result = collect(out, runner=Scheduler(squeue="", sacct="41|FAILED|0:9\n"), reports=False)
    (problem,) = result.problems
    assert problem.startswith("t: could not evaluate: ResultsError: ")
    assert f"{EVENTS_FILE}:1: not a Slurm job event (restarts" in problem
    assert result.finalized == () and read_outcome(case_dir / "eager") is None
