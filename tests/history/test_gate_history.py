"""Every documented form of `dcp-harness gate DIR --history` (docs/history.md), end to end through
the CLI on a real CPU sweep, against SQLite and PostgreSQL (the ``url`` fixture): ``--history``
alone (the database from ``$DCP_HARNESS_HISTORY``, else ``results/history.sqlite`` here), with
``--history-url URL`` before or after it. The gate adds the sweep (a no-op when `run` did) and
checks its cases' drift; a first sweep has nothing to judge yet and keeps the gate's verdict.
``--history-url`` alone is a usage error, not a silent drift check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.history import ENV_VAR
from tests.history.sweeps import make_sweep, record_golden, started
from tests.quick_sweep import quick_case, run_quick


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, clean sweep on this machine's CPU (a command case that starts in a blink), not
    recorded in any history."""
    root = tmp_path_factory.mktemp("gate-history")
    out = root / "sweep"
    run_quick(quick_case(root, "gate-history"), ["--out", str(out), "--no-history"], cwd=root)
    return out


FORMS = {
    "history-then-url": lambda url: ["--history", "--history-url", url],
    "url-then-history": lambda url: ["--history-url", url, "--history"],
    "history-from-env": lambda url: ["--history"],
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_of_gate_history_passes_a_clean_sweep_and_adds_it(form, url, sweep, tmp_path,
                                                                   capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_VAR, url if form == "history-from-env" else str(tmp_path / "other.db"))
    assert main(["gate", str(sweep), *FORMS[form](url)]) == 0
    out = capsys.readouterr().out
    assert "gate: PASS (exit 0)" in out
    assert f"history: added {sweep}" in out
    assert "history check: nothing judged yet: none of the" in out
    # the sweep is in the database the form names (and in no other)
    assert not (tmp_path / "other.db").exists() or form == "history-from-env"
    assert main(["history", "show", "gate-history", "--no-plot", "--history", url]) == 0
    assert "sweeps sweep ? .. sweep ? (1, label adhoc)" in capsys.readouterr().out
    # the gate again: the sweep is there already (unchanged), the verdict the same
    assert main(["gate", str(sweep), *FORMS[form](url)]) == 0
    assert f"history: unchanged {sweep}" in capsys.readouterr().out


def test_gate_history_defaults_to_results_history_sqlite_here(sweep, tmp_path, capsys,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_VAR)
    assert main(["gate", str(sweep), "--history"]) == 0
    assert "history: added" in capsys.readouterr().out
    assert (tmp_path / "results" / "history.sqlite").is_file()


def test_history_url_without_history_is_a_usage_error(url, sweep, tmp_path, capsys,
                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["gate", str(sweep), "--history-url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --history-url names the database of the drift check") and \
        "add --history" in err
    assert "@" not in err  # no URL (and no password) echoed
    assert main(["history", "show", "--no-plot", "--history", url]) == 2  # nothing was added


def test_gate_history_judges_clean_nights_and_passes(url, tmp_path, capsys, monkeypatch):
    """Five clean nights: every figure judged and steady; the gate of the last passes (exit 0)."""
    monkeypatch.chdir(tmp_path)
    record_golden(tmp_path)
    nights = [make_sweep(tmp_path, tmp_path / f"night{i}", started=started(i)) for i in range(5)]
    assert main(["history", "add", *map(str, nights[:-1]), "--history", url]) == 0
    capsys.readouterr()
    assert main(["gate", str(nights[-1]), "--history", "--history-url", url]) == 0
    out = capsys.readouterr().out
    assert "history: added" in out and "history check: PASS (exit 0)" in out


def test_gate_history_judges_the_sweep_against_its_own_label(url, tmp_path, capsys, monkeypatch):
    """Steady nightly sweeps beside ad-hoc sweeps that creep: the gate of the last ad-hoc sweep
    follows its own label (adhoc) and fails on the creep; asked for nightly, it passes."""
    monkeypatch.chdir(tmp_path)
    record_golden(tmp_path)
    nightly = [make_sweep(tmp_path, tmp_path / f"night{i}", started=started(i), label="nightly")
               for i in range(5)]
    adhoc = [make_sweep(tmp_path, tmp_path / f"try{i}", started=started(i), commit=f"{i:x}" * 40,
                        time_s=0.2 * 1.03 ** i) for i in range(5)]
    assert main(["history", "add", *map(str, nightly + adhoc[:-1]), "--history", url]) == 0
    capsys.readouterr()
    assert main(["gate", str(adhoc[-1]), "--history", "--history-url", url]) == 1
    out = capsys.readouterr().out
    assert "history check: FAIL (exit 1)" in out
    assert "DRIFT  drift-case / eager step_time_median_s [h100]" in out
    assert main(["gate", str(adhoc[-1]), "--history", "--history-url", url,
                 "--label", "nightly"]) == 0
    assert "history check: PASS (exit 0)" in capsys.readouterr().out


def test_a_sweep_the_gate_cannot_judge_stays_out_of_the_history(url, sweep, tmp_path, capsys,
                                                                 monkeypatch):
    """A damaged copy of a real sweep (an arm's folder deleted): the gate is an error (exit 2),
    and the sweep is neither added nor judged for drift."""
    monkeypatch.chdir(tmp_path)
    damaged = tmp_path / "damaged"
    shutil.copytree(sweep, damaged, symlinks=True)
    shutil.rmtree(damaged / "gate-history" / "eager-repeat")
    assert main(["gate", str(damaged), "--history", "--history-url", url]) == 2
    out = capsys.readouterr().out
    assert "history: not added, drift not judged: the gate could not judge this sweep" in out
    assert "history: added" not in out
    assert main(["history", "show", "--no-plot", "--history", url]) == 2  # the database is empty
