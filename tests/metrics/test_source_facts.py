"""Capabilities, not switches: what each metrics source is lives as data beside
``MetricsSource`` (``harness.spec.source_facts``), each reader marks and reads one run itself
(``SourceReader.mark`` / ``read_between``), and nothing outside ``harness.metrics`` (and the
facts beside the enum) asks which source a case has."""

from __future__ import annotations

import re
from pathlib import Path

from harness.metrics import READERS, SourceReader
from harness.spec.schema import MetricsSource, MetricsSpec
from harness.spec.source_facts import LAST_RANK, SOURCE_FACTS, source_facts

HARNESS = Path(__file__).resolve().parents[2] / "harness"
ALLOWED = {"spec/schema.py", "spec/source_facts.py"}


def test_no_module_outside_the_metrics_package_branches_on_the_source() -> None:
    found = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).as_posix()
        if rel.startswith("metrics/") or rel in ALLOWED:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bMetricsSource\.[A-Z]", line):
                found.append(f"harness/{rel}:{n}: {line.strip()}")
    assert not found, "ask harness.spec.source_facts instead:\n" + "\n".join(found)


def test_every_source_has_its_facts_and_a_reader_that_marks_and_reads_a_run() -> None:
    assert set(SOURCE_FACTS) == set(READERS) == set(MetricsSource)
    for reader in set(READERS.values()):
        assert issubclass(reader, SourceReader)
        assert not getattr(reader, "__abstractmethods__", None), reader  # mark, read_between


def test_the_facts_of_each_source() -> None:
    tb, log = (source_facts(MetricsSpec(source=s)) for s in ("tensorboard", "megatron_log"))
    assert tb.one_writer and log.one_writer and tb.writer == log.writer == LAST_RANK
    assert tb.writer_rank((0, 1, 2, 3)) == 3  # Megatron's last rank writes
    assert log.averaged_first_interval and not tb.averaged_first_interval
    assert tb.extra == "tensorboard" and log.extra is None
    assert not tb.carries_checkpoint_step and not log.carries_checkpoint_step
    record = source_facts(MetricsSpec(source="record"))
    assert not record.one_writer and record.writer_rank((0, 1)) is None
    assert record.carries_checkpoint_step
    one_file = source_facts(MetricsSpec(source="jsonl", path="metrics.jsonl"))
    assert one_file.one_writer and "metrics.jsonl" in one_file.where
    assert not source_facts(MetricsSpec(source="jsonl", path="m/r{rank}.jsonl")).one_writer
