"""`submit` into a folder that already holds a submitted sweep names the way on; an sbatch that
refuses the first job leaves nothing behind; `--allow-skip none` takes no other kind; `report`
on a folder that is not a sweep exits 2 (no Slurm needed: sbatch is faked)."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.launch.slurm.backend as backend_mod
from harness.cli import main
from harness.errors import ConfigError
from tests.launch.cases import REPEAT, write_case_file

PROFILE = """\
name: guardtest
partition: debug
gpus: false
gpus_per_node: 4
max_nodes: 1
cpus_per_task: 1
time_margin_min: 5
"""


@pytest.fixture
def case_and_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setattr(backend_mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    profile = tmp_path / "guardtest.yaml"
    profile.write_text(PROFILE)
    case = write_case_file(tmp_path / "cases", "guard", compare=REPEAT,
                           resources={"time_min": 4, "profile": "local"})
    return case, profile


def refuse(*args, **kwargs):
    raise ConfigError("sbatch refused guard (1 node): Invalid account")


def test_a_refused_sbatch_leaves_no_new_folder(case_and_profile, tmp_path, monkeypatch, capsys):
    case, profile = case_and_profile
    monkeypatch.setattr(backend_mod, "submit_groups", refuse)
    out = tmp_path / "sweep"
    assert main(["submit", str(case), "--profile", str(profile), "--out", str(out)]) == 2
    assert "sbatch refused guard" in capsys.readouterr().err
    assert not out.exists()


def test_a_refused_sbatch_keeps_what_the_folder_held(case_and_profile, tmp_path, monkeypatch):
    case, profile = case_and_profile
    monkeypatch.setattr(backend_mod, "submit_groups", refuse)
    out = tmp_path / "shared"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["submit", str(case), "--profile", str(profile), "--out", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_second_submit_into_a_submitted_sweep_names_collect_retry_infra(
        case_and_profile, tmp_path, capsys):
    case, profile = case_and_profile
    out = tmp_path / "sweep"
    (out / "slurm").mkdir(parents=True)
    (out / "slurm" / "jobs.json").write_text('{"rounds": []}')
    assert main(["submit", str(case), "--profile", str(profile), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"dcp-harness collect {out.resolve()} --retry-infra N" in err


def test_allow_skip_none_takes_no_other_kind(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    assert main(["gate", str(tmp_path / "s"), "--allow-skip", "none", "needs-gpu"]) == 2
    assert "--allow-skip none accepts no skip" in capsys.readouterr().err


def test_report_on_a_folder_that_is_not_a_sweep_exits_2(tmp_path, capsys):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.txt").write_text("x")
    assert main(["report", str(tmp_path / "photos")]) == 2
    assert "is not a sweep folder" in capsys.readouterr().err
    assert not (tmp_path / "photos" / "summary.md").exists()
