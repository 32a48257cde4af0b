"""TensorBoard event files (written by torch's SummaryWriter, as Megatron writes them) -> records."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.metrics import MetricsError, rank_records, read_tensorboard

torch_tb = pytest.importorskip("torch.utils.tensorboard")


def _events(folder: Path, scalars: dict[str, dict[int, float]]) -> None:
    writer = torch_tb.SummaryWriter(log_dir=str(folder))
    for tag, values in scalars.items():
        for step, value in values.items():
            writer.add_scalar(tag, value, step)
    writer.close()


def test_megatrons_tags_become_records(tmp_path: Path) -> None:
    _events(tmp_path, {"lm loss": {1: 10.5, 2: 10.25}, "grad-norm": {1: 3.0, 2: 2.5},
                       "learning-rate": {1: 1e-4, 2: 2e-4}, "iteration-time": {2: 0.5},
                       "mem-allocated-bytes": {1: 1024.0, 2: 2048.0},
                       "num-zeros": {1: 0.0, 2: 0.0}, "lm loss vs samples": {8: 10.5}})
    records = rank_records(read_tensorboard(tmp_path), [0, 1], "cpu")
    assert [r.step for r in records[1]] == [1, 2]
    first, second = records[0]
    assert first.loss == 10.5 and first.grad_norm == 3.0 and first.step_time_s is None
    assert second.step_time_s == 0.5 and second.allocated_bytes == 2048
    assert second.lr == pytest.approx(2e-4)


def test_a_folder_without_events_or_loss_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match="no TensorBoard event file"):
        read_tensorboard(tmp_path)
    _events(tmp_path, {"grad-norm": {1: 1.0}})
    with pytest.raises(MetricsError, match="no scalar 'lm loss'.*tags found: grad-norm"):
        read_tensorboard(tmp_path)


def test_a_case_maps_its_own_tags(tmp_path: Path) -> None:
    _events(tmp_path, {"train/loss": {1: 2.0}})
    metrics = read_tensorboard(tmp_path, {"loss": "train/loss"})
    assert metrics.shared == {1: {"loss": 2.0}}


def test_memory_is_the_writing_ranks_own(tmp_path: Path) -> None:
    """Megatron writes TensorBoard on its last rank: the loss is every rank's, the mem-* scalars
    that rank's own memory (the other ranks have none from this source)."""
    _events(tmp_path, {"lm loss": {1: 3.0, 2: 2.5}, "mem-allocated-bytes": {1: 1024.0, 2: 4096.0},
                       "mem-max-allocated-bytes": {1: 2048.0, 2: 4096.0},
                       "mem-reserved-bytes": {1: 8192.0, 2: 8192.0}})
    records = rank_records(read_tensorboard(tmp_path, writer_rank=1), [0, 1], "cpu")
    assert [r.loss for r in records[0]] == [r.loss for r in records[1]] == [3.0, 2.5]
    assert all(r.allocated_bytes is None and r.reserved_bytes is None for r in records[0])
    assert [(r.allocated_bytes, r.max_allocated_bytes, r.reserved_bytes) for r in records[1]] == [
        (1024, 2048, 8192), (4096, 4096, 8192)]
