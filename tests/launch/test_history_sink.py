"""The CLI's sweep sink: every finished sweep of `run` goes into the history database once, with
the verdicts judged in the run (nothing judged twice); `--no-history` records nothing; a history
that cannot be written is one line on stderr and leaves the gate's exit code alone."""

from __future__ import annotations

from pathlib import Path

import harness.cli.run_cmd as run_cmd
from harness.cli import main
from harness.history import last_sweeps, open_history
from tests.launch.local.test_sweep import RecordingLauncher


class _Launcher(RecordingLauncher):  # runs no processes; a context manager as LocalLauncher
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _recorded(url: str) -> list[Path]:
    history = open_history(url, create=False)
    try:
        with history.read() as conn:
            return [Path(row.path).resolve() for row in last_sweeps(conn, 100)]
    finally:
        history.close()


def test_run_records_its_sweep_once_and_judges_nothing_twice(write_case, tmp_path, monkeypatch,
                                                             capsys):
    monkeypatch.setattr(run_cmd, "LocalLauncher", lambda **kw: _Launcher())
    judged: list[Path] = []
    import harness.history.store as store
    real_read = store.read_sweep

    def read_sweep(sweep_dir, view=None):  # the run hands the history the view it judged
        judged.append(view)
        return real_read(sweep_dir, view)

    monkeypatch.setattr(store, "read_sweep", read_sweep)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    out = tmp_path / "out"
    assert main(["run", str(write_case("a")), "--out", str(out), "--history", url]) == 0
    text = capsys.readouterr().out
    assert f"history: added {out.name}" in text or "history: added" in text
    assert _recorded(url) == [out.resolve()]
    assert len(judged) == 1 and judged[0] is not None

    # the same sweep again (resumed, nothing left to run): still one sweep in the history
    assert main(["run", str(write_case("a")), "--out", str(out), "--history", url]) == 0
    assert _recorded(url) == [out.resolve()]


def test_no_history_records_nothing(write_case, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_cmd, "LocalLauncher", lambda **kw: _Launcher())
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    assert main(["run", str(write_case("a")), "--out", str(tmp_path / "out"), "--history", url,
                 "--no-history"]) == 0
    assert "history:" not in capsys.readouterr().out
    assert not (tmp_path / "h.sqlite").exists()


def test_a_history_that_cannot_be_written_leaves_the_verdict_alone(write_case, tmp_path,
                                                                   monkeypatch, capsys):
    monkeypatch.setattr(run_cmd, "LocalLauncher", lambda **kw: _Launcher())
    damaged = tmp_path / "h.sqlite"
    damaged.write_bytes(b"not a database, not empty either" * 64)
    out = tmp_path / "out"
    assert main(["run", str(write_case("a")), "--out", str(out), "--history", str(damaged)]) == 0
    err = capsys.readouterr().err
    assert "history: not recorded" in err and f"dcp-harness history add {out}" in err
    assert damaged.read_bytes() == b"not a database, not empty either" * 64  # nothing lost
    assert (out / "a" / "verdict.json").is_file()


def test_run_label_goes_into_the_manifest_and_the_history(write_case, tmp_path, monkeypatch,
                                                         capsys):
    import harness.launch.sweep_folder as sweep_folder
    from harness.results import read_manifest
    from harness.results.code import CodeVersion

    monkeypatch.setattr(run_cmd, "LocalLauncher", lambda **kw: _Launcher())
    clean = (CodeVersion(repo="/repo", commit="a" * 40, dirty=False, cases=("a",), position=7),)
    monkeypatch.setattr(sweep_folder, "code_versions", lambda folders: clean)  # this checkout may
    # have local changes (a sweep of it is then 'dirty', whatever it asked)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    night, other = tmp_path / "night", tmp_path / "other"
    assert main(["run", str(write_case("a")), "--out", str(night), "--history", url,
                 "--label", "nightly"]) == 0
    monkeypatch.setenv("DCP_HARNESS_LABEL", "bisect")  # the option's default (bisect's steps)
    assert main(["run", str(write_case("a")), "--out", str(other), "--history", url]) == 0
    assert read_manifest(night).starts[-1].label == "nightly"
    history = open_history(url, create=False)
    try:
        with history.read() as conn:
            got = {Path(r.path).name: r.label for r in last_sweeps(conn, 10)}
    finally:
        history.close()
    assert got == {"night": "nightly", "other": "bisect"}
