"""An exception the CLI does not expect is a bug in dcp-harness: exit 2 (an error), one line on
stderr naming it and the file that holds the traceback (the folder the subcommand works on where
it names one, else the temporary folder), never Python's default exit 1 (a regression to CI).

The fault is injected into every registered subcommand: the function its parser dispatches to
raises. A new subcommand fails ``test_every_subcommand_is_covered`` until it has an argv here."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from harness.errors import ConfigError
from tests.quick_sweep import quick_case

REPO = Path(__file__).resolve().parents[2]
CASE = str(REPO / "cases" / "focused" / "tiny-moe-eager.yaml")
FOLDER = "{folder}"  # stands for a folder that exists

# Each leaf subcommand: an argv that parses.
ARGV: dict[str, list[str]] = {
    "validate": ["validate", CASE],
    "plan": ["plan", CASE],
    "run": ["run", CASE, "--out", FOLDER],
    "submit": ["submit", CASE, "--profile", "p", "--out", FOLDER],
    "status": ["status", FOLDER],
    "collect": ["collect", FOLDER],
    "report": ["report", FOLDER],
    "gate": ["gate", FOLDER, "--history"],
    "golden record": ["golden", "record", FOLDER],
    "golden diff": ["golden", "diff", "old.json", "new.json"],
    "bisect": ["bisect", CASE, "--good", "a", "--bad", "b", "--out", FOLDER],
    "history add": ["history", "add", FOLDER],
    "history rebuild": ["history", "rebuild", FOLDER],
    "history show": ["history", "show"],
    "history check": ["history", "check"],
    "history dashboard": ["history", "dashboard"],
}


# Those whose FOLDER is the one they work on (DIR or --out): the traceback goes there; the others'
# (several sweeps, none) goes to the temporary folder.
IN_FOLDER = {"run", "submit", "status", "collect", "report", "gate", "golden record", "bisect"}


def _leaves(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix.strip()]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaves(p, f"{prefix} {name}")]


def test_every_subcommand_is_covered():
    assert sorted(_leaves(build_parser())) == sorted(ARGV)


def _inject(monkeypatch: pytest.MonkeyPatch, argv: list[str], fault: BaseException) -> None:
    """Make the function ``argv``'s parser dispatches to raise ``fault`` (``main`` builds the
    parser again, from the patched module)."""
    func = build_parser().parse_args(argv).func
    module = importlib.import_module(func.__module__)

    @functools.wraps(func)  # keeps its module and name: a second injection finds it again
    def broken(args: argparse.Namespace) -> int:
        raise fault

    monkeypatch.setattr(module, func.__name__, broken)


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, for this test only."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("command", sorted(ARGV))
def test_an_unexpected_exception_exits_2_with_one_line_and_the_traceback_in_a_file(
        command, tmp_path, temp_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "sweep"
    folder.mkdir()
    argv = [str(folder) if a == FOLDER else a for a in ARGV[command]]
    _inject(monkeypatch, argv, RuntimeError(f"injected fault in {command}\nsecond line"))

    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith(f"internal error in dcp-harness: RuntimeError: injected fault in "
                           f"{command} second line (traceback in ")
    where = folder if command in IN_FOLDER else temp_dir
    (written,) = list(where.glob("*internal-error-*.txt"))
    assert str(written) in line
    text = written.read_text()
    assert f"command: dcp-harness {' '.join(argv)}" in text
    assert "Traceback (most recent call last)" in text
    assert "raise fault" in text and f"RuntimeError: injected fault in {command}" in text
    other = temp_dir if where == folder else folder
    assert not list(other.glob("*internal-error-*"))  # one file, in one place


def test_the_entry_point_exits_2_not_1(tmp_path):
    """Through the installed entry point's code (``python -m harness``) in a process of its own:
    the exit status the shell sees and nothing but the one line on stderr."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    code = ("import sys, harness.cli.report_cmd as m\n"
            "def broken(args): raise KeyError('x')\n"
            "m.run_gate = broken\n"
            "from harness.cli import main\n"
            f"sys.exit(main(['gate', {str(sweep)!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("internal error in dcp-harness: KeyError: 'x' (traceback in "
                                  f"{sweep}/internal-error-")


def test_interrupt_exits_130_and_config_errors_keep_their_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["history", "check"]
    _inject(monkeypatch, argv, KeyboardInterrupt())
    assert main(argv) == 130
    assert capsys.readouterr().err == "interrupted\n"
    _inject(monkeypatch, argv, ConfigError("bad input, do this"))
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: bad input, do this\n"
    assert not list(tmp_path.rglob("*internal-error-*"))


def test_a_folder_that_cannot_be_written_sends_the_traceback_to_the_temp_folder(
        tmp_path, temp_dir, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    real_write = Path.write_text

    def refuse(self: Path, *args, **kwargs):  # a read-only sweep folder (root ignores chmod)
        if self.parent == sweep:
            raise PermissionError(13, "Permission denied", str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", refuse)
    _inject(monkeypatch, ["report", str(sweep)], ValueError("boom"))
    assert main(["report", str(sweep)]) == 2
    (written,) = list(temp_dir.glob("dcp-harness-internal-error-*.txt"))
    assert f"traceback in {written}" in capsys.readouterr().err
    assert "ValueError: boom" in written.read_text()


def test_a_bug_in_a_run_leaves_its_traceback_in_the_sweep_it_ran(tmp_path, monkeypatch, capsys):
    """`run` without --out: the traceback goes into the sweep folder it made
    (results/<UTC timestamp>), beside what the sweep wrote."""
    import harness.cli.run_cmd as run_cmd

    case = quick_case(tmp_path / "cases")
    monkeypatch.chdir(tmp_path)

    def broken(*args, **kwargs):
        raise AttributeError("injected after the sweep ran")

    monkeypatch.setattr(run_cmd, "show_table", broken)
    assert main(["run", str(case), "--no-history"]) == 2
    (line,) = capsys.readouterr().err.splitlines()[-1:]
    (sweep,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir() and not p.is_symlink()]
    (written,) = list(sweep.glob("internal-error-*.txt"))
    assert line.startswith("internal error in dcp-harness: AttributeError: injected after the "
                           f"sweep ran (traceback in {written};")
    assert (sweep / "manifest.json").is_file() and "in _run" in written.read_text()
