"""The reference arm of a graph case runs the ordinary dynamic-shape path, which its static-shape
arms do not share, and agrees with them within the fp32-parity noise on CPU (the eager arm of a
graph case runs on CPU with static shapes; graph replay itself needs CUDA)."""

import pytest

from harness.arms import plan_case
from harness.spec.presets import resolve_model
from harness.spec.schema import Case, ModelSpec


def graph_case(scope: str) -> Case:
    return Case.model_validate(dict(
        id=f"g-{scope}", name="g", source="<test>",
        model=resolve_model(ModelSpec(layers=2)).model_dump(), parallel={},
        train=dict(steps=4, global_batch=8, seq_length=128, lr=3e-3, seed=3, deterministic=True,
                   dtype="bf16", max_seqs_per_microbatch=8, checkpoint_every=0),
        data={"lengths": {"distribution": "lognormal", "min": 8, "max": 128}},
        compare={"graph_vs_eager": {}, "reference": {}}, graphs={"scope": scope, "warmup_steps": 2},
        resources={"gpus_per_node": 1}))


def test_reference_arm_of_a_graph_case_is_the_dynamic_path_on_one_rank():
    plan = plan_case(graph_case("attn"))
    ref, eager = plan.arm("reference"), plan.arm("eager")
    assert ref.kind == "reference" and ref.case.graphs is None and not ref.case.static_shapes
    assert eager.case.static_shapes and not eager.case.execution.graphed
    assert [p.name for p in plan.pairs] == ["graph_vs_eager", "reference"]
    assert plan.pairs[1].arms == ("eager", "reference")


@pytest.mark.parametrize("scope", ["attn", "full"])
def test_static_eager_path_agrees_with_the_dynamic_reference_on_cpu(scope, monkeypatch):
    import torch.distributed as dist

    from harness.launch.ranks.ports import pick_free_port
    from harness.workload import RankContext, train_arm

    plan = plan_case(graph_case(scope))
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(pick_free_port()))):
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ctx = RankContext(0, 1, 0, "cpu", "none")
        runs = {}
        for name in ("eager", "reference"):
            records: list = []
            train_arm(plan.arm(name).case, ctx, records.append)
            runs[name] = records
    finally:
        dist.destroy_process_group()
    for a, b in zip(runs["eager"], runs["reference"]):
        assert a.microbatches == b.microbatches
        for key in ("loss", "grad_norm", "aux_loss"):
            x, y = getattr(a, key), getattr(b, key)
            assert abs(x - y) <= 1e-6 * abs(y), (scope, a.step, key, x, y)
