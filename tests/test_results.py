"""The results store: JSONL step records, torn lines, resume, outcomes, atomic JSON."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.results import (
    ArmOutcome,
    FrameReplays,
    PackedGroup,
    PackedMicrobatch,
    ResultsError,
    StepRecord,
    StepWriter,
    list_arm_dirs,
    read_json,
    read_outcome,
    read_steps,
    write_bytes_atomic,
    write_json_atomic,
    write_outcome,
    write_text_atomic,
)


def rec(step: int, loss: float = 2.0, **extra: object) -> dict:
    return {"step": step, "loss": loss, "grad_norm": 1.0, "nan": False, "skipped": False, **extra}


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    for rank in (0, 1):
        w = StepWriter(tmp_path, rank)
        for step in (1, 2, 3):
            assert w.append(rec(step, loss=step + rank / 10, cp_sizes=[1, 2], device="cpu"))
        assert w.completed_steps() == 3
    steps = read_steps(tmp_path)
    assert sorted(steps) == [0, 1]
    assert [r.loss for r in steps[1]] == [1.1, 2.1, 3.1]
    assert steps[0][0].cp_sizes == (1, 2)
    lines = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["step"] for line in lines)


def test_replays_per_frame_round_trip_and_bad_entries_are_named(tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    frames = [{"cp_size": 1, "slot": 0, "replays": 12}, {"cp_size": 2, "slot": 7, "replays": 3}]
    w.append(rec(1, graphed=True, replays=frames))
    got = read_steps(tmp_path)[0][0]
    assert got.replays == (FrameReplays(1, 0, 12), FrameReplays(2, 7, 3))
    assert StepRecord.from_dict(got.to_dict()) == got
    with pytest.raises(ResultsError, match="'replays' entry has unknown keys"):
        StepRecord.from_dict(rec(1, replays=[{"cp": 1, "slot": 0, "replays": 1}]))
    with pytest.raises(ResultsError, match="'replays' must be a list of objects"):
        StepRecord.from_dict(rec(1, replays={"cp_size": 1}))


def test_packed_microbatches_round_trip_older_records_read_and_bad_entries_are_named(
        tmp_path: Path) -> None:
    w = StepWriter(tmp_path, 0)
    packed = [{"groups": [{"cp": 2, "sequences": [0, 3], "tokens": 90}]},
              {"groups": [{"cp": 1, "sequences": [1], "tokens": 40},
                          {"cp": 1, "sequences": [2], "tokens": 38}]}]
    w.append(rec(1, microbatches=2, packed=packed))
    w.append(rec(2))  # a record written before microbatches were recorded
    got, old = read_steps(tmp_path)[0]
    assert got.packed == (PackedMicrobatch((PackedGroup(2, (0, 3), 90),)),
                          PackedMicrobatch((PackedGroup(1, (1,), 40), PackedGroup(1, (2,), 38))))
    assert got.packed[1].tokens == 78 and got.packed[1].sequences == (1, 2)
    assert got.packed[1].describe() == "CP1 [1] 40 + CP1 [2] 38"
    assert StepRecord.from_dict(got.to_dict()) == got and old.packed == ()
    with pytest.raises(ResultsError, match="'packed' group has keys"):
        StepRecord.from_dict(rec(1, packed=[{"groups": [{"cp": 1, "seqs": [0], "tokens": 1}]}]))
    with pytest.raises(ResultsError, match="'sequences' must be a list of integers"):
        StepRecord.from_dict(rec(1, packed=[{"groups": [{"cp": 1, "sequences": "0", "tokens": 1}]}]))
    with pytest.raises(ResultsError, match="'packed' must be a list of microbatches"):
        StepRecord.from_dict(rec(1, packed={"groups": []}))


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


@pytest.mark.parametrize("bad", [{}, {"step": 0}, {"step": "1"}, {"step": True}])
def test_record_without_valid_step_is_rejected(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError, match="step"):
        StepWriter(tmp_path, 0).append(bad)


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
    with pytest.raises(ResultsError, match="unknown keys"):
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
        w.append({**extra, "step": step})
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
    assert resumed.append({"step": complete + 1})
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
    w = StepWriter(tmp_path, 0)
    with pytest.raises(ValueError, match="unknown keys \\['max_alloc_bytes'\\]"):
        w.append({"step": 1, "max_alloc_bytes": 5})
    with pytest.raises(ValueError, match="'loss'"):
        w.append({"step": 1, "loss": "low"})
    probe = {"device_used_bytes": 10, "device_total_bytes": 100, "allocated_bytes": 5,
             "active_bytes": 5, "reserved_bytes": 8}
    assert w.append({"step": 1, "loss": 1.0, "memory_probe": probe, "graphed": True})
    (r,) = read_steps(tmp_path)[0]
    assert r.graphed and r.memory_probe is not None and r.memory_probe.device_used_bytes == 10
    with open(tmp_path / "rank0.jsonl", "a") as fh:  # a hand-edited line with a renamed key
        fh.write(json.dumps({"step": 2, "max_alloc_bytes": 1}) + "\n")
        fh.write(json.dumps({"step": 3}) + "\n")
    with pytest.raises(ResultsError, match="record 2.*max_alloc_bytes"):
        read_steps(tmp_path)


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
