"""Build Case objects directly (no YAML) for workload tests; spawned multi-rank runs: spawn.py."""

from __future__ import annotations

from typing import Any, Optional

from harness.spec.names import DCP, EAGER
from harness.spec.schema import ArmCase, Case, ResolvedModel

TINY = dict(
    preset="tiny", layers=4, hidden=32, heads=4, kv_heads=2, head_dim=8, experts=4,
    experts_per_token=2, moe_ffn=32, vocab=64, rope_theta=10000.0, norm_eps=1e-6, aux_loss_coeff=1e-2,
)


def make_case(
    *,
    model: Optional[dict[str, Any]] = None,
    parallel: Optional[dict[str, Any]] = None,
    train: Optional[dict[str, Any]] = None,
    data: Optional[dict[str, Any]] = None,
    world: int = 1,
    name: str = "t",
) -> Case:
    tr = dict(steps=4, global_batch=8, seq_length=64, lr=3e-3, seed=7, deterministic=True, dtype="fp32")
    tr.update(train or {})
    return Case.model_validate(
        dict(
            id=name,
            name=name,
            source="<test>",
            model=ResolvedModel(**{**TINY, **(model or {})}).model_dump(),
            parallel=parallel or {},
            train=tr,
            data=data or {"lengths": {"distribution": "uniform", "min": 8, "max": 40}},
            compare={},
            resources={"nodes": 1, "gpus_per_node": world},
        )
    )



def eager_arm(case: Case | ArmCase) -> ArmCase:
    """What ``train_arm`` / ``emulate_rank`` run for a user's case built here: the same case as
    an eager arm's case (named ``dcp`` in a dynamic-CP case), without the arm preflight (some of
    these cases exist to run layouts a case file may not declare); an arm's case as it is."""
    if isinstance(case, ArmCase):
        return case
    data = case.model_dump()
    data.pop("compare")
    return ArmCase.model_validate({**data, "arm": DCP if case.layout.dynamic else EAGER})
