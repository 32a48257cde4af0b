"""The oracle arm (``harness.workload.oracle``): our one-rank training beside Hugging Face's
Qwen3-MoE. Clean, every difference is rounding, inside ``compare.oracle``'s default bounds; a
fault in our layers or in our optimizer step puts it far outside them; without transformers the
arm still trains and the pair is skipped, with the install command."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from harness.compare.contracts.oracle import OracleContract  # noqa: E402
from harness.workload import RankContext, train_arm  # noqa: E402
from harness.workload import oracle as oracle_mod  # noqa: E402

from tests.workload.factories import eager_arm, make_case  # noqa: E402

CPU = RankContext(0, 1, 0, "cpu", "none")
BOUNDS = OracleContract()


def oracle_records(**train):
    pytest.importorskip("transformers")
    case = make_case(model={"layers": 1}, train={"steps": 2, "global_batch": 4, **train})
    arm = eager_arm(case)
    arm = arm.model_copy(update={"execution": arm.execution.model_copy(update={"oracle": True})})
    out = []
    train_arm(arm, CPU, out.append)
    return out


def worst(records) -> dict[str, float]:
    rel = lambda a, b: abs(a - b) / abs(b)  # noqa: E731
    return {"loss": max(rel(r.loss, r.oracle.loss) for r in records),
            "aux_loss": max(rel(r.aux_loss, r.oracle.aux_loss) for r in records),
            "grad_norm": max(rel(r.grad_norm, r.oracle.grad_norm) for r in records),
            "logits": max(r.oracle.logits_rel for r in records),
            "grads": max(r.oracle.grads_rel for r in records),
            "params": max(r.oracle.params_rel for r in records)}


def test_clean_our_training_and_hugging_face_s_agree_to_rounding() -> None:
    got = worst(oracle_records())
    for name, value in got.items():
        assert value <= getattr(BOUNDS, name), (name, value)
    assert got["params"] > 0  # two implementations: not the same bits, so not the same code


def test_a_fault_in_our_norm_layer_is_far_outside(monkeypatch) -> None:
    from harness.workload import norm

    real = norm.RMSNorm.forward
    monkeypatch.setattr(norm.RMSNorm, "forward", lambda self, x: real(self, x) * 1.01)
    got = worst(oracle_records())
    assert got["loss"] > 100 * BOUNDS.loss and got["logits"] > 10 * BOUNDS.logits


def test_a_fault_in_our_optimizer_step_shows_in_the_parameters(monkeypatch) -> None:
    from harness.workload import optim

    real = optim.clip_grads_
    monkeypatch.setattr(optim, "clip_grads_", lambda params, norm, clip: real(params, norm, 0.1))
    import harness.workload.train as train

    monkeypatch.setattr(train, "clip_grads_", optim.clip_grads_)
    got = worst(oracle_records())
    assert got["params"] > 10 * BOUNDS.params or got["grads"] > 10 * BOUNDS.grads


def test_without_transformers_the_arm_trains_and_says_why(monkeypatch) -> None:
    monkeypatch.setattr(oracle_mod, "available", lambda: oracle_mod.MISSING)
    case = make_case(model={"layers": 1}, train={"steps": 1, "global_batch": 2})
    arm = eager_arm(case)
    arm = arm.model_copy(update={"execution": arm.execution.model_copy(update={"oracle": True})})
    out = []
    train_arm(arm, CPU, out.append)
    assert len(out) == 1 and math.isfinite(out[0].loss)
    assert out[0].oracle.unavailable == oracle_mod.MISSING and out[0].oracle.loss is None
