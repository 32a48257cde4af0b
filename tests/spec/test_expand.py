"""matrix: expansion, stable case ids and matrix_values."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from harness.errors import CaseError
from harness.spec import load_cases
from harness.spec.expand import case_id, expand_matrix, key_labels, render_value
from harness.spec.problems import ProblemError

from .conftest import GOOD_DCP, GOOD_FIXED

Write = Callable[..., Path]


def test_ids_follow_key_then_value_order(write_case: Write) -> None:
    text = GOOD_DCP + "matrix:\n  parallel.vpp: [1, 2]\n  parallel.dynamic_cp: [[2], [1, 2]]\n"
    cases = load_cases([write_case(text)])
    assert [c.id for c in cases] == [
        "dcp-pp2.vpp1.dynamic_cp2",
        "dcp-pp2.vpp1.dynamic_cp1-2",
        "dcp-pp2.vpp2.dynamic_cp2",
        "dcp-pp2.vpp2.dynamic_cp1-2",
    ]
    assert [c.parallel.vpp for c in cases] == [1, 1, 2, 2]
    assert [c.layout.cp_sizes for c in cases] == [(2,), (1, 2), (2,), (1, 2)]
    assert cases[3].matrix_values == {"parallel.vpp": 2, "parallel.dynamic_cp": [1, 2]}
    assert all(c.name == "dcp-pp2" for c in cases)


def test_ids_are_deterministic(write_case: Write) -> None:
    text = GOOD_DCP + "matrix: {train.seed: [3, 1, 2], train.lr: [3.0e-4]}\n"
    first = [c.id for c in load_cases([write_case(text, "a.yaml")])]
    second = [c.id for c in load_cases([write_case(text, "b.yaml")])]
    assert first == second == ["dcp-pp2.seed3.lr0.0003", "dcp-pp2.seed1.lr0.0003",
                               "dcp-pp2.seed2.lr0.0003"]


def test_nested_path_creates_missing_sections(write_case: Write) -> None:
    text = GOOD_FIXED.replace("compare:\n  repeat: {loss: exact}\n", "") + (
        "matrix:\n  compare.repeat.loss: [exact, {max_rel: 0.01}]\n"
        "  model.preset: [tiny]\n"
    )
    cases = load_cases([write_case(text)])
    assert [c.id for c in cases] == ["fixed-cp2.loss-exact.preset-tiny",
                                     "fixed-cp2.loss-max_rel0.01.preset-tiny"]
    assert cases[1].compare.repeat is not None and cases[1].compare.repeat.loss != "exact"


def test_render_value() -> None:
    assert render_value(2) == "2"
    assert render_value([1, 2, 4]) == "1-2-4"
    assert render_value(True) == "true"
    assert render_value(None) == "none"
    assert render_value(1e-5) == "1e-05"
    assert render_value("BF16 x/y") == "bf16_x_y"
    assert render_value({"max_rel": 0.5}) == "max_rel0.5"


def test_case_id_joins_words_with_dash_and_numbers_directly() -> None:
    values = [("train.deterministic", False), ("train.seed", -1), ("parallel.vpp", 2)]
    assert case_id("n", values) == "n.deterministic-false.seed-1.vpp2"
    assert case_id("n", []) == "n"


def test_same_leaf_uses_full_path() -> None:
    labels = key_labels(["data.lengths.max", "x.max", "parallel.vpp"])
    assert labels == {"data.lengths.max": "data_lengths_max", "x.max": "x_max",
                      "parallel.vpp": "vpp"}


def test_expand_matrix_leaves_input_untouched() -> None:
    raw = {"name": "n", "parallel": {"pp": 2}, "matrix": {"parallel.vpp": [1, 2]}}
    variants = expand_matrix(raw)
    assert [v.data["parallel"] for v in variants] == [{"pp": 2, "vpp": 1}, {"pp": 2, "vpp": 2}]
    assert raw == {"name": "n", "parallel": {"pp": 2}, "matrix": {"parallel.vpp": [1, 2]}}
    assert all("matrix" not in v.data for v in variants)


def test_value_loc_maps_fields_to_matrix_entries() -> None:
    [_, second] = expand_matrix({"name": "n", "matrix": {"parallel.dynamic_cp": [[1], [1, 2]]}})
    assert second.value_loc(("parallel", "dynamic_cp", 1)) == ("matrix", "parallel.dynamic_cp", 1)
    assert second.value_loc(("parallel", "pp")) is None


@pytest.mark.parametrize(
    ("matrix", "field", "needle"),
    [
        ("{parallel.vvp: [1, 2]}", "matrix.parallel.vvp",
         "unknown field path 'parallel.vvp': 'parallel' has no field 'vvp' (did you mean 'vpp'?)"),
        ("{paralel.vpp: [1]}", "matrix.paralel.vpp", "a case file has no field 'paralel'"),
        ("{parallel.pp.x: [1]}", "matrix.parallel.pp.x", "is a value, not a section"),
        ("{parallel.vpp: 2}", "matrix.parallel.vpp", "must list the values to try"),
        ("{parallel.vpp: []}", "matrix.parallel.vpp", "lists no values"),
        ("{name: [a, b]}", "matrix.name", "cannot be varied"),
        ("{parallel: [{pp: 1}], parallel.vpp: [1]}", "matrix.parallel", "overlap"),
        ("[1, 2]", "matrix", "must map dotted field paths"),
        ("{}", "matrix", "must map dotted field paths"),
        ("{train.seed: [%s], train.lr: [%s]}" % (",".join(map(str, range(1, 202))),
                                                  ",".join(["1.0e-3"] * 50)),
         "matrix", "expands to 10050 cases (201 x 50), more than 10000; split it"),
    ],
)
def test_bad_matrix_names_the_matrix_key(write_case: Write, matrix: str, field: str,
                                         needle: str) -> None:
    path = write_case(GOOD_FIXED + f"matrix: {matrix}\n")
    with pytest.raises(CaseError) as info:
        load_cases([path])
    err = info.value
    assert err.field == field and err.line == 15 and err.case == "fixed-cp2"
    assert needle in err.message


def test_duplicate_values_give_duplicate_ids(write_case: Write) -> None:
    with pytest.raises(CaseError, match="two matrix points give the same case id 'fixed-cp2.seed1'"):
        load_cases([write_case(GOOD_FIXED + "matrix: {train.seed: [1, 1]}\n")])


def test_invalid_matrix_value_points_at_the_value(write_case: Write) -> None:
    path = write_case(GOOD_FIXED + "matrix:\n  train.steps:\n    - 2\n    - 0\n")
    with pytest.raises(CaseError) as info:
        load_cases([path])
    err = info.value
    assert (err.case, err.field, err.line) == ("fixed-cp2.steps0", "train.steps", 18)
    assert "greater than or equal to 1" in err.message


def test_preflight_error_in_matrix_value_points_at_the_value(write_case: Write) -> None:
    path = write_case(GOOD_DCP + "matrix:\n  parallel.vpp: [1, 3]\n")
    with pytest.raises(CaseError) as info:
        load_cases([path])
    err = info.value
    assert (err.case, err.field, err.line) == ("dcp-pp2.vpp3", "model.layers", 3)


def test_setting_below_a_non_mapping_is_an_error() -> None:
    with pytest.raises(ProblemError, match="needs 'parallel' to be a mapping"):
        expand_matrix({"name": "n", "parallel": 3, "matrix": {"parallel.vpp": [1]}})
