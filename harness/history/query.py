"""Reading the history: the series of a figure over sweeps, and the last sweeps.

A series is one figure of one case, subject (arm or pair), rank and platform over the sweeps of
one label that hold it, oldest first; the last ``last`` points of each come by index (the
``series`` table, then ``figures`` by series and start), so the answer costs the points asked
for, not the history's size. Points are in the order of their commit's place in the first-parent
history where it is known (a later sweep of an older commit sits before the newer commit's), by
start otherwise (:func:`in_commit_order`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Connection, func, select

from . import schema
from .schema import ARM, WHOLE


@dataclass(frozen=True, order=True)
class SeriesKey:
    case_id: str
    kind: str  # ARM or PAIR
    subject: str
    rank: int  # WHOLE: the arm or pair as a whole
    metric: str
    platform: str

    @property
    def label(self) -> str:
        rank = "" if self.rank == WHOLE else f" rank {self.rank}"
        where = f" [{self.platform}]" if self.platform else ""
        return f"{self.case_id} / {self.subject}{rank} {self.metric}{where}"


@dataclass(frozen=True)
class Point:
    sweep: str  # the folder's name
    path: str
    started: str
    commit: Optional[str]
    dirty: Optional[bool]
    case_hash: str
    value: float
    spread: Optional[float] = None  # the figure's own noise as its sweep measured it
    position: Optional[int] = None  # the commit's place in the first-parent history
    label: str = ""

    @property
    def commit_label(self) -> str:
        if self.commit is None:
            return "commit unknown"
        return self.commit[:12] + (" (local changes)" if self.dirty else "")

    @property
    def short(self) -> str:
        """The sweep and short commit: how a plot's axis and a line name the point."""
        return f"{self.sweep} {self.commit[:7] if self.commit else '?'}"


def in_commit_order(points: list[Point]) -> list[Point]:
    """``points`` (in start order) with those of a known commit position sorted by it among the
    places they hold (ties by start); those of an unknown one keep their place."""
    known = [i for i, p in enumerate(points) if p.position is not None]
    moved = sorted((points[i] for i in known), key=lambda p: (p.position, p.started))
    out = list(points)
    for i, p in zip(known, moved):
        out[i] = p
    return out


def _like(pattern: str) -> str:
    return pattern.replace("%", r"\%").replace("_", r"\_").replace("*", "%").replace("?", "_")


def _matching(conn: Connection, case: Optional[str], metric: Optional[str],
              platform: Optional[str], kinds: tuple[str, ...], ranks: bool
              ) -> dict[int, SeriesKey]:
    t = schema.series
    where = [t.c.kind.in_(kinds)]
    if not ranks:
        where.append(t.c.rank == WHOLE)
    for column, value in ((t.c.case_id, case), (t.c.metric, metric), (t.c.platform, platform)):
        if value is not None:
            where.append(column.like(_like(value), escape="\\") if any(ch in value for ch in "*?")
                         else column == value)
    return {r.id: SeriesKey(r.case_id, r.kind, r.subject, r.rank, r.metric, r.platform)
            for r in conn.execute(select(t).where(*where))}


def _chunks(items: list, size: int = 500) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def series(conn: Connection, *, case: Optional[str] = None, metric: Optional[str] = None,
           platform: Optional[str] = None, last: int = 20, kinds: tuple[str, ...] = (ARM,),
           ranks: bool = False, label: Optional[str] = None) -> dict[SeriesKey, list[Point]]:
    """Series -> its last ``last`` points of sweeps labelled ``label`` (None: every label), in
    commit order (:func:`in_commit_order`). ``case``, ``metric`` and ``platform`` may hold ``*``
    and ``?`` wildcards; ``kinds``: arm figures, pair check values or both; ``ranks``: each
    rank's too (else the arm as a whole).

    The points of the newest ``last`` sweeps come in one query (a nightly selection holds every
    series in each); a series with fewer there is read alone, newest first by its index."""
    keys = _matching(conn, case, metric, platform, kinds, ranks)
    if not keys:
        return {}
    f, s = schema.figures, schema.sweeps
    of_label = [s.c.label == label] if label is not None else []
    recent = [r.id for r in conn.execute(select(s.c.id).where(*of_label)
                                         .order_by(s.c.started.desc(), s.c.id.desc()).limit(last))]
    found: dict[int, list[tuple]] = {k: [] for k in keys}
    ids = list(keys)
    cols = (f.c.started, f.c.sweep_id, f.c.value, f.c.spread)
    for part in _chunks(ids):
        for r in conn.execute(select(f.c.series_id, *cols)
                              .where(f.c.sweep_id.in_(recent), f.c.series_id.in_(part))):
            found[r.series_id].append(tuple(r)[1:])
    for sid in ids:
        if len(found[sid]) < last:
            found[sid] = [tuple(r) for r in conn.execute(
                select(*cols).join(s, s.c.id == f.c.sweep_id)
                .where(f.c.series_id == sid, *of_label)
                .order_by(f.c.started.desc(), f.c.sweep_id.desc()).limit(last))]
    return _points(conn, keys, found)


def case_ids(conn: Connection) -> list[str]:
    """Every case the history holds a figure of, sorted."""
    t = schema.series
    return [r.case_id for r in conn.execute(select(t.c.case_id).distinct().order_by(t.c.case_id))]


def labels(conn: Connection) -> dict[str, int]:
    """Label -> how many sweeps carry it."""
    s = schema.sweeps
    return {r.label: r.n for r in conn.execute(select(s.c.label, func.count().label("n"))
                                               .group_by(s.c.label).order_by(s.c.label))}


def _points(conn: Connection, keys: dict[int, SeriesKey],
            found: dict[int, list[tuple]]) -> dict[SeriesKey, list[Point]]:
    """The points of each series, in commit order, with their sweep's and case's details."""
    s, c = schema.sweeps, schema.cases
    sweep_ids = sorted({row[1] for pts in found.values() for row in pts})
    sweeps, cases = {}, {}
    for part in _chunks(sweep_ids):
        sweeps.update({r.id: r for r in conn.execute(
            select(s.c.id, s.c.name, s.c.path, s.c.label, s.c.position).where(s.c.id.in_(part)))})
        cases.update({(r.sweep_id, r.case_id): r for r in conn.execute(
            select(c.c.sweep_id, c.c.case_id, c.c.commit, c.c.dirty, c.c.case_hash, c.c.position)
            .where(c.c.sweep_id.in_(part)))})
    out: dict[SeriesKey, list[Point]] = {}
    for sid, pts in found.items():
        key = keys[sid]
        rows = []
        for started, sweep_id, value, spread in sorted(pts, key=lambda r: (r[0], r[1])):
            sw, ca = sweeps[sweep_id], cases.get((sweep_id, key.case_id))
            position = ca.position if ca is not None and ca.position is not None else None
            rows.append(Point(sw.name, sw.path, started, ca.commit if ca else None,
                              ca.dirty if ca else None, ca.case_hash if ca else "", value,
                              spread, position, sw.label))
        if rows:
            out[key] = in_commit_order(rows)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class SweepRow:
    name: str
    path: str
    started: str
    host: str
    platform: str
    commit: Optional[str]
    dirty: Optional[bool]
    status: str
    exit_code: int
    cases: int
    label: str = ""


def last_sweeps(conn: Connection, last: int = 20) -> list[SweepRow]:
    """The newest ``last`` sweeps, newest first, with how many cases each holds."""
    s, c = schema.sweeps, schema.cases
    count = select(func.count()).where(c.c.sweep_id == s.c.id).scalar_subquery()
    rows = conn.execute(select(s.c.name, s.c.path, s.c.started, s.c.host, s.c.platform,
                               s.c.commit, s.c.dirty, s.c.status, s.c.exit_code,
                               count.label("cases"), s.c.label)
                        .order_by(s.c.started.desc(), s.c.id.desc()).limit(last))
    return [SweepRow(*r) for r in rows]


def sweep_count(conn: Connection) -> int:
    return conn.execute(select(func.count()).select_from(schema.sweeps)).scalar_one()
