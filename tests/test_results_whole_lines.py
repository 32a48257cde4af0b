"""A rank file read at once (pydantic validating each line from its bytes) gives what the line-by-line
reading gives: the same records, or the same error naming file:line and field, for every file of
real records and for lines a hand or a kill could leave (a torn line, a wrong type, an unknown key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results import ResultsError
from harness.results.steps import (
    _may_name_nonfinite,
    _parse_lines,
    _typed,
    _whole_lines,
    read_rank_file,
)

DATA = Path(__file__).parent / "data" / "records_written"
REAL = sorted(DATA.rglob("rank*.jsonl"))


def line_by_line(path: Path) -> list:
    """What ``read_rank_file`` gave before it read whole files at once (the reference)."""
    return _typed(path, _parse_lines(path, path.read_bytes())[0])


def outcome(read, path: Path):
    try:
        return "ok", read(path)
    except ResultsError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("path", REAL, ids=[str(p.relative_to(DATA)) for p in REAL])
def test_real_records_read_the_same_and_at_once(path: Path) -> None:
    data = path.read_bytes()
    # The fast reading takes every file that names no non-finite value (its names go line by line).
    assert (_whole_lines(data) is None) == _may_name_nonfinite(data)
    assert read_rank_file(path) == line_by_line(path)


def test_the_real_files_include_both_readings() -> None:
    assert {_may_name_nonfinite(p.read_bytes()) for p in REAL} == {True, False}


GOOD = {"step": 1, "loss": 2.5, "grad_norm": 1.0, "tokens": 4096, "platform": "cpu"}


def text(obj) -> str:
    return json.dumps(obj)


LINES = {
    "good": [text(GOOD), text({**GOOD, "step": 2})],
    "an int for a float": [text({**GOOD, "loss": 2})],
    "an integral float for an int": [text({**GOOD, "tokens": 4096.0})],
    "a fraction for an int": [text({**GOOD, "tokens": 4096.5})],
    "a bool for an int": [text({**GOOD, "tokens": True})],
    "a bool for a float": [text({**GOOD, "loss": False})],
    "a string for a float": [text({**GOOD, "loss": "2.5"})],
    "a number for a string": [text({**GOOD, "platform": 3})],
    "an unknown key": [text({**GOOD, "losss": 1.0})],
    "no step": [text({"loss": 1.0})],
    "step 0": [text({**GOOD, "step": 0})],
    "a duplicate key": ['{"step": 1, "loss": 1.0, "loss": 3.0}'],
    "a list": ["[1, 2]", text(GOOD)],
    "a string": ['"x"', text(GOOD)],
    "null": ["null", text(GOOD)],
    "a bad nested record": [text({**GOOD, "memory_probe": {"device_used_bytes": 1}})],
    "a huge int": [text({**GOOD, "tokens": 10 ** 30})],
    "an overflowing float": ['{"step": 1, "loss": 1e400}'],
    "a NaN name": [text({**GOOD, "loss": "NaN"})],
    "a bare NaN": ['{"step": 1, "loss": NaN}'],
    "an escaped string": [text({**GOOD, "platform": "caf\u00e9"})],
    "a raw non-ASCII string": ['{"step": 1, "platform": "caf\u00e9"}'],
    "blank lines": ["", text(GOOD), "   ", text({**GOOD, "step": 2})],
    "not JSON in the middle": [text(GOOD), "{oops", text({**GOOD, "step": 2})],
    "not JSON at the end": [text(GOOD), "{oops"],
    "carriage returns": [text(GOOD) + "\r", text({**GOOD, "step": 2}) + "\r"],
}


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn last line"])
@pytest.mark.parametrize("name", sorted(LINES))
def test_edge_lines_read_as_line_by_line(tmp_path: Path, name: str, torn: bool) -> None:
    path = tmp_path / "rank0.jsonl"
    body = "\n".join(LINES[name]) + "\n" + ('{"step": 9, "lo' if torn else "")
    path.write_bytes(body.encode("utf-8"))
    assert outcome(read_rank_file, path) == outcome(line_by_line, path)


def test_invalid_utf8_reads_as_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(b'{"step": 1, "platform": "\xff"}\n' + text(GOOD).encode() + b"\n")
    assert outcome(read_rank_file, path) == outcome(line_by_line, path)
    assert outcome(read_rank_file, path)[0] == "error"


@pytest.mark.parametrize("name", ["good", "an int for a float", "an integral float for an int",
                                  "a duplicate key", "a huge int", "an overflowing float",
                                  "blank lines", "carriage returns", "a raw non-ASCII string"])
def test_valid_files_take_the_fast_reading(name: str) -> None:
    assert _whole_lines(("\n".join(LINES[name]) + "\n").encode("utf-8")) is not None
