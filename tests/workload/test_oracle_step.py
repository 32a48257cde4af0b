"""The oracle over the whole optimizer step (issue 48): the focused oracle case clips on some
steps and not on others, decays with the no-decay split (expert weights included), warms the
learning rate up and decays it, and trains with the aux loss. A fault in each of these, injected
here (never in production code), is one every pair of arms shares: golden values re-recorded with
the fault in place pass bitwise, and only the oracle fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from harness.compare.contracts.golden import GoldenPairParams, check_golden  # noqa: E402
from harness.compare.contracts.oracle import check_oracle  # noqa: E402
from harness.compare.pair import Pair  # noqa: E402
from harness.golden import GoldenCopy, golden_values  # noqa: E402
from harness.spec import load_cases  # noqa: E402
from harness.spec.derive import ORACLE_ARM, ArmSpec, derive_arm_case  # noqa: E402
from harness.spec.names import EAGER  # noqa: E402
from harness.workload import RankContext, train_arm  # noqa: E402
from harness.workload import optim  # noqa: E402
from harness.workload import moe as moe_mod  # noqa: E402
from harness.workload import train as train_mod  # noqa: E402

CASE_FILE = Path(__file__).resolve().parents[2] / "cases" / "focused" / "tiny-moe-oracle.yaml"
CPU = RankContext(0, 1, 0, "cpu", "none")


def oracle_run() -> dict[int, list[Any]]:
    """The focused oracle case's one arm, trained in this process: {rank: records}."""
    (case,) = load_cases([CASE_FILE])
    arm = derive_arm_case(case, ArmSpec(kind=EAGER, oracle=True))
    out: list[Any] = []
    train_arm(arm, CPU, out.append)
    return {0: out}


def failed(checks) -> set[str]:
    return {c.name for c in checks if c.passed is False}


def oracle_failures(run: dict[int, list[Any]]) -> set[str]:
    pair = Pair("oracle", "oracle", (ORACLE_ARM,), {})
    return failed(check_oracle(pair, {ORACLE_ARM: run}))


def golden_failures(recorded: dict[int, list[Any]], judged: dict[int, list[Any]]) -> set[str]:
    """The golden check of ``judged`` against values recorded from ``recorded``, bitwise."""
    copy = GoldenCopy(path="golden/c/golden_values_cpu.json", sha256="0" * 64,
                      document=golden_values(recorded))
    params = GoldenPairParams(arm=ORACLE_ARM, case_id="c", golden_dir="golden",
                              steps=len(judged[0]), files={"cpu": copy}, loss="exact",
                              aux_loss="exact", grad_norm="exact", step_time=None)
    checks = check_golden(Pair("golden", "golden", (ORACLE_ARM,), params), {ORACLE_ARM: judged})
    return failed(checks)


def test_the_case_exercises_the_whole_step() -> None:
    """Clean: every oracle check passes, and the case really clips on some steps only, decays
    the learning rate after a warmup, and has an aux loss."""
    run = oracle_run()
    assert oracle_failures(run) == set()
    (case,) = load_cases([CASE_FILE])
    clip = case.train.optimizer.grad_clip
    norms = [r.grad_norm for r in run[0]]
    assert any(n > clip for n in norms) and any(n < clip for n in norms), norms
    lrs = [r.lr for r in run[0]]
    assert lrs[0] < lrs[1] < lrs[2] == case.train.lr > lrs[3] > lrs[-1] > 0, lrs
    assert case.train.optimizer.weight_decay > 0 and case.model.aux_loss_coeff > 0
    assert all(r.aux_loss > 0 for r in run[0])


def _clip_skips_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    real = train_mod.clip_grads_
    monkeypatch.setattr(train_mod, "clip_grads_",
                        lambda params, norm, clip: real([p for p in params if p.dim() < 3],
                                                        norm, clip))


def _experts_do_not_decay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optim, "decays", lambda p: p.dim() == 2)


def _warmup_one_step_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    real = train_mod.scheduled_lr
    monkeypatch.setattr(train_mod, "scheduled_lr", lambda train, step: real(train, step + 1))


def _aux_gradient_doubled(monkeypatch: pytest.MonkeyPatch) -> None:
    real = moe_mod._AuxLossInjector.backward

    def backward(ctx: Any, grad: Any) -> Any:
        g, aux, none = real(ctx, grad)
        return g, aux * 2, none

    monkeypatch.setattr(moe_mod._AuxLossInjector, "backward", staticmethod(backward))


FAULTS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], set[str]]] = {
    # fault: (install, oracle checks it must fail at least)
    "clip-skips-experts": (_clip_skips_experts, {"grads", "params"}),
    "experts-do-not-decay": (_experts_do_not_decay, {"params"}),
    "warmup-one-step-ahead": (_warmup_one_step_ahead, {"lr", "params"}),
    "aux-gradient-doubled": (_aux_gradient_doubled, {"grads", "params"}),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_golden_values_were_recorded_with_fails_only_the_oracle(
        fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    install, expected = FAULTS[fault]
    install(monkeypatch)
    recorded, judged = oracle_run(), oracle_run()  # golden values re-recorded over the fault
    assert golden_failures(recorded, judged) == set()
    assert expected <= oracle_failures(judged), oracle_failures(judged)
