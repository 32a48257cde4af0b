"""Allocation-site tables (harness.sites): read through pydantic, a damaged file is named with
its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results import ResultsError
from harness.sites import SiteBytes, SiteTable, read_sites, write_sites

TABLE = SiteTable(0, 3, (SiteBytes("graph pool", "active", "harness/slotmem/capture.py:10 build",
                                   900 * 2 ** 20, 3),
                         SiteBytes("default", "inactive", "torch/nn/modules/linear.py:125", 0, 1)))


@pytest.mark.parametrize("damage, field, message", [
    (lambda d: d["sites"][1].update(bytez=1), "sites.1.bytez", "unknown key 'bytez'"),
    (lambda d: d["sites"][0].update(bytes=-1), "sites.0.bytes", "greater than or equal to 0"),
    (lambda d: d["sites"][0].update(blocks="3"), "sites.0.blocks", "valid integer"),
    (lambda d: d["sites"][0].update(pool=7), "sites.0.pool", "valid string"),
    (lambda d: d.update(step=True), "step", "valid integer"),
    (lambda d: d.update(version=2), "version", "Input should be 1"),
    (lambda d: d.pop("sites"), "sites", "required field is missing"),
])
def test_a_damaged_site_table_is_an_error_naming_file_and_field(tmp_path: Path, damage, field,
                                                                message) -> None:
    path = write_sites(tmp_path, TABLE)
    assert read_sites(tmp_path) == {0: TABLE}
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as err:
        read_sites(tmp_path)
    text = str(err.value)
    assert text.startswith(f"{path}: bad allocation-site table: field '{field}': "), text
    assert message in text, text
