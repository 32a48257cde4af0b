"""Where the history lives and how it is opened: one database layer (SQLAlchemy Core) for SQLite
and PostgreSQL.

* The URL: ``--history URL`` if given, else ``$DCP_HARNESS_HISTORY``, else the SQLite file
  ``results/history.sqlite`` under the current directory (beside ``results/latest``). A plain path
  is a SQLite file. ``postgresql+psycopg://user@host:port/db`` is a team's server.
* SQLite: WAL journal, a busy timeout, and every write in ``BEGIN IMMEDIATE``, so several processes
  add sweeps at once and each waits its turn. PostgreSQL: every write takes one transaction-level
  advisory lock first (the same order of writers).
* Opening checks what is there before touching it: a file that is not a database, a database of
  someone else's tables, or one of a newer schema is a :class:`HistoryError` naming what to do, and
  nothing is written; an older schema of ours is migrated (``migrations``) inside a write.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from harness.errors import ConfigError

from . import schema
from .migrations import migrate

ENV_VAR = "DCP_HARNESS_HISTORY"
DEFAULT_PATH = Path("results") / "history.sqlite"
BUSY_TIMEOUT_S = 60
SUPPORTED = ("sqlite", "postgresql")  # SQLAlchemy backend names the history runs on
_PG_LOCK = 0x64637068  # "dcph": the advisory lock every PostgreSQL writer takes first


class HistoryError(ConfigError):
    """The history database cannot be used as it is (exit 2); the message says what to do."""


def history_url(option: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> str:
    """The database URL: ``option``, else ``$DCP_HARNESS_HISTORY``, else the default SQLite file;
    a plain path is a SQLite file (made absolute)."""
    env = os.environ if env is None else env
    given = option or env.get(ENV_VAR) or str(DEFAULT_PATH)
    if "://" not in given:
        return f"sqlite:///{Path(given).expanduser().resolve()}"
    return given


@dataclass(frozen=True)
class History:
    """An open history database: its engine and URL (the password hidden in ``shown``)."""

    engine: Engine
    url: str

    @property
    def shown(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction, serialized with every other writer."""
        with self._guard("write to"), self.engine.connect() as conn:
            conn = conn.execution_options(history_write=True)
            with conn.begin():
                if not self.sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._guard("read"), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            raise HistoryError(_db_problem(self, what, exc)) from None

    def close(self) -> None:
        self.engine.dispose()


def _db_problem(history: "History", what: str, exc: DBAPIError) -> str:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    if history.sqlite:
        path = make_url(history.url).database
        return (f"cannot {what} the history database {path} ({reason}): the file is left as it "
                "is; if it is damaged, move it away and rebuild it from the sweep folders with "
                "`dcp-harness history rebuild DIR...`")
    return (f"cannot {what} the history database at {history.shown} ({reason}): start the server "
            f"or fix the URL (--history URL or ${ENV_VAR})")


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # transactions begin where _on_begin says
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")  # not kept in the file
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        write = conn.get_execution_options().get("history_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _sqlite_folder(path: Path) -> None:
    """The folder of a new SQLite file: made for the default (``results/`` here, as ``run``
    makes it), else it must exist (a mistyped path would make a history nobody reads)."""
    if path.parent.is_dir():
        return
    if path == DEFAULT_PATH.resolve():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    raise HistoryError(f"no folder {path.parent} for the history database {path}: create it "
                       f"(mkdir -p {path.parent}) or fix the path (--history URL or ${ENV_VAR})")


def open_history(url: Optional[str] = None, *, create: bool = True) -> History:
    """The history database at ``url`` (:func:`history_url` resolves None), checked and brought
    to the current schema; ``create=False`` (the readers) refuses a SQLite file that is not there
    and an empty database instead of making one (nothing written). A new SQLite file's folder
    must exist unless it is the default's (``results/``, made). Another backend than SQLite and
    PostgreSQL is refused naming those two. A :class:`HistoryError` names what is wrong and what
    to do."""
    url = history_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise HistoryError(f"'{url}' is not a database URL: give a SQLite file path or a URL such "
                           "as postgresql+psycopg://user@host:5432/db (--history URL or "
                           f"${ENV_VAR})") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise HistoryError(f"{parsed.render_as_string(hide_password=True)}: a history database "
                           f"cannot be {backend!r}; it is SQLite (a file path, or "
                           "sqlite:////abs/path.sqlite) or PostgreSQL "
                           "(postgresql+psycopg://user@host:5432/db) (--history URL or "
                           f"${ENV_VAR})")
    if backend == "sqlite":
        path = Path(parsed.database or "")
        if not path.is_file():
            if not create:
                raise HistoryError(f"no history database at {path}: add sweeps with `dcp-harness "
                                   "history add SWEEP...` (or give --history URL)")
            _sqlite_folder(path)
        engine = _sqlite_engine(url)
    else:
        try:
            engine = create_engine(url, connect_args={"connect_timeout": 10})
        except (NoSuchModuleError, ModuleNotFoundError) as exc:
            raise HistoryError(f"no database driver for {parsed.render_as_string(True)} ({exc}): "
                               "install it with `pip install 'dcp-harness[postgres]'`") from None
    history = History(engine, url)
    try:
        _prepare(history, create)
    except BaseException:
        history.close()
        raise
    return history


def _version(conn: Connection, history: History) -> int:
    """The schema version of our database (0: empty); HistoryError for someone else's."""
    tables = set(inspect(conn).get_table_names())
    if not tables:
        return 0
    where = history.shown
    if schema.meta.name not in tables:
        raise HistoryError(f"{where} holds tables that are not a dcp-harness history "
                           f"({', '.join(sorted(tables)[:5])}): nothing was changed; give another "
                           f"database (--history URL or ${ENV_VAR})")
    rows = dict(conn.execute(schema.meta.select()).all())
    if rows.get("application") != schema.APPLICATION or not rows.get("schema_version", "").isdigit():
        raise HistoryError(f"{where} is not a dcp-harness history (its meta table says "
                           f"{rows!r}): nothing was changed; give another database")
    version = int(rows["schema_version"])
    if version > schema.SCHEMA_VERSION:
        raise HistoryError(f"{where} has history schema version {version}, this dcp-harness reads "
                           f"up to {schema.SCHEMA_VERSION}: upgrade dcp-harness")
    return version


def _use_wal(history: History) -> None:
    """Our SQLite file in WAL mode (kept in the file: readers never wait for a writer); set
    outside any transaction, and only once the file is known to be ours."""
    raw = history.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.close()
    finally:
        raw.close()


def _prepare(history: History, create: bool = True) -> None:
    with history.read() as conn:
        version = _version(conn, history)
    if version == 0 and not create:  # a reader leaves an empty database (or file) as it is
        raise HistoryError(f"{history.shown} holds no history yet (an empty database): add "
                           "sweeps with `dcp-harness history add SWEEP...` (or give --history URL)")
    if history.sqlite:
        with history._guard("open"):
            _use_wal(history)
    if version == schema.SCHEMA_VERSION:
        return
    with history.write() as conn:  # again under the writers' lock: another may have done it
        version = _version(conn, history)
        if version < schema.SCHEMA_VERSION:
            migrate(conn, version)


__all__ = ["ENV_VAR", "DEFAULT_PATH", "History", "HistoryError", "history_url", "open_history"]
