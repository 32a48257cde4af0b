"""The names of arms and contracts (harness/spec/names.py): the constants, their types and the
registry agree."""

from __future__ import annotations

from typing import get_args

from harness.compare import CONTRACTS
from harness.spec import names
from harness.spec.schema import CommandRole


def test_arm_kind_type_lists_the_arm_kinds() -> None:
    assert get_args(names.ArmKind) == names.ARM_KINDS


def test_command_roles_are_the_arm_kinds_and_the_repeat_role() -> None:
    assert set(get_args(CommandRole)) == {*names.ARM_KINDS, names.REPEAT_ROLE}


def test_every_registered_contract_is_named_and_every_named_contract_registered() -> None:
    named = {names.REPEAT, names.GRAPH_VS_EAGER, names.DCP_VS_FIXED_CP, names.GRAPH_POOLS,
             names.REFERENCE_CONTRACT, names.GOLDEN, names.ORACLE, names.RESUME, names.SLOT_RING,
             names.SLOT_RING_PLAN}
    assert set(CONTRACTS) == named
    assert names.ARM_CHECKS_CONTRACT not in CONTRACTS


def test_pair_name_of_later_pairs_names_the_arm() -> None:
    assert names.pair_name(names.RESUME, 0, "eager") == "resume"
    assert names.pair_name(names.RESUME, 1, "graph") == "resume-graph"
