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


def _headline(tmp_path: Path, seqlen: int):
    from harness.spec.loader import load_cases

    src = Path(__file__).resolve().parents[2] / "cases/regression/gb200-qwen3-30b-a3b-dcp-graphs.yaml"
    text = src.read_text()
    assert "  max_seqlen_per_rank: 4096" in text  # the case as committed
    f = tmp_path / src.name
    f.write_text(text.replace("  max_seqlen_per_rank: 4096", f"  max_seqlen_per_rank: {seqlen}"))
    (case,) = list(load_cases(f))
    return case


@pytest.mark.slow
def test_the_gb200_headline_fits_a_gb200_and_its_8192_token_buffer_is_refused_with_the_numbers(tmp_path) -> None:
    # slurm/profiles/gb200.yaml says a GB200's memory (189,471 MiB as nvidia-smi reports it); the
    # headline graph case at max_seqlen_per_rank 4096 fits it on its fullest stage (PP stage 0),
    # at 8192 (= seq_length) it does not, and the refusal names the bytes by part. Planned for
    # torch 2.11 (K/V heads repeated for flash varlen: the larger of the two attention paths).
    from harness.launch.slurm.profiles import load_profile
    from harness.memplan.fit import device_target, refusal
    from harness.memplan.predict import predict_case

    profile = load_profile("gb200")
    target = device_target(profile.gpu_memory_gib, "2.11")
    assert round(target.device_bytes / 2**20) == 189_471
    fits = predict_case(_headline(tmp_path, 4096), target, pp_ranks=[0])
    assert fits.fits() and fits.peak_bytes < 0.95 * target.device_bytes  # with a margin
    assert refusal(_headline(tmp_path, 4096), fits, "gb200") is None
    big_case = _headline(tmp_path, 8192)
    big = predict_case(big_case, target, pp_ranks=[0])
    why = refusal(big_case, big, "gb200")
    assert not big.fits() and why is not None
    assert "PP stage 0 (ranks [0, 1]) exceeds profile 'gb200''s 189,471 MiB" in why
    for part in ("weights", "gradients", "optimizer state", "graph pool", "activations in flight"):
        assert part in why
