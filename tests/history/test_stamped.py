"""`history add` takes the verdict a sweep judged while its stamp is current (``judged.json``:
the same judging code, sweep folder, verdict bytes and input files), and judges again every
case whose stamp is missing or stale: the rows it stores are the rows of the gate's judgment
either way, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.history import open_history, record_sweep, schema
from harness.history.extract import case_arm_rows, decode_arm_rows, sweep_record
from harness.history.store import read_sweep, write_record
from harness.judge import stored_is_current, write_stamp
from harness.launch.sweep_folder import finalize_case, load_plan
from harness.report import load_sweep
from harness.results import JUDGED_FILE, KEPT_ROWS_FILE, VERDICT_FILE, read_manifest
from harness.trust.stored_plan import check_stored_plan
from tests.benches import load_bench

# Columns that differ between two adds of one sweep whatever was read: when it was added.
NOT_COMPARED = {"recorded"}


def rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every table a sweep fills, in id order, as plain tuples."""
    history = open_history(url)
    try:
        with history.read() as conn:
            return {t.name: [tuple(v for k, v in r._mapping.items() if k not in NOT_COMPARED)
                             for r in conn.execute(select(t).order_by(*t.primary_key.columns))]
                    for t in (*schema.SWEEP_TABLES, schema.series)}
    finally:
        history.close()


def judged_again(sweep: Path, url: str) -> None:
    """The sweep added as the gate reads it: every case judged again, every plan checked."""
    history = open_history(url)
    try:
        write_record(history, sweep_record(load_sweep(sweep, check_stored_plan),
                                           read_manifest(sweep)))
    finally:
        history.close()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two cases of the scale bench (real plans: 4 arms of 8 ranks, 20 steps), judged as a run
    judges them: the first fails (its graph arm's loss drifts), the second passes."""
    bench = load_bench("scale")
    _, out, _ = bench.synthesize(tmp_path_factory.mktemp("scale"), 2)
    for case_dir in sorted(p for p in out.iterdir() if (p / "plan.json").is_file()):
        finalize_case(case_dir)
    return out


def case_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if (p / VERDICT_FILE).is_file())


def test_the_sweep_judgment_is_current_until_a_file_changes(sweep: Path, tmp_path: Path) -> None:
    case_dir = case_dirs(sweep)[1]
    plan = load_plan(case_dir)
    assert stored_is_current(case_dir, plan)
    rank = case_dir / "graph" / "rank3.jsonl"
    st = os.stat(rank)
    try:
        os.utime(rank, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: the same bytes
        assert not stored_is_current(case_dir, plan)
    finally:
        os.utime(rank, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert stored_is_current(case_dir, plan)


def test_stamped_and_judged_again_store_the_same_rows(sweep: Path, url: str,
                                                      tmp_path: Path) -> None:
    assert all(stored_is_current(d, load_plan(d)) for d in case_dirs(sweep))
    other = f"sqlite:///{tmp_path / 'judged-again.sqlite'}"
    judged_again(sweep, other)
    record_sweep(sweep, url=url)
    mine, reference = rows(url), rows(other)
    assert mine == reference
    assert [r[3] for r in mine["cases"]] == ["fail", "pass"]  # (id, sweep, case, status, ...)
    assert len(mine["figures"]) == 2 * 394 and len(mine["steps"]) == 2 * 4 * 20
    # the same sweep judged again (its arm rows made from the records) is the same record
    history = open_history(url)
    try:
        again = write_record(history, sweep_record(load_sweep(sweep, check_stored_plan),
                                                   read_manifest(sweep)))
    finally:
        history.close()
    assert again.status == "unchanged"


def test_a_stamped_case_is_read_from_its_kept_rows(sweep: Path) -> None:
    """While its stamp holds, a case's arm files are not read: its arms' rows are the ones the
    run kept (``history-rows.json``), the same rows the records give, and the same digest."""
    stamped = load_sweep(sweep, check_stored_plan, stamped=True)
    judged = load_sweep(sweep, check_stored_plan)
    assert [c.kept_rows for c in stamped.cases] == [True, True]
    assert all(not c.arms for c in stamped.cases)
    assert not any(c.kept_rows for c in judged.cases)
    for kept, made in zip(stamped.cases, judged.cases):
        assert case_arm_rows(kept) == case_arm_rows(made)
        assert len(case_arm_rows(kept).steps) == 4 * 20
    assert (sweep_record(stamped, read_manifest(sweep)).fingerprint
            == sweep_record(judged, read_manifest(sweep)).fingerprint)


def test_changed_kept_rows_or_records_are_read_again(sweep: Path, tmp_path: Path) -> None:
    """Kept rows edited after the stamp make it stale (the records are read again, their rows
    stored); records changed and judged again make new kept rows: a new fingerprint."""
    case_dir = case_dirs(sweep)[1]
    kept_path = case_dir / KEPT_ROWS_FILE
    kept = kept_path.read_bytes()
    rank = case_dir / "graph" / "rank0.jsonl"
    records = rank.read_bytes()
    before = read_sweep(sweep)
    try:
        rows = decode_arm_rows(kept)
        edited = replace(rows, steps=(replace(rows.steps[0], loss=0.5), *rows.steps[1:]))
        kept_path.write_bytes(edited.encoded())
        assert kept_path.read_bytes() != kept
        assert not stored_is_current(case_dir, load_plan(case_dir))
        view = load_sweep(sweep, check_stored_plan, stamped=True)
        assert [c.kept_rows for c in view.cases] == [True, False]
        assert read_sweep(sweep) == before  # the rows of its records, not of the edited file
        lines = records.decode().splitlines(keepends=True)
        first = json.loads(lines[0])
        first["loss"] = first["loss"] + 1.0
        rank.write_text(json.dumps(first) + "\n" + "".join(lines[1:]))
        finalize_case(case_dir)
        changed = read_sweep(sweep)
        assert [c.kept_rows for c in load_sweep(sweep, check_stored_plan, stamped=True).cases] \
            == [True, True]
        assert changed.fingerprint != before.fingerprint
        assert changed.steps != before.steps
    finally:
        rank.write_bytes(records)
        finalize_case(case_dir)
    assert read_sweep(sweep).fingerprint == before.fingerprint


def test_a_stale_stamp_is_judged_again(sweep: Path, tmp_path: Path) -> None:
    """A failing case's verdict.json edited to say pass (its stamp now stale: the verdict's bytes
    differ) is judged again: the history keeps the gate's verdict, not the edit."""
    failing = case_dirs(sweep)[0]
    path = failing / VERDICT_FILE
    kept = path.read_bytes()
    verdict = json.loads(kept)
    assert verdict["status"] == "fail"
    try:
        verdict["status"] = "pass"
        for entry in verdict["pairs"]:
            entry["status"] = "pass"
        path.write_text(json.dumps(verdict))
        assert not stored_is_current(failing, load_plan(failing))
        mine, reference = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
        record_sweep(sweep, url=mine)
        judged_again(sweep, reference)
        assert rows(mine) == rows(reference)
        kept_rows = rows(mine)
        assert kept_rows["cases"][0][3] == "fail"  # what the records show, not the edit
        assert any("verdict.json disagrees" in (r[6] or "") for r in kept_rows["pairs"])
    finally:
        path.write_bytes(kept)


def test_no_stamp_or_another_judging_code_is_judged_again(sweep: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = case_dirs(sweep)
    stamp = (second / JUDGED_FILE).read_bytes()
    calls: list[str] = []
    import harness.report.load as load

    real = load.judge
    monkeypatch.setattr(load, "judge", lambda plan, *a, **k: calls.append(plan.case_id)
                        or real(plan, *a, **k))
    try:
        (second / JUDGED_FILE).unlink()
        record_sweep(sweep, url=f"sqlite:///{tmp_path / 'a.sqlite'}")
        assert calls == [second.name]  # only the case without a stamp
        calls.clear()
        monkeypatch.setattr("harness.judge.judge_identity", lambda: "another harness")
        record_sweep(sweep, url=f"sqlite:///{tmp_path / 'b.sqlite'}")
        assert calls == [first.name, second.name]
        calls.clear()  # a harness without source files to hash: no stamp it writes is current
        monkeypatch.setattr("harness.judge.judge_identity", lambda: "")
        write_stamp(second, load_plan(second))
        assert not stored_is_current(second, load_plan(second))
    finally:
        (second / JUDGED_FILE).write_bytes(stamp)
