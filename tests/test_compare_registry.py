"""The contract registry: one module per contract, each registering itself."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Mapping

import pytest
from pydantic import BaseModel

import harness.compare as compare
from harness.compare import CONTRACTS, PAIR_PARAMS, Check, Pair, contract, evaluate_case, registry
from harness.compare import contracts as contract_modules
from harness.results import ArmOutcome, StepRecord

OK = ArmOutcome(status="ok", returncode=0, wall_s=1.0)


def test_every_contract_module_registers_its_contract() -> None:
    folder = Path(contract_modules.__file__).parent
    files = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    assert list(contract_modules.MODULES) == files
    by_module = {fn.__module__.rsplit(".", 1)[-1]: name for name, fn in CONTRACTS.items()}
    assert sorted(by_module) == files  # each module registered (at least) one contract
    assert set(CONTRACTS) == set(PAIR_PARAMS) == {
        "repeat", "graph_vs_eager", "dcp_vs_fixed_cp", "graph_pools", "reference", "golden",
        "resume", "slot_ring", "slot_ring_plan"}
    assert all(issubclass(model, BaseModel) for model in PAIR_PARAMS.values())


class Toy(BaseModel):
    most: float = 10.0


@pytest.fixture
def toy() -> Iterator[None]:
    @contract("toy", Toy)
    def toy_contract(pair: Pair, data: Mapping[str, Mapping[int, list[StepRecord]]]) -> tuple[Check, ...]:
        loss = max(r.loss or 0.0 for recs in data[pair.arms[0]].values() for r in recs)
        return (Check("largest_loss", loss, pair.params.most, loss <= pair.params.most),)

    try:
        yield
    finally:
        registry._checks.pop("toy", None)
        registry._params.pop("toy", None)


def test_a_registered_contract_types_its_pairs_and_is_evaluated(toy: None) -> None:
    pair = Pair("toy", "toy", ("eager",), {"most": 3.0})
    assert pair.params == Toy(most=3.0)
    with pytest.raises(ValueError, match="pair 'bad': bad toy settings: most"):
        Pair("bad", "toy", ("eager",), {"most": "lots"})
    steps = {0: [StepRecord(step=1, loss=4.0, grad_norm=1.0), StepRecord(step=2, loss=2.0, grad_norm=1.0)]}
    v = evaluate_case("c1", [pair], {"eager": (OK, steps)}, expected_steps=2, expected_ranks=1)
    checks = {c.name: c for c in v.pairs[0].checks}
    assert v.status == "fail" and not checks["largest_loss"].passed
    assert checks["largest_loss"].value == 4.0 and checks["eager.steps_complete"].passed


def test_a_name_taken_by_another_function_is_refused(toy: None) -> None:
    with pytest.raises(ValueError, match="contract 'repeat' is registered twice: "
                                         "harness.compare.contracts.repeat.repeat and"):
        contract("repeat", Toy)(lambda pair, data: ())
    with pytest.raises(ValueError, match="'arm_checks' is the arm-checks entry"):
        contract("arm_checks", Toy)(lambda pair, data: ())
    assert CONTRACTS["repeat"].__module__ == "harness.compare.contracts.repeat"


def test_the_package_names_stay_importable_from_harness_compare() -> None:
    for name in compare.__all__:
        assert hasattr(compare, name), name
