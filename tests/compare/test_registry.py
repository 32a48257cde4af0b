"""The comparison registry: one module per comparison, each registering one object that owns its
settings, rules, plan, checks and figures."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import harness.compare as compare
from harness.compare import (
    COMPARISONS,
    CONTRACTS,
    JUDGED,
    PAIR_PARAMS,
    Comparison,
    Judged,
    comparison_of,
    comparisons,
    register,
)
from harness.compare import contracts as contract_modules
from harness.compare.contracts.repeat import RepeatContract, check_repeat
from harness.spec.comparisons import sections
from harness.spec.schema import CompareSpec

ORDER = ["repeat", "graph_vs_eager", "dcp_vs_fixed_cp", "graph_pools", "reference", "golden",
         "oracle", "resume", "slot_ring"]


def test_every_comparison_module_registers_one_comparison() -> None:
    folder = Path(contract_modules.__file__).parent
    files = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    assert list(contract_modules.MODULES) == files
    by_module = {type(c).__module__.rsplit(".", 1)[-1]: name for name, c in COMPARISONS.items()}
    assert by_module == {f: f for f in files}  # each module: its comparison, of its name
    assert [c.name for c in comparisons()] == ORDER
    assert set(CONTRACTS) == set(PAIR_PARAMS) == set(JUDGED) == {*ORDER, "slot_ring_plan"}
    assert all(issubclass(j.params, BaseModel) for j in JUDGED.values())
    assert comparison_of("slot_ring_plan") is COMPARISONS["slot_ring"]
    assert comparison_of("arm_checks") is None


def test_each_comparison_s_settings_are_its_compare_section() -> None:
    assert list(CompareSpec.model_fields) == [*ORDER, "sanity"]
    assert [s.name for s in sections()] == ORDER
    for c in comparisons():
        field = CompareSpec.model_fields[c.name]
        assert field.default is None and c.settings in field.annotation.__args__, c.name


def test_figures_are_the_graph_and_memory_contracts() -> None:
    assert {name for name, j in JUDGED.items() if j.figures} == {
        "graph_vs_eager", "dcp_vs_fixed_cp", "graph_pools", "slot_ring", "slot_ring_plan"}
    assert [c.name for c in comparisons() if c.summary is not None] == ["reference"]


def test_each_emulated_table_part_and_command_rule_has_one_owner() -> None:
    """The emulated-rank table takes each part's figures from one comparison's pair; the
    capture and memory-probe checks a command case may lack, the roles it must give and the comparisons it
    cannot have are said by the comparisons themselves."""
    owners = {c.emulated_figures: c.name for c in comparisons() if c.emulated_figures}
    assert owners == {"graphed": "graph_vs_eager", "pools": "graph_pools",
                      "memory": "dcp_vs_fixed_cp"}
    assert {n: j.capture_checks for n, j in JUDGED.items() if j.capture_checks} == {
        "graph_vs_eager": ("capture", "variants_replayed", "graph_pool_bytes"),
        "dcp_vs_fixed_cp": ("graph_pool_bytes",)}
    assert {n: j.probe_checks for n, j in JUDGED.items() if j.probe_checks} == {
        "graph_vs_eager": ("device_delta_pct",),
        "dcp_vs_fixed_cp": ("device_delta_pct", "active_delta_pct", "reserved_delta_pct")}
    assert [c.name for c in comparisons() if c.not_for_commands] == ["oracle", "slot_ring"]
    assert {s.name: s.not_for_commands for s in sections()} == {
        c.name: c.not_for_commands for c in comparisons()}


class Impostor(Comparison):
    name = "repeat"
    settings = RepeatContract
    order = 10
    judged = {"repeat": Judged(RepeatContract, check_repeat)}

    def plan(self, case, settings, planner):
        return []


class ArmChecks(Comparison):
    name = "arm_checks"
    settings = RepeatContract
    order = 99
    judged = {"arm_checks": Judged(RepeatContract, check_repeat)}

    def plan(self, case, settings, planner):
        return []


def test_a_comparison_without_a_plan_cannot_be_made() -> None:
    class Planless(Comparison):
        name = "planless"
        settings = RepeatContract
        order = 98
        judged = {"planless": Judged(RepeatContract, check_repeat)}

    with pytest.raises(TypeError, match="plan"):
        Planless()


def test_a_name_taken_by_another_class_is_refused() -> None:
    with pytest.raises(ValueError, match="contract 'repeat' is registered twice: "
                                         "harness.compare.contracts.repeat.Repeat and "
                                         "tests.compare.test_registry.Impostor"):
        register(Impostor())
    with pytest.raises(ValueError, match="'arm_checks' is the arm-checks entry"):
        register(ArmChecks())
    assert type(COMPARISONS["repeat"]).__module__ == "harness.compare.contracts.repeat"
    assert "arm_checks" not in COMPARISONS and "arm_checks" not in CompareSpec.model_fields


def test_the_registry_views_are_read_only() -> None:
    with pytest.raises(TypeError):
        COMPARISONS["x"] = COMPARISONS["repeat"]  # type: ignore[index]
    with pytest.raises(TypeError):
        JUDGED["x"] = JUDGED["repeat"]  # type: ignore[index]


def test_the_package_names_stay_importable_from_harness_compare() -> None:
    for name in compare.__all__:
        assert hasattr(compare, name), name
