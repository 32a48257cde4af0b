"""select_cases: pytest-style -k over ids, and the tags filter."""

from __future__ import annotations

from typing import Optional

import pytest

from harness.errors import ConfigError
from harness.spec import Case, select_cases

from .conftest import build_case


def make(case_id: str, *tags: str) -> Case:
    return build_case().model_copy(update={"id": case_id, "tags": tags})


CASES = [
    make("dcp-pp2.vpp1", "dcp", "focused"),
    make("dcp-pp2.vpp2", "dcp"),
    make("fixed-cp2", "focused"),
    make("qwen3-gb200.vpp4", "regression"),
]


def ids(k: Optional[str] = None, tags: Optional[list[str]] = None) -> list[str]:
    return [c.id for c in select_cases(CASES, k=k, tags=tags)]


def test_no_filters_keeps_everything_in_order() -> None:
    assert ids() == [c.id for c in CASES]
    assert ids(k="  ", tags=[]) == [c.id for c in CASES]


def test_substring() -> None:
    assert ids("vpp") == ["dcp-pp2.vpp1", "dcp-pp2.vpp2", "qwen3-gb200.vpp4"]
    assert ids("VPP2") == ["dcp-pp2.vpp2"]  # case-insensitive like pytest


def test_boolean_operators_and_precedence() -> None:
    assert ids("dcp and not vpp2") == ["dcp-pp2.vpp1"]
    assert ids("fixed or vpp4") == ["fixed-cp2", "qwen3-gb200.vpp4"]
    # not > and > or
    assert ids("fixed or dcp and vpp2") == ["dcp-pp2.vpp2", "fixed-cp2"]
    assert ids("(fixed or dcp) and not vpp1") == ["dcp-pp2.vpp2", "fixed-cp2"]
    assert ids("not not fixed") == ["fixed-cp2"]


@pytest.mark.parametrize("expr", ["dcp and", "(dcp", "dcp)", "and dcp", "not", "a b", "()"])
def test_malformed_expression_is_config_error(expr: str) -> None:
    with pytest.raises(ConfigError, match="invalid -k expression"):
        select_cases(CASES, k=expr)


def test_error_names_column() -> None:
    with pytest.raises(ConfigError, match="at column 5"):
        select_cases(CASES, k="dcp )")


def test_tags_keep_cases_with_any_tag() -> None:
    assert ids(tags=["focused"]) == ["dcp-pp2.vpp1", "fixed-cp2"]
    assert ids(tags=["regression", "focused"]) == [
        "dcp-pp2.vpp1", "fixed-cp2", "qwen3-gb200.vpp4"]
    assert ids(tags=["regression,dcp"]) == [
        "dcp-pp2.vpp1", "dcp-pp2.vpp2", "qwen3-gb200.vpp4"]
    assert ids(tags=["nope"]) == []


def test_k_and_tags_combine() -> None:
    assert ids(k="dcp", tags=["focused"]) == ["dcp-pp2.vpp1"]
