"""The quick start gives the full report: plots included (matplotlib is a dependency, and a
report without it says so), and no NumPy warning on every run (numpy is a dependency)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

from .cli.test_report_cmd import _sweep

REPO = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _dependencies() -> set[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in data["project"]["dependencies"]}


def test_plots_and_numpy_are_dependencies_not_extras() -> None:
    assert {"matplotlib", "numpy", "torch"} <= _dependencies()


def test_importing_the_workload_warns_nothing_about_numpy() -> None:
    done = subprocess.run([sys.executable, "-W", "default", "-c", "import harness.workload.train"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Failed to initialize NumPy" not in done.stderr
    assert "NumPy" not in done.stderr


def test_report_makes_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep(tmp_path, [2.0, 1.5])
    assert main(["report", str(sweep)]) == 0
    assert list((sweep / "plots").glob("*.png"))
    assert "plot(s)" in capsys.readouterr().out


def test_report_without_matplotlib_says_why_there_are_no_plots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    sweep = _sweep(tmp_path, [2.0, 1.5])
    assert main(["report", str(sweep)]) == 0
    assert not (sweep / "plots").exists()
    assert "no plots: matplotlib cannot be imported" in capsys.readouterr().out
