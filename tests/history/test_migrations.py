"""The schema is versioned: a database made at version 1 (by the steps alone) holding a sweep is
brought to the current version when opened, its rows kept, and every path of steps ends at
exactly the tables of ``schema``."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, select

from harness.history import open_history
from harness.history import schema
from harness.history.migrations import ADDED, migrate_to, tables_at


def columns(engine) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    insp = inspect(engine)
    return {t: {c["name"] for c in insp.get_columns(t)} for t in insp.get_table_names()}


def test_a_version_1_database_is_migrated_and_keeps_its_sweeps(url: str):
    engine = create_engine(url)
    v1 = tables_at(1)
    with engine.begin() as conn:
        migrate_to(conn, 1)
        conn.execute(v1.tables["sweeps"].insert().values(
            key="k1", fingerprint="f", name="night1", path="/sweeps/night1",
            started="2026-11-01T02:00:00+00:00", recorded="2026-11-01T03:00:00+00:00",
            host="node1", command="run", selection="{}", platform="h100", commit="a" * 40,
            dirty=False, repo="/repo", status="pass", exit_code=0))
        conn.execute(v1.tables["series"].insert().values(
            case_id="c", subject="eager", kind="arm", rank=-1, metric="step_time_median_s",
            platform="h100"))
        conn.execute(v1.tables["figures"].insert().values(
            sweep_id=1, series_id=1, started="2026-11-01T02:00:00+00:00", value=0.2))
    assert "steps" not in columns(engine) and "code" not in columns(engine)["sweeps"]
    engine.dispose()

    open_history(url).close()

    engine = create_engine(url)
    with engine.connect() as conn:
        version = conn.execute(select(schema.meta.c.value)
                               .where(schema.meta.c.key == "schema_version")).scalar_one()
        sweep = conn.execute(select(schema.sweeps)).one()
        value = conn.execute(select(schema.figures.c.value)).scalar_one()
    assert version == str(schema.SCHEMA_VERSION)
    assert (sweep.name, sweep.commit, sweep.code, value) == ("night1", "a" * 40, "[]", 0.2)
    assert (sweep.label, sweep.position) == ("adhoc", None)  # v3: a sweep from before labels
    want = {t.name: {c.name for c in t.columns} for t in schema.metadata.sorted_tables}
    assert columns(engine) == want
    engine.dispose()


def test_every_addition_is_a_later_version_of_a_known_table_or_column():
    for name, version in ADDED.items():
        table, _, column = name.partition(".")
        assert 1 < version <= schema.SCHEMA_VERSION
        assert column in schema.metadata.tables[table].c if column else table in schema.metadata.tables
    assert set(tables_at(schema.SCHEMA_VERSION).tables) == set(schema.metadata.tables)
