"""Preflight that knows the device: submit plans each case's memory, prints each job's predicted
peak per rank, refuses a case that does not fit its profile's GPUs and passes one that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.memplan.fit import native_gqa_of
from tests.memplan.test_predict import CASE

PROFILE = """\
name: small-gpus
gpus: true
gpus_per_node: 4
gpu_memory_gib: {gib}
torch_version: "2.11"
"""


def _files(tmp_path: Path, gib: float) -> tuple[Path, Path]:
    case = tmp_path / "case.yaml"
    case.write_text(CASE % "bf16")
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE.format(gib=gib))
    return case, profile


def test_a_layout_that_does_not_fit_is_refused_with_the_bytes_by_part(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing may call Slurm
    case, profile = _files(tmp_path, 0.001)  # about 1 MiB a GPU
    out = tmp_path / "sweep"
    assert main(["submit", str(case), "--profile", str(profile), "--dry-run", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "refused before submission" in err and "mem-tiny-graphs" in err
    assert "exceeds profile 'small-gpus''s 1 MiB (gpu_memory_gib)" in err
    for part in ("weights", "gradients", "optimizer state", "graph pool"):
        assert part in err
    assert "activations in flight" in err or "optimizer step transient" in err
    assert not out.exists()


def test_a_layout_that_fits_is_not_and_dry_run_prints_each_rank_s_peak(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    case, profile = _files(tmp_path, 80)
    out = tmp_path / "sweep"
    assert main(["submit", str(case), "--profile", str(profile), "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "memory of mem-tiny-graphs: predicted peak ranks 0..1 " in text
    assert "ranks 2..3 " in text and "of 81,920 MiB" in text


@pytest.mark.parametrize("version, native", [("2.11", False), ("2.11.0+cu130", False), ("2.12", True),
                                             ("3.0", True), (None, None)])
def test_the_profile_s_torch_says_the_attention_path(version, native) -> None:
    assert native_gqa_of(version) is native
