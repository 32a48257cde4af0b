"""Adding sweeps to the history: :func:`record_sweep` (idempotent) and :func:`rebuild`.

A sweep is read as the gate reads it (``load_sweep`` with ``check_stored_plan``), except that a
case whose stored verdict is still the sweep's own judgment of its files (``judged.json``:
``judge.stored_is_current``) keeps it instead of being judged again, unless the caller hands the
view it judged already (``run`` at its end). In one write transaction the sweep is looked up by
its key: the same record again is a no-op (``unchanged``); a sweep that changed since (resumed,
collected) replaces its rows (``updated``); else it is ``added``; the rows go in as plain tuples
through the driver's own executemany (:func:`insert_many`).
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Optional, Sequence

from sqlalchemy import Connection, Table, delete, insert, select

from harness.errors import ConfigError
from harness.trust.stored_plan import check_stored_plan
from harness.report import SweepView, load_sweep
from harness.results import ResultsError, read_manifest, reading_many

from . import schema
from .db import History, open_history
from .extract import FigureRow, SweepRecord, sweep_record

RecordStatus = Literal["added", "updated", "unchanged"]


@dataclass(frozen=True)
class Recorded:
    """What :func:`record_sweep` did: the sweep's row id and key, ``added`` / ``updated`` /
    ``unchanged``, how many cases, arms and figures it holds, the database (password hidden) and
    the label the sweep is kept under."""

    sweep_id: int
    key: str
    status: RecordStatus
    sweep: str
    cases: int
    arms: int
    figures: int
    database: str
    label: str

    def line(self) -> str:
        return (f"history: {self.status} {self.sweep} ({self.cases} case(s), {self.arms} arm(s), "
                f"{self.figures} figure(s)) in {self.database}")


def read_sweep(sweep_dir: Path, view: Optional[SweepView] = None) -> SweepRecord:
    """The rows of a sweep folder, judged as the gate judges it (``view``: judged already)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise ConfigError(f"sweep folder {root} {what}: give the --out folder of a `dcp-harness "
                          "run` or `submit`")
    try:
        manifest = read_manifest(root)
    except (ResultsError, OSError) as exc:
        raise ConfigError(f"{root} is not a sweep the history can keep: {exc}") from None
    if view is None:  # each case as the gate judges it, or as the sweep judged it (its stamp)
        view = load_sweep(root, check_stored_plan, stamped=True)
    return sweep_record(view, manifest)


_MARKS = {"qmark": "?", "format": "%s", "pyformat": "%s"}  # DB-API paramstyle -> a placeholder


def insert_many(conn: Connection, table: Table, columns: Sequence[str],
                rows: Sequence[tuple]) -> None:
    """``rows`` (plain tuples, in ``columns``' order) into ``table`` by the driver's own
    executemany (sqlite3, psycopg): one statement, none of SQLAlchemy's per-row parameter
    processing (most of the inserts' time at 400,000 rows); the values are the driver's plain
    types (str, int, float, bool, None), stored as SQLAlchemy stores them."""
    if not rows:
        return
    mark = _MARKS.get(conn.dialect.paramstyle)
    if mark is None:  # a driver of another paramstyle: SQLAlchemy's own executemany
        conn.execute(insert(table), [dict(zip(columns, row)) for row in rows])
        return
    quote = conn.dialect.identifier_preparer
    sql = (f"INSERT INTO {quote.format_table(table)} ({', '.join(map(quote.quote, columns))}) "
           f"VALUES ({', '.join([mark] * len(columns))})")
    conn.exec_driver_sql(sql, list(rows))


def _insert_rows(conn: Connection, table: Table, rows: Sequence[object], sweep_id: int) -> None:
    """Rows of one kind (flat dataclasses: ``extract``) with ``sweep_id`` into ``table``."""
    if not rows:
        return
    names = [f.name for f in fields(rows[0])]  # type: ignore[arg-type]
    values = operator.attrgetter(*names)
    insert_many(conn, table, ["sweep_id", *names], [(sweep_id, *values(r)) for r in rows])


def store(conn: Connection, rec: SweepRecord) -> tuple[int, RecordStatus]:
    """Write ``rec`` in the caller's write transaction; (row id, what happened)."""
    t = schema.sweeps
    old = conn.execute(select(t.c.id, t.c.fingerprint).where(t.c.key == rec.key)).first()
    fingerprint = rec.fingerprint
    if old is not None and old.fingerprint == fingerprint:
        return old.id, "unchanged"
    if old is not None:
        remove(conn, old.id)
    values = {
        "key": rec.key, "fingerprint": fingerprint, "name": rec.name, "path": rec.path,
        "started": rec.started, "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": rec.host, "command": rec.command,
        "selection": json.dumps(rec.selection, sort_keys=True), "platform": rec.platform,
        "commit": rec.commit, "dirty": rec.dirty, "repo": rec.repo, "status": rec.status,
        "exit_code": rec.exit_code,
        "code": json.dumps([v.model_dump(mode="json") for v in rec.code]),
        "label": rec.label or schema.DEFAULT_LABEL, "position": rec.position,
    }
    if old is not None:
        values["id"] = old.id  # the same sweep keeps its id
    sweep_id = conn.execute(insert(t).values(**values)).inserted_primary_key[0]
    for table, rows in ((schema.cases, rec.cases), (schema.pairs, rec.pairs),
                        (schema.arms, rec.arms), (schema.steps, rec.steps)):
        _insert_rows(conn, table, rows, sweep_id)
    if rec.figures:
        ids = series_ids(conn, rec.figures)
        insert_many(conn, schema.figures, ("sweep_id", "series_id", "started", "value", "spread"),
                    [(sweep_id, ids[_key(f)], rec.started, f.value, f.spread)
                     for f in rec.figures])
    return sweep_id, "added" if old is None else "updated"


_KEY = ("case_id", "kind", "subject", "rank", "metric", "platform")
_key = operator.attrgetter(*_KEY)  # a figure's (or a series row's) series key, as a tuple


def select_in(conn: Connection, table: Table, columns: Sequence[str], column: str,
              values: Sequence[object]) -> list[tuple]:
    """``columns`` of ``table``'s rows whose ``column`` is one of ``values``, as plain tuples
    through the driver's own cursor (SQLAlchemy's result rows cost most of the lookup at
    400,000 series); a driver of another paramstyle: through SQLAlchemy."""
    mark = _MARKS.get(conn.dialect.paramstyle)
    if mark is None or not values:
        query = select(*(table.c[c] for c in columns)).where(table.c[column].in_(values))
        return [tuple(r) for r in conn.execute(query)]
    quote = conn.dialect.identifier_preparer
    sql = (f"SELECT {', '.join(map(quote.quote, columns))} FROM {quote.format_table(table)} "
           f"WHERE {quote.quote(column)} IN ({', '.join([mark] * len(values))})")
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, list(values))
        return cursor.fetchall()
    finally:
        cursor.close()


def series_ids(conn: Connection, figures: Sequence[FigureRow]) -> dict[tuple, int]:
    """Series key -> id for every figure's series, the missing ones made (in the caller's
    write transaction, so no other writer makes them meanwhile)."""
    keys: dict[str, set[tuple]] = {}  # case id -> its figures' series keys
    for f in figures:
        keys.setdefault(f.case_id, set()).add(_key(f))
    cases = sorted(keys)

    def known() -> dict[tuple, int]:
        return {r[:-1]: r[-1] for r in select_in(conn, schema.series, (*_KEY, "id"),
                                                 "case_id", cases)}

    ids = known()
    # the new keys in sorted order (the case id first: each case's keys sorted alone, 4x faster
    # than one sort of 400,000 keys)
    new = [k for case in cases for k in sorted(keys[case].difference(ids))]
    if new:
        insert_many(conn, schema.series, _KEY, new)
        ids = known()
    return ids


def remove(conn: Connection, sweep_id: int) -> None:
    """Delete one sweep's rows (children first)."""
    for table in schema.SWEEP_TABLES:
        column = table.c.id if table is schema.sweeps else table.c.sweep_id
        conn.execute(delete(table).where(column == sweep_id))


def write_record(history: History, rec: SweepRecord) -> Recorded:
    """Write a sweep's rows into an open history, in one transaction of their own."""
    with history.write() as conn, reading_many():  # its rows: many objects, no cycles
        sweep_id, status = store(conn, rec)
    return Recorded(sweep_id, rec.key, status, rec.path, len(rec.cases), len(rec.arms),
                    len(rec.figures), history.shown, rec.label or schema.DEFAULT_LABEL)


def add(history: History, sweep_dir: Path, view: Optional[SweepView] = None) -> Recorded:
    """Read one sweep folder and write it into an open history."""
    with reading_many():  # the sweep's records and rows: many objects, no cycles
        return write_record(history, read_sweep(sweep_dir, view))


def record_sweep(sweep_dir: Path, *, url: Optional[str] = None,
                 view: Optional[SweepView] = None, label: Optional[str] = None) -> Recorded:
    """Add the sweep in ``sweep_dir`` to the history at ``url`` (None: ``$DCP_HARNESS_HISTORY``,
    else ``results/history.sqlite`` under the current directory). Idempotent: the same sweep
    again is ``unchanged``; one that changed since (resumed, collected) is ``updated``. ``view``:
    the sweep as the caller judged it already (``run``'s reports), else it is judged here as
    ``gate`` judges it. ``label``: the label it is kept under (default its own: ``labels``). A
    ConfigError (HistoryError for the database) for a folder that is not a sweep or a database
    that cannot be used; nothing is written then."""
    with reading_many():  # the sweep's records and rows: many objects, no cycles
        rec = read_sweep(Path(sweep_dir), view)  # before the database: a bad folder creates nothing
    if label is not None:  # kept under this label whatever its manifest says (bisect's steps)
        rec = replace(rec, label=label)
    history = open_history(url)
    try:
        return write_record(history, rec)
    finally:
        history.close()


def sweep_folders(paths: Sequence[Path]) -> list[Path]:
    """The sweep folders in ``paths``: each a sweep (it has a manifest) or a folder of sweeps
    (``results/``: its sub-folders that have one, ``latest`` left out), sorted."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder: give sweep folders or folders of sweeps "
                              "(such as results/)")
        if (path / "manifest.json").is_file():
            found.append(path.resolve())
            continue
        inner = [c.resolve() for c in sorted(path.iterdir())
                 if c.is_dir() and not c.is_symlink() and (c / "manifest.json").is_file()]
        if not inner:
            raise ConfigError(f"{path} holds no sweep folders (none with a manifest.json)")
        found += inner
    return sorted(dict.fromkeys(found))


def rebuild(history: History, paths: Sequence[Path]) -> list[Recorded | str]:
    """Re-import every sweep folder under ``paths`` (each one alone: one that cannot be read is
    reported, the others still go in). Each entry a Recorded, or the line of a folder left out."""
    out: list[Recorded | str] = []
    for folder in sweep_folders(paths):
        try:
            out.append(add(history, folder))
        except ConfigError as exc:
            out.append(f"history: left out {folder}: {exc}")
    return out
