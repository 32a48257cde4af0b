"""One reader object per metrics source (``harness.metrics.sources``): each source's fields, tag
map, default path, stale files and reading, and every source has its reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.metrics import (LOG_KEYS, READERS, TB_TAGS, JsonLinesReader, MegatronLogReader,
                             MetricsError, TensorBoardReader, read_source, reader_of,
                             source_fields, source_path, stale_files)
from harness.spec.schema import METRIC_FIELDS, MetricsSource, MetricsSpec

MEGATRON_LINE = (" [2026-01-01 00:00:00] iteration        1/       3 | consumed samples: 8 | "
                 "elapsed time per iteration (ms): 120.0 | learning rate: 1.000000E-04 | "
                 "global batch size:     8 | lm loss: 2.500000E+00 | grad norm: 1.500 |\n")


def test_every_source_has_a_reader_with_its_default_path() -> None:
    assert set(READERS) == set(MetricsSource)
    kinds = {s: type(reader_of(MetricsSpec(source=s))) for s in MetricsSource}
    assert kinds == {MetricsSource.TENSORBOARD: TensorBoardReader,
                     MetricsSource.MEGATRON_LOG: MegatronLogReader,
                     MetricsSource.JSONL: JsonLinesReader, MetricsSource.RECORD: JsonLinesReader}
    assert [source_path(MetricsSpec(source=s)) for s in ("tensorboard", "megatron_log", "jsonl")] \
        == ["tensorboard", "log.txt", "metrics/rank{rank}.jsonl"]
    assert source_path(MetricsSpec(source="jsonl", path="out/m{rank}.jsonl")) == "out/m{rank}.jsonl"


def test_fields_and_tag_maps_follow_the_source_and_the_case() -> None:
    tb = reader_of(MetricsSpec(source="tensorboard", tags={"loss": "train/loss", "aux_loss": "aux"}))
    assert tb.tag_map() == {**TB_TAGS, "loss": "train/loss", "aux_loss": "aux"}
    assert source_fields(tb.spec) == frozenset(TB_TAGS) | {"aux_loss"}
    log = reader_of(MetricsSpec(source="megatron_log"))
    assert log.tag_map() == dict(LOG_KEYS)
    assert {"allocated_bytes", "max_allocated_bytes", "reserved_bytes"} <= log.fields()
    assert set(METRIC_FIELDS) | {"graph_stats", "environment"} <= source_fields(
        MetricsSpec(source="record"))


def test_stale_files_are_each_source_s_own(tmp_path: Path) -> None:
    (tmp_path / "tensorboard").mkdir()
    event = tmp_path / "tensorboard" / "events.out.tfevents.1.host"
    event.write_bytes(b"")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "rank1.jsonl").write_text("")
    (tmp_path / "log.txt").write_text(MEGATRON_LINE)
    assert stale_files(MetricsSpec(source="tensorboard"), tmp_path, "tensorboard", [0, 1]) == [event]
    assert stale_files(MetricsSpec(source="jsonl"), tmp_path, "metrics/rank{rank}.jsonl", [0, 1]) \
        == [tmp_path / "metrics" / "rank1.jsonl"]
    assert stale_files(MetricsSpec(source="megatron_log"), tmp_path, "log.txt", [0, 1]) == []


def test_a_megatron_log_is_read_from_where_this_run_begins(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text(MEGATRON_LINE)
    start = log.stat().st_size  # an earlier run's line: not this run's
    with open(log, "a") as fh:
        fh.write(MEGATRON_LINE.replace("lm loss: 2.5", "lm loss: 1.5"))
    got = read_source(MetricsSpec(source="megatron_log"), tmp_path, [0, 1], "cpu", log_start=start)
    assert [r.loss for r in got[0]] == [1.5] and got[1] == got[0]
    with pytest.raises(MetricsError, match="no log here"):
        read_source(MetricsSpec(source="megatron_log", path="other.txt"), tmp_path, [0], "cpu")
