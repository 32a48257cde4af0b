"""Megatron's log lines (the formats of megatron/training/training.py ``training_log`` and
``report_memory``) -> step records."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.metrics import MetricsError, rank_records, read_megatron_log

# Lines as Megatron-LM prints them (print_rank_last / report_memory), with the local launcher's
# "[rank k] " prefix on some and other output in between.
LOG = """\
[rank 1] > building GPT model ...
[rank 1]  [2025-06-01 10:00:01.123456] iteration        1/       3 | consumed samples:            8 | elapsed time per iteration (ms): 1520.4 | learning rate: 1.500000E-04 | global batch size:     8 | lm loss: 1.082601E+01 | loss scale: 1.0 | grad norm: 12.875 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank 0] [Rank 0] (after 1 iterations) memory (MB) | allocated: 1234.56 | max allocated: 2048.00 | reserved: 3072.00 | max reserved: 3072.00
[rank 1] [Rank 1] (after 1 iterations) memory (MB) | allocated: 1000.00 | max allocated: 2000.00 | reserved: 3000.00 | max reserved: 3000.00
 [2025-06-01 10:00:02.000001] iteration        2/       3 | consumed samples:           16 | elapsed time per iteration (ms): 512.3 | learning rate: 3.000000E-04 | global batch size:     8 | lm loss: 1.052443E+01 | loss scale: 1.0 | grad norm: 9.125 | num zeros: 0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2025-06-01 10:00:03.000001] iteration        3/       3 | consumed samples:           24 | elapsed time per iteration (ms): 510.0 | learning rate: 4.500000E-04 | global batch size:     8 | lm loss:          nan | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   1 | number of nan iterations:   1 |
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "log.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_iteration_and_memory_lines_become_records(tmp_path: Path) -> None:
    metrics = read_megatron_log(_write(tmp_path, LOG))
    assert metrics.steps == [1, 2, 3]
    records = rank_records(metrics, [0, 1], "cpu")
    r0 = records[0]
    assert [r.step for r in r0] == [1, 2, 3]
    assert r0[0].loss == pytest.approx(10.82601) and r0[0].grad_norm == pytest.approx(12.875)
    assert r0[0].lr == pytest.approx(1.5e-4) and r0[0].step_time_s == pytest.approx(1.5204)
    assert r0[0].allocated_bytes == round(1234.56 * 2**20)
    assert r0[0].max_allocated_bytes == 2048 * 2**20 and r0[0].reserved_bytes == 3072 * 2**20
    assert records[1][0].allocated_bytes == 1000 * 2**20  # each rank its own memory
    assert records[1][0].loss == r0[0].loss  # the loss is the run's, every rank's
    assert r0[1].allocated_bytes is None and not r0[1].nan and not r0[1].skipped
    last = r0[2]
    assert math.isnan(last.loss) and last.nan and last.skipped and last.platform == "cpu"


def test_an_unreadable_iteration_line_names_file_and_line(tmp_path: Path) -> None:
    bad = LOG.replace("lm loss: 1.052443E+01", "lm loss: 1.05x")
    with pytest.raises(MetricsError, match=r"log.txt:5: 'lm loss: 1.05x' is not a number"):
        read_megatron_log(_write(tmp_path, bad))


def test_an_iteration_logged_twice_is_an_error(tmp_path: Path) -> None:
    first = LOG.splitlines()[1]
    with pytest.raises(MetricsError, match=r"log.txt:7: iteration 1 is logged twice \(lines 2 and 7\)"):
        read_megatron_log(_write(tmp_path, LOG + first + "\n"))


def test_other_keys_are_mapped_by_the_case(tmp_path: Path) -> None:
    line = (" [2025-06-01 10:00:01.1] iteration        1/       1 | lm loss: 2.000000E+00 | "
            "load_balancing_loss: 1.010000E+00 | number of skipped iterations:   0 |\n")
    metrics = read_megatron_log(_write(tmp_path, line), {"loss": "lm loss",
                                                         "aux_loss": "load_balancing_loss"})
    assert metrics.shared == {1: {"loss": 2.0, "aux_loss": 1.01}}


def test_every_memory_line_is_a_step_of_its_rank(tmp_path: Path) -> None:
    """Memory every interval (Megatron's --log-memory-interval, or a trainer's own), with
    --log-device-memory-used's extra key; a save's memory report names no step and is left
    alone."""
    iteration = LOG.splitlines()[1].split("] ", 1)[1]
    lines = [iteration.replace("iteration        1/", f"iteration        {k}/") for k in (1, 2, 3)]
    mem = ("[Rank 0] (after {k} iterations) memory (MB) | allocated: {a:.2f} | max allocated: "
           "{a:.2f} | reserved: 64.00 | max reserved: 64.00 | total device memory used: 900.00")
    text = "\n".join(f"{line}\n{mem.format(k=k, a=10.0 * k)}" for k, line in enumerate(lines, 1))
    text += "\n[Rank 0] (before save_checkpoint for iteration 3) memory (MB) | allocated: 99.00\n"
    records = rank_records(read_megatron_log(_write(tmp_path, text)), [0, 1], "cpu")
    assert [r.allocated_bytes for r in records[0]] == [10 * 2**20, 20 * 2**20, 30 * 2**20]
    assert [r.max_allocated_bytes for r in records[0]] == [10 * 2**20, 20 * 2**20, 30 * 2**20]
    assert all(r.allocated_bytes is None for r in records[1])  # rank 1 printed no memory
