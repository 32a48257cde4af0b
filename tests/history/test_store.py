"""record_sweep: a sweep goes in once (the same again is a no-op, a changed one replaces its
rows), read as the gate reads it; what is not a sweep is refused before a database is made;
several processes adding at once lose and double nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from harness.errors import ConfigError
from harness.history import open_history, record_sweep, series
from harness.history import schema
from harness.history.schema import PAIR, WHOLE
from harness.results import add_to_manifest
from harness.results.manifest import SweepStart
from tests.history.sweeps import STEPS, make_sweep, record_golden, started

REPO = Path(__file__).resolve().parents[2]


def counts(url: str) -> dict[str, int]:
    history = open_history(url)
    try:
        with history.read() as conn:
            return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                    for t in schema.SWEEP_TABLES}
    finally:
        history.close()


def test_a_sweep_goes_in_once_with_its_figures_statuses_and_commit(url: str, tmp_path: Path):
    record_golden(tmp_path)
    sweep = make_sweep(tmp_path, tmp_path / "s1", started=started(0), commit="c" * 40, dirty=True,
                       time_s=0.25)
    first = record_sweep(sweep, url=url)
    assert (first.status, first.cases, first.arms) == ("added", 1, 1)
    before = counts(url)
    again = record_sweep(sweep, url=url)
    assert (again.status, again.sweep_id) == ("unchanged", first.sweep_id)
    assert counts(url) == before and before["sweeps"] == 1 and before["steps"] == STEPS

    history = open_history(url)
    with history.read() as conn:
        sweep_row = conn.execute(select(schema.sweeps)).one()
        case_row = conn.execute(select(schema.cases)).one()
        pair_row = conn.execute(select(schema.pairs)).one()
        arms = series(conn, case="drift-case", kinds=("arm", "pair"), ranks=True)
    history.close()
    assert (sweep_row.commit, sweep_row.dirty, sweep_row.status, sweep_row.exit_code) == (
        "c" * 40, True, "pass", 0)
    assert (sweep_row.host, sweep_row.platform, sweep_row.started) == ("node1", "h100", started(0))
    assert (case_row.case_id, case_row.status, case_row.commit) == ("drift-case", "pass", "c" * 40)
    assert (pair_row.pair, pair_row.status, pair_row.skip, pair_row.failed_checks) == (
        "golden", "pass", None, "")
    by = {(k.subject, k.rank, k.metric): [p.value for p in v] for k, v in arms.items()}
    assert by[("eager", WHOLE, "step_time_median_s")] == [0.25]
    assert by[("eager", 1, "step_time_median_s")] == [0.25]  # each rank's figures too
    assert by[("eager", WHOLE, "device_used_bytes")] == [3 * 4 * 2 ** 30]
    assert by[("eager", WHOLE, "final_loss")] == [pytest.approx(2.5 - 0.05 * STEPS)]
    assert ("golden", WHOLE, "step_time") in by  # the pair's check values
    assert {k.kind for k in arms if k.subject == "golden"} == {PAIR}


def test_a_sweep_that_changed_since_replaces_its_rows(url: str, tmp_path: Path):
    record_golden(tmp_path)
    sweep = make_sweep(tmp_path, tmp_path / "s1", started=started(0))
    first = record_sweep(sweep, url=url)
    before = counts(url)
    # Resumed later from another host: a second start in the manifest.
    add_to_manifest(sweep, [], SweepStart(command="run", started=started(1), host="node2"))
    second = record_sweep(sweep, url=url)
    assert (second.status, second.sweep_id) == ("updated", first.sweep_id)
    assert counts(url) == before


def test_what_is_not_a_sweep_is_refused_and_no_database_is_made(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    for path, words in ((tmp_path / "missing", "does not exist"),
                        (tmp_path / "a-file", "is not a folder"),
                        (tmp_path / "empty", "has no manifest.json")):
        with pytest.raises(ConfigError, match=words) as err:
            record_sweep(path, url=url)
        assert "give the --out folder of a `dcp-harness run`" in str(err.value)
    assert not (tmp_path / "h.sqlite").exists()


WRITER = """
import sys, time
from pathlib import Path
from harness.history import open_history
from harness.history.store import write_record, read_sweep
url, ready, go, sweeps = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
records = [read_sweep(Path(s)) for s in sweeps]  # the slow part first: then all write at once
ready.touch()
while not go.exists():
    time.sleep(0.01)
history = open_history(url)  # an empty database: every writer makes the schema at once
for rec in records:
    write_record(history, rec)
history.close()
"""


@pytest.mark.slow
def test_several_processes_adding_at_once_lose_and_double_nothing(url: str, tmp_path: Path):
    record_golden(tmp_path)
    sweeps = [make_sweep(tmp_path, tmp_path / f"s{i}", started=started(i)) for i in range(3)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # Three writers at once; each adds its own sweep and every one adds sweep 0.
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(len(sweeps))]
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, str(r), str(go), str(sweeps[0]),
                               str(s)], env=env, stderr=subprocess.PIPE, text=True)
             for r, s in zip(ready, sweeps)]
    deadline = time.monotonic() + 240
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, errors
    one = counts(url)
    assert one["sweeps"] == 3 and one["cases"] == 3 and one["steps"] == 3 * STEPS
    history = open_history(url)
    with history.read() as conn:
        names = sorted(conn.execute(select(schema.sweeps.c.name)).scalars())
        per_sweep = set(conn.execute(select(func.count()).select_from(schema.figures)
                                     .group_by(schema.figures.c.sweep_id)).scalars())
    history.close()
    assert names == ["s0", "s1", "s2"] and len(per_sweep) == 1


def test_rebuild_brings_every_sweep_back_and_names_a_folder_it_cannot_read(url, tmp_path,
                                                                          capsys, monkeypatch):
    record_golden(tmp_path)
    results = tmp_path / "results"
    for i in range(2):
        make_sweep(tmp_path, results / f"night{i}", started=started(i))
    from harness.cli import main

    assert main(["history", "add", str(results / "night0"), str(results / "night1"),
                 "--history", url]) == 0
    before = counts(url)
    # A folder with a manifest that is not one: named and left out; the others go in again.
    (results / "broken").mkdir()
    (results / "broken" / "manifest.json").write_text("{not json")
    capsys.readouterr()
    assert main(["history", "rebuild", str(results), "--history", url]) == 2
    out = capsys.readouterr().out
    assert f"history: left out {results / 'broken'}:" in out
    assert out.count("history: unchanged") == 2
    assert "history rebuild: 2 sweep(s) in" in out and "1 left out" in out
    assert counts(url) == before


def test_a_damaged_file_loses_nothing_the_sweeps_rebuild_it(tmp_path: Path, capsys):
    from harness.cli import main

    record_golden(tmp_path)
    sweeps = [make_sweep(tmp_path, tmp_path / "results" / f"night{i}", started=started(i))
              for i in range(2)]
    db = tmp_path / "history.sqlite"
    assert main(["history", "add", *map(str, sweeps), "--history", str(db)]) == 0
    before = counts(f"sqlite:///{db}")
    db.write_bytes(b"\0garbage" * 100)  # a disk that failed under it
    assert main(["history", "add", str(sweeps[0]), "--history", str(db)]) == 2
    assert "move it away and rebuild it" in capsys.readouterr().err
    db.rename(tmp_path / "history.sqlite.damaged")
    assert main(["history", "rebuild", str(tmp_path / "results"), "--history", str(db)]) == 0
    assert counts(f"sqlite:///{db}") == before


def test_a_series_missing_from_the_newest_sweeps_still_gives_its_last_points(url, tmp_path):
    for name in ("old-case", "new-case"):
        record_golden(tmp_path, name)
    for i in range(3):  # three nights of one case, then two of another
        record_sweep(make_sweep(tmp_path, tmp_path / f"a{i}", started=started(i), name="old-case",
                                time_s=0.1 * (i + 1)), url=url)
    for i in range(3, 5):
        record_sweep(make_sweep(tmp_path, tmp_path / f"b{i}", started=started(i),
                                name="new-case"), url=url)
    history = open_history(url)
    with history.read() as conn:
        old = series(conn, case="old-case", metric="step_time_median_s", last=2)
        both = series(conn, case="*-case", metric="step_time_median_s", last=2)
    history.close()
    (points,) = old.values()
    assert [(p.sweep, p.value) for p in points] == [("a1", pytest.approx(0.2)),
                                                    ("a2", pytest.approx(0.3))]
    assert sorted(k.case_id for k in both) == ["new-case", "old-case"]


def test_the_fingerprint_holds_each_case_s_arm_rows_by_their_digest(tmp_path: Path):
    """The record's fields and its cases' and pairs' rows are hashed as ``asdict`` gives them;
    each case's arm rows by the digest of their bytes (kept beside a stamp, or made again)."""
    import dataclasses
    import hashlib
    import json

    from harness.history.extract import PAIR, row_dicts
    from harness.history.store import read_sweep

    record_golden(tmp_path)
    sweep = make_sweep(tmp_path, tmp_path / "s1", started=started(0), commit="c" * 40)
    rec = read_sweep(sweep)
    assert rec.figures and rec.steps and rec.code and len(rec.arm_digests) == len(rec.cases)
    data = dataclasses.asdict(dataclasses.replace(rec, arms=(), figures=(), steps=()))
    for name in ("path", "arms", "figures", "steps"):
        data.pop(name)
    data["pair_figures"] = row_dicts([f for f in rec.figures if f.kind == PAIR])
    want = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    assert rec.fingerprint == want
    other = dataclasses.replace(rec, arm_digests=("0" * 64,) + rec.arm_digests[1:])
    assert other.fingerprint != want
