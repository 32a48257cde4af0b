"""Where a history database may be made and what a reader leaves alone: `history add` to a
path in a folder that does not exist is an error naming the path (the default's `results/` is
made); `history show`, `check` and `dashboard` leave an empty database as it is (SQLite and
PostgreSQL); a URL of another database than SQLite or PostgreSQL names the two it can be."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from harness.cli import main
from harness.history import ENV_VAR
from tests.history.sweeps import make_sweep, started


def test_add_to_a_path_in_a_missing_folder_says_so_and_makes_nothing(tmp_path, capsys):
    sweep = make_sweep(tmp_path, tmp_path / "night0", started=started(0))
    db = tmp_path / "no" / "such" / "history.sqlite"
    assert main(["history", "add", str(sweep), "--history", str(db)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: no folder {db.parent} for the history database {db}: create it "
                   f"(mkdir -p {db.parent}) or fix the path (--history URL or ${ENV_VAR})\n")
    assert not (tmp_path / "no").exists()
    db.parent.mkdir(parents=True)  # what the message says to do
    assert main(["history", "add", str(sweep), "--history", str(db)]) == 0
    assert db.is_file()


def test_the_default_database_makes_results_here(tmp_path, capsys, monkeypatch):
    sweep = make_sweep(tmp_path, tmp_path / "night0", started=started(0))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv(ENV_VAR)
    assert main(["history", "add", str(sweep)]) == 0
    assert (work / "results" / "history.sqlite").is_file()


@pytest.mark.parametrize("command", [["show"], ["check"], ["dashboard", "--out", "page.html"]])
def test_a_reader_leaves_an_empty_database_as_it_is(command, url, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if url.startswith("sqlite"):
        Path(url.removeprefix("sqlite:///")).touch()  # an empty file
    assert main(["history", *command, "--history", url]) == 2
    assert "holds no history yet (an empty database): add sweeps with `dcp-harness history " \
           "add SWEEP...`" in capsys.readouterr().err
    if url.startswith("sqlite"):
        assert Path(url.removeprefix("sqlite:///")).stat().st_size == 0
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == []
    finally:
        engine.dispose()
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize("given", ["mysql://u:secret@db.example/history",
                                   "mssql+pyodbc://u:secret@db/history", "oracle://u@h/x"])
def test_an_unsupported_database_names_the_two_it_can_be(given, capsys):
    assert main(["history", "show", "--history", given]) == 2
    err = capsys.readouterr().err
    assert "a history database cannot be" in err and "it is SQLite" in err and \
        "PostgreSQL (postgresql+psycopg://user@host:5432/db)" in err
    assert "pip install" not in err and "secret" not in err
