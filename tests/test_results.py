"""The results store: JSONL step records, torn lines, resume, outcomes, atomic JSON."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness.results as results
from harness.results import (
    ArmOutcome,
    FrameReplays,
    MemoryProbe,
    PackedGroup,
    PackedMicrobatch,
    ResultsError,
    StepRecord,
    StepWriter,
    list_arm_dirs,
    read_json,
    read_outcome,
    read_steps,
    record_json,
    write_bytes_atomic,
    write_json_atomic,
    write_outcome,
    write_text_atomic,
)
from tests.records import probe, record

rec = record


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    for rank in (0, 1):
        w = StepWriter(tmp_path, rank)
        for step in (1, 2, 3):
            assert w.append(rec(step, loss=step + rank / 10, cp_sizes=(1, 2), device="cpu"))
        assert w.completed_steps() == 3
    steps = read_steps(tmp_path)
    assert sorted(steps) == [0, 1]
    assert [r.loss for r in steps[1]] == [1.1, 2.1, 3.1]
    assert steps[0][0].cp_sizes == (1, 2)
    lines = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["step"] for line in lines)


def test_replays_per_frame_round_trip_and_bad_entries_are_named(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    frames = (FrameReplays(1, 0, 12), FrameReplays(2, 7, 3))
    w.append(rec(1, graphed=True, replays=frames))
    got = read_steps(tmp_path)[0][0]
    assert got.replays == frames
    assert StepRecord.from_dict(record_json(got)) == got
    line = record_json(rec(1))
    with pytest.raises(ResultsError, match=r"field 'replays\.0\.cp': unknown key 'cp'; allowed "
                                           r"keys here: cp_size, slot, replays"):
        StepRecord.from_dict({**line, "replays": [{"cp": 1, "slot": 0, "replays": 1}]})
    with pytest.raises(ResultsError, match="field 'replays': Input should be a valid tuple"):
        StepRecord.from_dict({**line, "replays": {"cp_size": 1}})


def test_packed_microbatches_round_trip_older_records_read_and_bad_entries_are_named(
        tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    packed = (PackedMicrobatch((PackedGroup(2, (0, 3), 90),)),
              PackedMicrobatch((PackedGroup(1, (1,), 40), PackedGroup(1, (2,), 38))))
    w.append(rec(1, microbatches=2, packed=packed))
    w.append(rec(2))  # a record written before microbatches were recorded
    lines = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["packed"][1] == {
        "groups": [{"cp": 1, "sequences": [1], "tokens": 40},
                   {"cp": 1, "sequences": [2], "tokens": 38}]}
    old_line = {k: v for k, v in json.loads(lines[1]).items() if k != "packed"}
    got, old = read_steps(tmp_path)[0]
    assert got.packed == packed and StepRecord.from_dict(old_line).packed == ()
    assert got.packed[1].tokens == 78 and got.packed[1].sequences == (1, 2)
    assert got.packed[1].describe() == "CP1 [1] 40 + CP1 [2] 38"
    assert StepRecord.from_dict(record_json(got)) == got and old.packed == ()
    line = record_json(rec(1))
    with pytest.raises(ResultsError, match=r"field 'packed\.0\.groups\.0\.seqs': unknown key"):
        StepRecord.from_dict({**line, "packed": [{"groups": [{"cp": 1, "seqs": [0], "tokens": 1}]}]})
    with pytest.raises(ResultsError, match=r"field 'packed\.0\.groups\.0\.sequences'"):
        StepRecord.from_dict({**line, "packed": [{"groups": [{"cp": 1, "sequences": "0",
                                                             "tokens": 1}]}]})


def test_nonfinite_values_are_standard_json_and_round_trip(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    w.append(rec(1, loss=math.nan, grad_norm=math.inf, aux_loss=-math.inf))
    text = (tmp_path / "rank0.jsonl").read_text()
    assert "NaN" in text and json.loads(text, parse_constant=lambda c: pytest.fail(c))
    r = read_steps(tmp_path)[0][0]
    assert math.isnan(r.loss) and r.grad_norm == math.inf and r.aux_loss == -math.inf


def test_torn_last_line_is_ignored_on_read(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    w.append(rec(1))
    w.append(rec(2))
    with open(tmp_path / "rank0.jsonl", "ab") as fh:
        fh.write(b'{"step": 3, "loss": 1.')  # killed mid-write
    assert [r.step for r in read_steps(tmp_path)[0]] == [1, 2]


def test_corrupt_middle_line_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "rank0.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ResultsError, match=r"rank0\.jsonl:2"):
        read_steps(tmp_path)


def test_resume_cuts_torn_line_and_appends_without_duplicates(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    for step in (1, 2, 3):
        w.append(rec(step))
    with open(tmp_path / "rank0.jsonl", "ab") as fh:
        fh.write(b'{"step": 4, "lo')
    resumed = StepWriter(tmp_path, 0)
    assert resumed.completed_steps() == 3
    # A resumed run replays from a checkpoint older than the records: old steps are dropped.
    assert resumed.append(rec(3, loss=9.0)) is False
    for step in (4, 5):
        assert resumed.append(rec(step))
    records = read_steps(tmp_path)[0]
    assert [r.step for r in records] == [1, 2, 3, 4, 5]
    assert records[2].loss == 2.0
    assert (tmp_path / "rank0.jsonl").read_bytes().endswith(b"\n")


def test_no_resume_starts_afresh(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    w.append(rec(1))
    fresh = StepWriter(tmp_path, 0, resume=False)
    assert fresh.completed_steps() == 0
    assert read_steps(tmp_path) == {0: []}


@pytest.mark.parametrize(("bad", "why"), [
    ({}, "field 'step': required field is missing"),
    ({"step": 0}, "field 'step': Input should be greater than or equal to 1"),
    ({"step": "1"}, "field 'step': Input should be a valid integer"),
    ({"step": True}, "field 'step': Input should be a valid integer")])
def test_record_without_valid_step_is_rejected(tmp_path: Path, bad: dict, why: str) -> None:
    with pytest.raises(ResultsError, match=why):
        StepRecord.from_dict(bad)
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ResultsError, match=rf"rank0\.jsonl:2: bad step record: {why}"):
        read_steps(tmp_path)
    with pytest.raises(ResultsError, match=rf"rank0\.jsonl:2: bad step record: {why}"):
        StepWriter(tmp_path, 0)  # resuming reads the records typed, too
    with pytest.raises(ValueError, match="a step record needs an integer 'step' >= 1"):
        StepRecord(step=0)


def test_the_writer_takes_typed_records_only(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    with pytest.raises(TypeError, match="StepWriter.append takes a StepRecord, got dict"):
        w.append({"step": 1, "loss": 2.0})  # type: ignore[arg-type]
    # A record the reader would refuse is refused before it is written, naming the field.
    with pytest.raises(ValueError, match="step 1: bad step record: field 'loss': Input should be a "
                                         "valid number"):
        w.append(rec(1, loss="low"))  # type: ignore[arg-type]
    assert (tmp_path / "rank0.jsonl").read_bytes() == b"" and w.completed_steps() == 0


def test_read_steps_of_missing_folder_is_empty(tmp_path: Path) -> None:
    assert read_steps(tmp_path / "nope") == {}


def test_outcome_round_trip_and_validation(tmp_path: Path) -> None:
    out = ArmOutcome(status="timeout", returncode=None, wall_s=12.5, log_tail="line\n",
                     repro="dcp-harness run cases/x.yaml -k x", restarts=1, detail="rank 1 hung")
    write_outcome(tmp_path, out)
    assert read_outcome(tmp_path) == out
    assert "timeout after 12.5 s" in out.describe() and "rank 1 hung" in out.describe()
    assert read_outcome(tmp_path / "missing") is None
    with pytest.raises(ValueError, match="status"):
        ArmOutcome(status="crashed")
    (tmp_path / "outcome.json").write_text('{"status": "ok", "colour": 1}')
    with pytest.raises(ResultsError, match="field 'colour': unknown key 'colour'"):
        read_outcome(tmp_path)


def test_write_json_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "verdict.json"
    write_json_atomic(path, {"a": 1, "v": math.nan})
    write_json_atomic(path, {"a": 2, "t": (1, 2)})
    assert read_json(path) == {"a": 2, "t": [1, 2]}
    assert os.listdir(path.parent) == ["verdict.json"]


def test_write_json_atomic_keeps_old_file_when_serialisation_fails(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert read_json(path) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_list_arm_dirs(tmp_path: Path) -> None:
    StepWriter(tmp_path / "eager", 0).append(rec(1))
    write_outcome(tmp_path / "graph", ArmOutcome(status="failed", returncode=1))
    (tmp_path / "plots").mkdir()
    assert list(list_arm_dirs(tmp_path)) == ["eager", "graph"]


# --------------------------------------------------------------------------- properties

_numbers = st.one_of(st.none(), st.integers(-10**6, 10**6).map(float),
                     st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=25, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10**6), n=st.integers(1, 6),
       extra=st.fixed_dictionaries({}, optional={"loss": _numbers, "aux_loss": _numbers,
                                                 "grad_norm": _numbers,
                                                 "device": st.one_of(st.none(), st.text(max_size=8))}))
def test_any_truncation_keeps_exactly_the_complete_lines(tmp_path_factory: pytest.TempPathFactory,
                                                          cut: int, n: int, extra: dict) -> None:
    d = tmp_path_factory.mktemp("arm")
    w = StepWriter(d, 0)
    for step in range(1, n + 1):
        w.append(StepRecord(**extra, step=step))
    path = d / "rank0.jsonl"
    data = path.read_bytes()
    cut = cut % (len(data) + 1)
    path.write_bytes(data[:cut])
    complete = data[:cut].count(b"\n")
    records = read_steps(d)[0]
    assert [r.step for r in records] == list(range(1, complete + 1))
    for r in records:
        for key, value in extra.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(getattr(r, key))
            else:
                assert getattr(r, key) == value
    resumed = StepWriter(d, 0)
    assert resumed.completed_steps() == complete
    assert resumed.append(StepRecord(step=complete + 1))
    assert [r.step for r in read_steps(d)[0]] == list(range(1, complete + 2))


@pytest.mark.parametrize(("content", "message"), [
    (b'{"status": "o', "not valid JSON"),          # torn by a kill mid-write (non-atomic copy)
    (b'\xff\xfe{"status": "ok"}', "not valid JSON"),  # not UTF-8
    (b'["ok"]', "expected a JSON object, got a list"),
    (b'{"status": "ok", "returncode": "x"}', "bad outcome"),
])
def test_unusable_outcome_file_is_a_results_error_naming_it(tmp_path: Path, content: bytes,
                                                            message: str) -> None:
    (tmp_path / "outcome.json").write_bytes(content)
    with pytest.raises(ResultsError, match=message) as info:
        read_outcome(tmp_path)
    assert str(tmp_path / "outcome.json") in str(info.value)


def test_records_are_typed_and_a_renamed_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="field 'max_alloc_bytes': unknown key 'max_alloc_bytes' "
                                           "\\(did you mean 'max_allocated_bytes'\\?\\)"):
        StepRecord.from_dict({"step": 1, "max_alloc_bytes": 5})
    with pytest.raises(ResultsError, match="field 'loss': Input should be a valid number \\(got 'low'\\)"):
        StepRecord.from_dict({"step": 1, "loss": "low"})
    w = StepWriter(tmp_path, 0)
    assert w.append(rec(1, loss=1.0, memory_probe=probe(10, total=100, allocated=5, active=5,
                                                        reserved=8), graphed=True))
    (r,) = read_steps(tmp_path)[0]
    assert r.graphed and r.memory_probe == MemoryProbe(10, 100, 5, 5, 8)
    with open(tmp_path / "rank0.jsonl", "a") as fh:  # a hand-edited line with a renamed key
        fh.write(json.dumps({"step": 2, "max_alloc_bytes": 1}) + "\n")
        fh.write(json.dumps({"step": 3}) + "\n")
    with pytest.raises(ResultsError, match=r"rank0\.jsonl:2: bad step record: field 'max_alloc_bytes'"):
        read_steps(tmp_path)


@pytest.mark.parametrize(("fields", "why"), [
    ({"loss": True}, "field 'loss': Input should be a valid number (got True)"),
    ({"tokens": 4.5}, "field 'tokens': Input should be a valid integer (got 4.5)"),
    ({"graphed": 1}, "field 'graphed': Input should be a valid boolean (got 1)"),
    ({"device": 0}, "field 'device': Input should be a valid string (got 0)"),
    ({"cp_sizes": [1, True]}, "field 'cp_sizes.1': Input should be a valid integer (got True)"),
    ({"memory_probe": [1]}, "field 'memory_probe': expected a mapping of fields (device_used_bytes, "),
    ({"memory_probe": {"device_used_bytes": 1}}, "field 'memory_probe.device_total_bytes': required "
                                                 "field is missing; also field "
                                                 "'memory_probe.allocated_bytes'"),
])
def test_a_mistyped_field_is_named_as_a_case_file_field_is(fields: dict, why: str) -> None:
    with pytest.raises(ResultsError) as info:
        StepRecord.from_dict({"step": 1, **fields})
    assert why in str(info.value)


def test_records_of_older_runs_read_as_they_did() -> None:
    # A number where the type is an integer reads when it is whole; a NaN stays a float.
    r = StepRecord.from_dict({"step": 2.0, "tokens": 4096.0, "loss": math.nan, "grad_norm": 3})
    assert (r.step, r.tokens, r.grad_norm) == (2, 4096, 3.0) and math.isnan(r.loss)
    assert isinstance(r.step, int) and isinstance(r.grad_norm, float)
    assert results.field_of(r, "tokens") == 4096
    with pytest.raises(KeyError, match="step records have no field 'tokenz'"):
        results.field_of(r, "tokenz")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_results_files_honour_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    # mkstemp creates 0600 files: a sweep on a shared filesystem was unreadable by anyone else.
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "case" / "verdict.json", {"status": "pass"})
        write_text_atomic(tmp_path / "summary.md", "# s\n")
        write_bytes_atomic(tmp_path / "junit.xml", b"<testsuites/>")
        write_outcome(tmp_path / "case" / "arm", ArmOutcome(status="ok"))
        StepWriter(tmp_path / "case" / "arm", 0).append(rec(1))
    finally:
        os.umask(old)
    files = [tmp_path / "case" / "verdict.json", tmp_path / "summary.md", tmp_path / "junit.xml",
             tmp_path / "case" / "arm" / "outcome.json", tmp_path / "case" / "arm" / "rank0.jsonl"]
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: oct(mode) for f in files}
