"""`dcp-harness validate`: the subcommand module on its own parser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from harness.cli import validate_cmd
from harness.errors import CaseError, ConfigError

LONG_NAME = "a-rather-long-case-name-that-must-stay-whole-in-logs"
CASE = f"""\
name: {LONG_NAME}
tags: [cpu]
model: {{preset: tiny, layers: 4}}
parallel: {{pp: 2, dynamic_cp: [1, 2]}}
train: {{steps: 2, global_batch: 8, seq_length: 128, max_seqlen_per_rank: 64, lr: 1.0e-3}}
data: {{lengths: {{min: 8, max: 128}}}}
resources: {{gpus_per_node: 4}}
matrix: {{parallel.vpp: [1, 2]}}
"""


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dcp-harness")
    validate_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["validate", *argv])
    return args.func(args)


def test_lists_every_case_whole_when_output_is_not_a_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deeply" / "nested" / "folder" / "case.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(CASE)
    assert _run([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 valid case(s)" in out
    rows = [line for line in out.splitlines() if LONG_NAME in line]
    # one table row per case, ids and source never elided (rich assumes 80 columns off a tty)
    assert len(rows) == 2 and "…" not in out
    assert f"{LONG_NAME}.vpp1" in rows[0] and "pp2 vpp1 dcp1/2 ep1 dp2" in rows[0]
    assert f"{LONG_NAME}.vpp2" in rows[1] and str(path) in rows[1]
    assert "(arm checks only)" in rows[0]


def test_selection_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "case.yaml").write_text(CASE)
    with pytest.raises(ConfigError, match="valid, but none matches -k 'vpp3' --tags gpu"):
        _run([str(tmp_path), "-k", "vpp3", "--tags", "gpu"])
    assert _run([str(tmp_path), "-k", "vpp2", "--tags", "cpu"]) == 0


def test_bad_case_is_a_case_error(tmp_path: Path) -> None:
    (tmp_path / "case.yaml").write_text(CASE.replace("steps: 2", "steps: yes"))
    with pytest.raises(CaseError, match="field 'train.steps'"):
        _run([str(tmp_path)])


def test_the_steps_preflight_packed_are_shown_where_not_all(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.workload.datacheck as datacheck

    monkeypatch.setattr(datacheck, "PACK_UNITS", 1_000_000)  # 70 steps of 64 sequences
    longer = (("seq_length: 128", "seq_length: 8192"), ("max: 128", "max: 8192"),
              ("max_seqlen_per_rank: 64", "max_seqlen_per_rank: 4096"),
              ("matrix: {parallel.vpp: [1, 2]}\n", ""))
    for name, train in (("long", "steps: 100, global_batch: 64"),
                        ("wide", "steps: 3, global_batch: 4096"),
                        ("short", "steps: 2, global_batch: 8")):
        text = CASE.replace(LONG_NAME, name).replace("steps: 2, global_batch: 8", train)
        for old, new in longer:
            text = text.replace(old, new)
        (tmp_path / f"{name}.yaml").write_text(text)
    assert _run([str(tmp_path)]) == 0
    cells = [[c.strip() for c in line.split("│")[1:-1]]
             for line in capsys.readouterr().out.splitlines() if line.startswith("│ ")]
    steps = {row[0]: row[3] for row in cells}
    assert steps == {"long": "100 (1..70 packed)", "wide": "3 (none packed)", "short": "2"}


def test_a_tensorboard_command_case_without_the_extra_is_warned_of(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = """\
name: tb
train: {steps: 2, global_batch: 8, seq_length: 16, lr: 1.0e-3}
command:
  argv: [python, train.py]
  metrics: {source: tensorboard}
"""
    (tmp_path / "case.yaml").write_text(text)
    assert _run([str(tmp_path)]) == 0
    assert "warning" not in capsys.readouterr().out  # installed here (the test extra)
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as without the extra
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert _run([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("warning: tb: command.metrics.source tensorboard, but reading TensorBoard event "
            "files needs the tensorboard package: pip install 'dcp-harness[tensorboard]'") in out


def test_says_per_command_case_what_its_source_cannot_feed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron's log lines: no capture statistics, no memory probe, one writer (no rank's own
    values), memory a series only with --log-memory-interval; the record API's case: nothing
    said (its source feeds every check of its pairs)."""
    cases = Path(__file__).resolve().parents[2] / "cases" / "command"
    assert _run([str(cases / "trainer-megatron-log.yaml"),
                 str(cases / "builtin-workload.yaml")]) == 0
    out = capsys.readouterr().out
    assert "command-trainer-log: what command.metrics.source megatron_log cannot feed" in out
    assert ("n/a graph_vs_eager / capture, graph_vs_eager / graph_pool_bytes, graph_vs_eager / "
            "variants_replayed: the command's metrics (command.metrics.source megatron_log) carry "
            "no CUDA-graph capture statistics") in out
    assert "n/a <arm>.ranks_agree: one series for every rank, written by the last rank" in out
    assert "memory: memory at the first two iterations unless --log-memory-interval N" in out
    assert "command-builtin-workload: what" not in out
