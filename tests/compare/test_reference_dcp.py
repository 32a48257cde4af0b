"""The reference pair of a dynamic-CP arm with the aux loss on: the exact bounds while it groups
tokens like the single rank (loss up to and with the first regrouped step, grad norm and aux loss
before it), the named ``regrouped_*`` bounds after it (hand-made records; no training)."""

from __future__ import annotations

import pytest

from harness.compare import CONTRACTS, Check, regroup_step

from tests.compare import scenarios as sc
from tests.compare.scenarios import bump, params


def checks(fault=lambda pair, data: (pair, data)) -> dict[str, Check]:
    pair, data = fault(*sc.reference())
    return {c.name: c for c in CONTRACTS["reference"](pair, data)}


def test_a_dcp_arm_is_exact_up_to_its_first_regrouped_step_and_under_named_bounds_after() -> None:
    pair, data = sc.reference()
    assert regroup_step(False, data["dcp"], data["reference"]) == 3
    got = checks()
    assert all(c.passed for c in got.values())
    why = "dcp regroups tokens into other microbatches (dynamic CP), from step 3"
    assert got["loss"].detail.startswith(f"{why}; up to the regrouping: all 3 steps within bound")
    for name in ("grad_norm", "aux_loss"):
        assert got[name].detail.startswith(f"{why}; before the regrouping")
        assert "all 2 steps within bound" in got[name].detail
    assert got["loss_regrouped"].detail.startswith(f"{why}; after the regrouping")
    assert "all 1 steps within bound" in got["loss_regrouped"].detail
    assert got["grad_norm_regrouped"].detail.startswith(f"{why}; from the regrouping: all 2 steps")
    # The exact bounds are ReferenceContract's loss / grad_norm / aux_loss, the others its
    # regrouped_loss / regrouped_grad_norm.
    p = pair.params
    assert got["loss"].bound == p.loss.max_rel and got["grad_norm"].bound == p.grad_norm.max_rel
    assert got["loss_regrouped"].bound == p.regrouped_loss.max_rel
    assert got["grad_norm_regrouped"].bound == p.regrouped_grad_norm.max_rel


@pytest.mark.parametrize("fault, failed", [
    (bump("dcp", 3, "loss", 2e-6), "loss"),  # the regrouped step's LM loss: still exact
    (bump("dcp", 2, "grad_norm", 2e-6), "grad_norm"),  # before the regrouping: exact
    (bump("dcp", 2, "aux_loss", 2e-6), "aux_loss"),
    (bump("dcp", 4, "loss", 2e-3), "loss_regrouped"),  # after it: its named bound, 1e-3
    (bump("dcp", 3, "grad_norm", 1e-3), "grad_norm_regrouped"),
])
def test_a_drift_beyond_the_bound_of_its_step_fails_that_check_only(fault, failed) -> None:
    got = checks(fault)
    assert [n for n, c in got.items() if not c.passed] == [failed]


def test_the_aux_loss_is_not_compared_from_the_regrouping_and_no_named_bound_is_loosened() -> None:
    # Step 3's grad norm drift of 1e-4 passes regrouped_grad_norm (2e-4); the same drift before
    # the regrouping would fail the exact bound.
    assert checks(bump("dcp", 4, "aux_loss", 0.5))["aux_loss"].passed
    assert not checks(bump("dcp", 1, "grad_norm", 1e-4))["grad_norm"].passed
    # Declared tighter regrouped bounds hold the regrouped steps to them.
    tight = checks(lambda pair, data: params(regrouped_loss={"max_rel": 1e-4})(pair, data))
    assert not tight["loss_regrouped"].passed and tight["loss_regrouped"].bound == 1e-4
