"""load_cases: good files and folders, and one clear located error for each kind of bad file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from pydantic import ValidationError

from harness.errors import CaseError, ConfigError
from harness.spec import Case, load_cases
from harness.spec.limits import LIMITS
from harness.spec.schema import CaseFile
from harness.spec.validation import all_problems

from .conftest import GOOD_DCP, GOOD_FIXED

Write = Callable[..., Path]


def _error(path: Path) -> CaseError:
    with pytest.raises(CaseError) as info:
        load_cases([path])
    return info.value


# ----------------------------------------------------------------- good files
def test_good_fixed_cp_file(write_case: Write) -> None:
    path = write_case(GOOD_FIXED)
    [case] = load_cases([path])
    assert isinstance(case, Case)
    assert case.id == case.name == "fixed-cp2"
    assert case.source == str(path)
    assert case.tags == ("focused", "cpu")
    assert case.model.preset == "tiny" and case.model.hidden == 64
    assert (case.layout.world, case.layout.dp_cp, case.layout.dp) == (2, 2, 1)
    assert case.matrix_values == {}


def test_good_dcp_file_and_single_path_argument(write_case: Write) -> None:
    path = write_case(GOOD_DCP)
    [case] = load_cases(path)  # a single path works as well as a list
    assert case.layout.dynamic and case.layout.cp_sizes == (1, 2)
    assert (case.layout.world, case.layout.dp_cp, case.layout.dp) == (4, 2, 2)


def test_folder_loads_every_yaml_below_sorted(write_case: Write, tmp_path: Path) -> None:
    write_case(GOOD_DCP, "b/dcp.yml")
    write_case(GOOD_FIXED, "a.yaml")
    write_case("not a case", "notes.txt")
    write_case(GOOD_FIXED.replace("fixed-cp2", "hidden"), ".hidden/x.yaml")
    cases = load_cases([tmp_path])
    assert [c.id for c in cases] == ["fixed-cp2", "dcp-pp2"]


def test_same_file_twice_is_loaded_once(write_case: Write, tmp_path: Path) -> None:
    path = write_case(GOOD_FIXED)
    assert [c.id for c in load_cases([tmp_path, path])] == ["fixed-cp2"]


def test_case_round_trips_through_json(write_case: Write) -> None:
    [case] = load_cases([write_case(GOOD_DCP + "matrix: {parallel.vpp: [2]}\n")])
    again = Case.model_validate(case.model_dump(mode="json"))
    assert again == case
    assert again.matrix_values == {"parallel.vpp": 2}


# ----------------------------------------------------------------- paths
def test_missing_path_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file or folder"):
        load_cases([tmp_path / "nope.yaml"])


def test_folder_without_case_files_is_config_error(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(ConfigError, match="holds no case files"):
        load_cases([tmp_path])


def test_no_paths_is_config_error() -> None:
    with pytest.raises(ConfigError, match="no case files given"):
        load_cases([])


# ----------------------------------------------------------------- YAML level
def test_yaml_syntax_error_reports_line(write_case: Write) -> None:
    path = write_case("""\
        name: x
        train: {steps: 1, lr: 1
        parallel: {}
        """)
    err = _error(path)
    assert err.line == 3 and err.file == str(path)
    assert str(err).startswith(f"{path}:3: invalid YAML:")
    assert "starts at line 2" in str(err)


def test_bad_indentation_reports_line(write_case: Write) -> None:
    err = _error(write_case("name: x\ntrain:\n  steps: 1\n lr: 2\n"))
    assert err.line == 4 and "invalid YAML" in err.message


def test_python_tag_is_refused_and_never_executed(write_case: Write, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = write_case(f"""\
        name: x
        train:
          steps: !!python/object/apply:os.system ["touch {marker}"]
        """)
    err = _error(path)
    assert not marker.exists()
    assert err.line == 3 and err.field == "train.steps"
    assert "!!python/object/apply:os.system" in err.message and "safe YAML" in err.message


def test_python_name_tag_in_key_is_refused(write_case: Write, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED2"
    path = write_case(f"""\
        name: x
        ? !!python/object/apply:builtins.open ["{marker}", "w"]
        : 1
        """)
    err = _error(path)
    assert not marker.exists()
    assert err.line == 2 and "not allowed" in err.message


def test_unknown_tag_is_an_error_with_line(write_case: Write) -> None:
    err = _error(write_case("name: x\ntrain: !include other.yaml\n"))
    assert err.line == 2 and "invalid YAML" in err.message and "!include" in err.message


def test_duplicate_key_is_an_error(write_case: Write) -> None:
    path = write_case(GOOD_FIXED.replace("  steps: 3\n", "  steps: 3\n  steps: 4\n"))
    err = _error(path)
    assert err.field == "train.steps" and err.line == 7
    assert "duplicate key 'steps' (first given at line 6)" in err.message


def test_merge_keys_and_anchors_are_allowed(write_case: Write) -> None:
    text = GOOD_FIXED.replace(
        "  steps: 3\n", "  <<: {steps: 9, global_batch: 4}\n  steps: 3\n"
    ).replace("  global_batch: 4\n", "").replace("tags: [focused, cpu]", "tags: &t [focused, cpu]")
    [case] = load_cases([write_case(text)])
    assert (case.train.steps, case.train.global_batch) == (3, 4)  # explicit key beats merged


def test_alias_bomb_is_refused_quickly(write_case: Write) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = "description:\n" + "\n".join("  " + line for line in lines) + "\n"
    # nested under a mapping value so the keys are legal YAML; the size check runs first
    err = _error(write_case("name: x\nmatrix:\n  " + text.replace("\n", "\n  ")))
    assert "expands to more than" in err.message


def test_empty_file_and_non_mapping(write_case: Write) -> None:
    assert "no YAML document" in _error(write_case("# only a comment\n", "e.yaml")).message
    err = _error(write_case("- 1\n- 2\n", "l.yaml"))
    assert "one mapping" in err.message and "list" in err.message


def test_two_documents_are_an_error(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED + "---\nname: y\n"))
    assert "invalid YAML" in err.message and err.line == 15


# ----------------------------------------------------------------- schema level
def test_unknown_top_level_key(write_case: Write) -> None:
    path = write_case(GOOD_FIXED + "trian: {}\n")
    err = _error(path)
    assert str(err) == (
        f"{path}:15: case 'fixed-cp2': field 'trian': unknown key 'trian' (did you mean "
        "'train'?); allowed keys here: name, description, tags, model, parallel, train, data, "
        "graphs, shapes, resources, expect, emulate, command, memory_model, compare, matrix"
    )


def test_unknown_nested_key(write_case: Write) -> None:
    path = write_case(GOOD_FIXED.replace("lengths: {", "lengths: {sigmaa: 1, "))
    err = _error(path)
    assert (err.field, err.line, err.case) == ("data.lengths.sigmaa", 11, "fixed-cp2")
    assert "unknown key 'sigmaa' (did you mean 'sigma'?)" in err.message


def test_bad_type(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("steps: 3", "steps: three")))
    assert (err.field, err.line) == ("train.steps", 6)
    assert "valid integer" in err.message and "'three'" in err.message


def test_bad_type_for_section(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("parallel: {pp: 1, cp: 2}", "parallel: 2")))
    assert err.field == "parallel" and err.line == 4
    assert "expected a mapping of fields (pp, vpp" in err.message


def test_bad_list_item_points_at_the_item(write_case: Write) -> None:
    err = _error(write_case(GOOD_DCP.replace("dynamic_cp: [1, 2]", "dynamic_cp: [1, x]")))
    assert err.field == "parallel.dynamic_cp.1" and err.line == 4


def test_missing_required_field(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("  lr: 1.0e-3\n", "")))
    assert (err.field, err.line) == ("train.lr", 5)
    assert err.message == "required field is missing"


def test_union_field_error_is_one_message(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("{loss: exact}", "{loss: exactt}")))
    assert err.field == "compare.repeat.loss" and err.line == 13
    assert "'exact'" in err.message and "max_abs" in err.message and "'exactt'" in err.message


def test_union_field_reports_the_deeper_error(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("{loss: exact}", "{loss: {max_abs: -1}}")))
    assert err.field == "compare.repeat.loss.max_abs"
    assert "greater than or equal to 0" in err.message


def test_model_validator_message_is_clean(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("cp: 2}", "cp: 2, dynamic_cp: [1, 2]}")))
    assert err.field == "parallel" and err.message.startswith("give either cp")


def test_bad_name_pattern(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("name: fixed-cp2", "name: Fixed CP")))
    assert err.field == "name" and err.line == 1 and "pattern" in err.message


def test_every_problem_is_listed_not_counted(write_case: Write) -> None:
    text = GOOD_FIXED.replace("steps: 3", "steps: x").replace("lr: 1.0e-3", "lr: y")
    err = _error(write_case(text))
    assert err.field == "train.steps" and "more problem" not in err.message
    also = err.message.splitlines()[1]
    assert also.startswith("  also field 'train.lr' (line ") and "valid number" in also


def test_a_size_past_its_bound_says_why(write_case: Write) -> None:
    # steps: 10**23 validated, then the comparison built set(range(steps)) until OOM-killed
    err = _error(write_case(GOOD_FIXED.replace("steps: 3", "steps: 100000000000000000000000")))
    assert err.field == "train.steps"
    assert err.message.startswith("must be at most 1000000: a regression case runs")
    assert err.message.endswith("(got 100000000000000000000000)")


@pytest.mark.parametrize("field, value", [
    ("model.layers", 100000), ("model.vocab", 10 ** 9), ("parallel.pp", 100000),
    ("train.global_batch", 10 ** 7), ("train.seq_length", 10 ** 9),
    ("train.microbatches", 100000000), ("resources.gpus_per_node", 10 ** 4),
    ("resources.time_min", 10 ** 7)])
def test_every_size_has_a_bound_with_a_reason(field: str, value: int) -> None:
    section, _, key = field.rpartition(".")
    data = {"name": "x", "train": {"steps": 1, "global_batch": 1, "seq_length": 8, "lr": 1.0}}
    data.setdefault(section, {})[key] = value
    with pytest.raises(ValidationError) as exc:
        CaseFile.model_validate(data)
    (problem,) = all_problems(exc.value)
    assert problem.field == field and LIMITS[field].reason in problem.message


def err_text(path: Path) -> str:
    return _error(path).message


def test_unknown_preset(write_case: Write) -> None:
    err = _error(write_case(GOOD_FIXED.replace("preset: tiny", "preset: llama")))
    assert (err.field, err.line) == ("model.preset", 3)
    assert "unknown model preset 'llama'; known presets: qwen3-30b-a3b, tiny" in err.message


# ----------------------------------------------------------------- preflight through the loader
def test_impossible_parallel_layout(write_case: Write) -> None:
    path = write_case(GOOD_FIXED.replace("cp: 2}", "cp: 4}"))
    err = _error(path)
    assert (err.case, err.field, err.line) == ("fixed-cp2", "parallel.cp", 4)
    assert str(err).startswith(f"{path}:4: case 'fixed-cp2': field 'parallel.cp': the world size 2")


def test_preflight_field_absent_from_file_points_at_its_section(write_case: Write) -> None:
    # dynamic CP without max_seqlen_per_rank: the field is not in the file, its section is
    err = _error(write_case(GOOD_DCP.replace(" max_seqlen_per_rank: 128,", "")))
    assert (err.field, err.line) == ("train.max_seqlen_per_rank", 5)


def test_preflight_counts_further_problems(write_case: Write) -> None:
    text = GOOD_FIXED.replace("kv_heads", "x").replace("preset: tiny,", "preset: tiny, kv_heads: 3,")
    text = text.replace("max: 128", "max: 4096")
    err = _error(write_case(text))
    assert err.field == "model.kv_heads" and len(err.message.splitlines()) == 2
    assert err.message.splitlines()[1].startswith("  also field 'data.lengths.max' (line ")


# ----------------------------------------------------------------- ids across files
def test_duplicate_case_ids_across_files(write_case: Write, tmp_path: Path) -> None:
    first = write_case(GOOD_FIXED, "a.yaml")
    second = write_case(GOOD_FIXED, "b.yaml")
    with pytest.raises(CaseError) as info:
        load_cases([first, second])
    err = info.value
    assert err.file == str(second) and err.field == "name" and err.line == 1
    assert f"duplicate case id 'fixed-cp2' (also defined in {first}:1)" in err.message


def test_matrix_ids_may_not_collide_with_other_files(write_case: Write) -> None:
    a = write_case(GOOD_FIXED.replace("name: fixed-cp2", "name: x.seed1"), "a.yaml")
    b = write_case(GOOD_FIXED.replace("name: fixed-cp2", "name: x") + "matrix: {train.seed: [1]}\n",
                   "b.yaml")
    with pytest.raises(CaseError, match="duplicate case id 'x.seed1'"):
        load_cases([a, b])


def test_missing_name_has_no_case_label_and_no_line(write_case: Write) -> None:
    path = write_case(GOOD_FIXED.replace("name: fixed-cp2\n", ""))
    err = _error(path)
    assert str(err) == f"{path}: field 'name': required field is missing"


@pytest.mark.parametrize(("old", "new", "field"), [
    ("steps: 3", "steps: yes", "train.steps"),            # YAML 1.1 boolean, not 1
    ("lr: 1.0e-3", "lr: true", "train.lr"),
    ("{pp: 1, cp: 2}", "{pp: 1, cp: on}", "parallel.cp"),
])
def test_boolean_for_a_number_is_an_error(write_case: Write, old: str, new: str,
                                          field: str) -> None:
    err = _error(write_case(GOOD_FIXED.replace(old, new)))
    assert err.field == field and "expected a number, got true" in err.message


def test_boolean_in_a_number_list_is_an_error(write_case: Write) -> None:
    err = _error(write_case(GOOD_DCP.replace("dynamic_cp: [1, 2]", "dynamic_cp: [true, 2]")))
    assert err.field == "parallel.dynamic_cp" and "got [true, 2]" in err.message


@pytest.mark.parametrize(("old", "new", "field"), [
    ("lr: 1.0e-3", "lr: .inf", "train.lr"),
    ("{loss: exact}", "{loss: {max_abs: .nan}}", "compare.repeat.loss.max_abs"),
    ("{gpus_per_node: 2}", "{gpus_per_node: 2, time_min: .inf}", "resources.time_min"),
])
def test_non_finite_settings_are_errors(write_case: Write, old: str, new: str, field: str) -> None:
    err = _error(write_case(GOOD_FIXED.replace(old, new)))
    assert err.field == field and "finite number" in err.message


@pytest.mark.parametrize(("key", "kind"), [("1", "int"), ("null", "null"), ("on", "bool")])
def test_key_that_yaml_reads_as_a_non_string_names_its_line(write_case: Write, key: str,
                                                            kind: str) -> None:
    err = _error(write_case(GOOD_FIXED.replace("{pp: 1, cp: 2}", f"{{pp: 1, {key}: 2}}")))
    assert (err.field, err.line) == ("parallel", 4)
    assert f"key '{key}' is read as a YAML {kind}, not a name" in err.message


def test_a_symlink_loop_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match=r"a\.yaml: symlink loop"):
        load_cases(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match=r"\.yaml: symlink loop"):  # inside a folder, too
        load_cases(tmp_path)


def test_a_broken_symlink_names_its_target(tmp_path: Path) -> None:
    (tmp_path / "case.yaml").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ConfigError, match=r"case\.yaml: broken symlink \(its target .*gone\.yaml"):
        load_cases(tmp_path / "case.yaml")
