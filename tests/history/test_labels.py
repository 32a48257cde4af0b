"""Labels and commit order: the nightly's own series. Bisect steps and dirty sweeps go into the
same history but not into the nightly's trend (``history check`` follows nightly, names the
others apart, and judges one with ``--label``); a series is in first-parent commit order where
the commit's place is known (a later sweep of an older commit sits before the newer's), by
start otherwise; ``run --label`` records the label in the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.bisect.state import Mode
from harness.bisect.target import Target, step_environment
from harness.history import open_history, record_sweep, series
from harness.history.labels import BISECT_LABEL, LABEL_ENV, followed, sweep_label
from harness.history.query import labels
from harness.launch.sweep_folder import sweep_start
from tests.history.sweeps import make_sweep, record_golden, started


def test_a_sweep_label_is_what_it_asked_dirty_code_is_dirty_and_readers_follow_nightly():
    assert sweep_label("nightly", False) == "nightly"
    assert sweep_label("nightly", True) == "dirty"
    assert sweep_label(None, None) == "adhoc"
    assert followed(None, ["adhoc", "nightly"]) == "nightly"
    assert followed(None, ["adhoc", "bisect"]) == "adhoc"
    assert followed("bisect", ["nightly"]) == "bisect"


def test_run_and_submit_record_the_label_and_refuse_a_bad_one(capsys, monkeypatch):
    assert sweep_start("run", [], 0, label="nightly").label == "nightly"
    with pytest.raises(SystemExit) as exc:
        main(["run", "cases/focused", "--label", "night ly!"])
    assert exc.value.code == 2 and "is not a label" in capsys.readouterr().err
    monkeypatch.setenv(LABEL_ENV, "no good")  # the variable is the option's default: checked too
    with pytest.raises(SystemExit):
        main(["submit", "cases/focused"])
    assert "'no good' is not a label" in capsys.readouterr().err


def test_a_bisect_step_runs_labelled_bisect_and_is_recorded_so(tmp_path: Path, url: str):
    target = Target(Mode.BUILTIN, tmp_path, (tmp_path / "c.yaml",), None)
    env, _ = step_environment(target, tmp_path)
    assert env[LABEL_ENV] == "bisect"
    record_golden(tmp_path)
    sweep = make_sweep(tmp_path, tmp_path / "step", started=started(0))  # an old harness's: no label
    assert record_sweep(sweep, url=url, label=BISECT_LABEL).status == "added"
    history = open_history(url)
    try:
        with history.read() as conn:
            assert labels(conn) == {"bisect": 1}
    finally:
        history.close()


@pytest.fixture
def mixed(tmp_path: Path, url: str) -> str:
    """Five steady nightly sweeps (commits at places 10..14), then two bisect steps and a dirty
    sweep 60 % slower, started later."""
    record_golden(tmp_path)
    sweeps = [make_sweep(tmp_path, tmp_path / f"night{i}", started=started(i), label="nightly",
                         commit=f"{i:x}" * 40, position=10 + i, time_s=0.2) for i in range(5)]
    sweeps += [make_sweep(tmp_path, tmp_path / f"bisect{i}", started=started(10 + i),
                          label="bisect", commit=f"{i:x}" * 40, position=10 + i, time_s=0.32)
               for i in range(2)]
    sweeps.append(make_sweep(tmp_path, tmp_path / "mine", started=started(20), dirty=True,
                             label="nightly", time_s=0.32))
    assert main(["history", "add", *map(str, sweeps), "--history", url]) == 0
    return url


def test_check_follows_nightly_and_names_the_other_labels_apart(mixed: str, capsys):
    capsys.readouterr()
    assert main(["history", "check", "--history", mixed]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("history check: PASS (exit 0): 0 drifted of ")
    assert "over the last 10 sweeps of label 'nightly'" in out[0]
    assert out[-1] == ("  other labels, not judged here: bisect (2 sweep(s)), dirty (1 sweep(s)); "
                       "judge one with --label L")
    # the bisect steps alone: two points, too few for a trend
    assert main(["history", "check", "--label", "bisect", "--history", mixed]) == 2


def test_a_series_is_in_commit_order_where_the_commit_is_known(tmp_path: Path, url: str):
    record_golden(tmp_path)
    # night2 of commit place 3 started last (a re-run of an older commit): it sits third
    order = [(0, 1), (1, 2), (3, 4), (4, 5), (2, 3)]
    folders = [make_sweep(tmp_path, tmp_path / f"night{place - 1}", started=started(i),
                          label="nightly", commit=f"{place:x}" * 40, position=place,
                          time_s=0.2 + 0.01 * place) for i, place in order]
    history = open_history(url)
    try:
        from harness.history.store import add

        for folder in folders:
            add(history, folder)
        with history.read() as conn:
            found = series(conn, metric="step_time_median_s", label="nightly")
    finally:
        history.close()
    (pts,) = found.values()
    assert [p.sweep for p in pts] == ["night0", "night1", "night2", "night3", "night4"]
    assert pts[2].short == "night2 3333333"
