"""Schema versions and the steps between them.

Version ``v`` of the schema is the tables of ``schema`` as they were at ``v``: :data:`ADDED` names
what each later version added (a table, or a column ``table.column``); everything else is
version 1. Migrating to ``v`` creates the tables added at ``v`` (without their columns added
later) and adds the columns added at ``v``, so a database made at any version and migrated step by
step ends with exactly the tables of ``schema`` (``tests/history/test_migrations.py``).
"""

from __future__ import annotations

from sqlalchemy import Column, Connection, Index, MetaData, Table, text

from . import schema

# What each version after 1 added: version 2 keeps every repository's commit (sweeps.code) and
# the per-step figures of small arms (steps); version 3 the sweep's label and commit position,
# each case's commit position, a figure's own measured spread and a step's CPU time.
ADDED: dict[str, int] = {"sweeps.code": 2, "steps": 2, "sweeps.label": 3, "sweeps.position": 3,
                         "cases.position": 3, "figures.spread": 3, "steps.cpu_time_s": 3}


def added_in(table: str, column: str | None = None) -> int:
    return ADDED.get(f"{table}.{column}" if column else table, 1)


def tables_at(version: int) -> MetaData:
    """The tables of schema version ``version`` (a MetaData of their own)."""
    md = MetaData()
    for table in schema.metadata.sorted_tables:
        if added_in(table.name) > version:
            continue
        cols = [Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable,
                       unique=c.unique, server_default=c.server_default,
                       autoincrement=c.autoincrement)
                for c in table.columns if added_in(table.name, c.name) <= version]
        copy = Table(table.name, md, *cols)
        for index in table.indexes:
            names = [c.name for c in index.columns]
            if all(n in copy.c for n in names):
                Index(index.name, *(copy.c[n] for n in names), unique=index.unique)
    return md


def _add_column(conn: Connection, table: str, column: Column) -> None:
    prep = conn.dialect.identifier_preparer
    ddl = (f"ALTER TABLE {prep.quote(table)} ADD COLUMN {prep.quote(column.name)} "
           f"{column.type.compile(dialect=conn.dialect)}")
    if column.server_default is not None:
        ddl += f" DEFAULT '{column.server_default.arg}'"  # type: ignore[attr-defined]
    if not column.nullable:
        ddl += " NOT NULL"
    conn.execute(text(ddl))


def migrate(conn: Connection, version: int) -> None:
    """Bring a database at ``version`` (0: empty) to :data:`schema.SCHEMA_VERSION`, one step at
    a time, inside the caller's transaction."""
    for step in range(version + 1, schema.SCHEMA_VERSION + 1):
        migrate_to(conn, step)


def migrate_to(conn: Connection, step: int) -> None:
    """One step: from version ``step - 1`` to ``step``."""
    now = tables_at(step)
    for table in now.sorted_tables:
        if added_in(table.name) == step:
            table.create(conn)
        else:
            for column in table.columns:
                if added_in(table.name, column.name) == step:
                    _add_column(conn, table.name, column)
    _set_meta(conn, "schema_version", str(step))
    _set_meta(conn, "application", schema.APPLICATION)


def _set_meta(conn: Connection, key: str, value: str) -> None:
    meta = schema.meta
    if conn.execute(meta.select().where(meta.c.key == key)).first() is None:
        conn.execute(meta.insert().values(key=key, value=value))
    else:
        conn.execute(meta.update().where(meta.c.key == key).values(value=value))
