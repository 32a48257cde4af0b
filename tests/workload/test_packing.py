import pytest

from harness.errors import ConfigError
from harness.workload.packing import dynamic_cp_need, padded_length, plan_step

from tests.workload.factories import eager_arm, make_case


def _padded_tokens(group) -> int:
    """Tokens of a CP group once each sequence is padded to its CP multiple."""
    return sum(padded_length(s.length, group.size) for s in group.sequences)


def _all_indices(plan):
    return sorted(s.index for mb in plan.microbatches for g in mb.groups for s in g.sequences)


@pytest.mark.parametrize("world,parallel", [(1, {}), (2, {}), (4, {"cp": 2}), (4, {"pp": 2, "cp": 2})])
def test_fixed_cp_packs_every_sequence_once_within_capacity(world, parallel):
    case = make_case(world=world, parallel=parallel, train={"global_batch": 16})
    for step in (1, 2, 3):
        plan = plan_step(case, step)
        assert _all_indices(plan) == list(range(16))
        cp = parallel.get("cp", 1)
        for mb in plan.microbatches:
            assert [g.start for g in mb.groups] == list(range(0, case.layout.dp_cp, cp))
            for g in mb.groups:
                assert g.size == cp and g.sequences
                assert g.tokens <= case.train.seq_length
        assert plan.total_tokens == sum(s.length for mb in plan.microbatches for g in mb.groups for s in g.sequences)


def test_fixed_microbatch_count_is_honoured_or_explained():
    case = make_case(train={"global_batch": 16, "microbatches": 9})
    assert len(plan_step(case, 1).microbatches) == 9
    too_few = make_case(train={"global_batch": 16, "microbatches": 1})
    with pytest.raises(ConfigError, match="raise train.microbatches"):
        plan_step(too_few, 1)


def test_dynamic_cp_rule_follows_megatron():
    sizes = (1, 2, 4)
    assert dynamic_cp_need(10, sizes, 32) == 1
    assert dynamic_cp_need(32, sizes, 32) == 1
    assert dynamic_cp_need(33, sizes, 32) == 2
    assert dynamic_cp_need(100, sizes, 32) == 4
    assert dynamic_cp_need(10, (2, 4), 32) == 2  # min_cp
    with pytest.raises(ConfigError, match="needs CP > 4"):
        dynamic_cp_need(200, sizes, 32)


@pytest.mark.parametrize("pool", [2, 4])
def test_dynamic_cp_tiles_the_pool_with_no_idle_rank(pool):
    case = make_case(
        world=pool,
        parallel={"dynamic_cp": [1, 2, 4][: pool.bit_length()]},
        train={"global_batch": 24, "seq_length": 32 * pool, "max_seqlen_per_rank": 32},
        data={"lengths": {"distribution": "lognormal", "min": 4, "max": 32 * pool}},
    )
    seen_sizes = set()
    for step in (1, 2, 3, 4):
        plan = plan_step(case, step)
        assert _all_indices(plan) == list(range(24))
        for mb in plan.microbatches:
            start = 0
            for g in mb.groups:
                assert g.start == start and g.start % g.size == 0
                start += g.size
                assert _padded_tokens(g) <= g.size * 32
                for s in g.sequences:
                    assert g.size >= dynamic_cp_need(s.length, case.layout.cp_sizes, 32)
                seen_sizes.add(g.size)
            assert start == pool
    assert len(seen_sizes) > 1


@pytest.mark.parametrize("world, sizes, train, lengths", [
    # an odd leftover sequence and no larger size to widen into
    (2, [1], {"global_batch": 16, "seq_length": 32, "max_seqlen_per_rank": 32},
     {"distribution": "uniform", "min": 1, "max": 32}),
    # a gap of 1-3 ranks that no allowed size (1 or 4) can fill by widening
    (8, [1, 4], {"global_batch": 16, "seq_length": 64, "max_seqlen_per_rank": 16},
     {"distribution": "lognormal", "min": 8, "max": 64}),
])
def test_idle_ranks_get_a_sequence_split_off_a_shared_group(world, sizes, train, lengths):
    case = make_case(world=world, parallel={"dynamic_cp": sizes}, train=train,
                     data={"lengths": lengths})
    msr = train["max_seqlen_per_rank"]
    for step in (1, 2, 3):
        plan = plan_step(case, step)  # raised "leaves N of M DP x CP ranks idle" before
        assert _all_indices(plan) == list(range(train["global_batch"]))
        for mb in plan.microbatches:
            assert sum(g.size for g in mb.groups) == world
            for g in mb.groups:
                assert g.sequences and _padded_tokens(g) <= g.size * msr
                assert all(g.size >= dynamic_cp_need(s.length, tuple(sizes), msr) for s in g.sequences)


def test_fixed_cp_override_of_a_dynamic_case_packs_the_same_tokens():
    case = make_case(
        world=2, parallel={"dynamic_cp": [1, 2]},
        train={"global_batch": 12, "seq_length": 64, "max_seqlen_per_rank": 32},
    )
    from harness.spec.derive import as_fixed_cp

    dyn, fixed = plan_step(case, 1), plan_step(as_fixed_cp(case, 2, "fixed-cp2"), 1)
    assert _all_indices(dyn) == _all_indices(fixed)
    assert dyn.total_tokens == fixed.total_tokens
    assert all(mb.cp_sizes == (2,) for mb in fixed.microbatches)


def test_padding():
    assert padded_length(5, 1) == 5
    assert padded_length(5, 2) == 8
    assert padded_length(8, 4) == 8
    assert padded_length(9, 4) == 16


def test_microbatch_counts_are_raised_to_what_the_vpp_schedule_runs():
    from harness.slotmem.schedule import microbatch_count_problem

    for parallel, world in (({"pp": 2, "vpp": 2}, 2), ({"pp": 2, "vpp": 2, "dynamic_cp": [1, 2]}, 4)):
        case = make_case(
            world=world, parallel=parallel,
            train={"global_batch": 12, "seq_length": 64, "max_seqlen_per_rank": 32},
        )
        for step in (1, 2, 3, 4):
            plan = plan_step(case, step)
            assert microbatch_count_problem(2, 2, 2, len(plan.microbatches)) is None
            assert _all_indices(plan) == list(range(12))


def test_a_fixed_cp_that_is_no_power_of_two_still_packs():
    # Fixed CP needs only to divide the DP x CP ranks (the power-of-two rule is dynamic CP's).
    case = make_case(world=3, parallel={"cp": 3}, train={"global_batch": 6, "seq_length": 60})
    plan = plan_step(case, 1)
    assert all(g.size == 3 for mb in plan.microbatches for g in mb.groups)


def test_static_shapes_cap_sequences_per_group_and_count_padded_tokens():
    from harness.spec.schema import ShapesSpec
    from harness.workload.packing import padded_length

    def static(case, most):
        train = case.train.model_copy(update={"max_seqs_per_microbatch": most})
        return case.model_copy(update={"shapes": ShapesSpec(scope="attn"), "train": train})

    fixed = static(make_case(world=2, parallel={"cp": 2},
                             train={"global_batch": 16, "seq_length": 64},
                             data={"lengths": {"distribution": "uniform", "min": 3, "max": 13}}), 2)
    dyn = static(make_case(world=2, parallel={"dynamic_cp": [1, 2]},
                           train={"global_batch": 16, "seq_length": 64, "max_seqlen_per_rank": 32},
                           data={"lengths": {"distribution": "uniform", "min": 3, "max": 60}}), 2)
    for case in (fixed, dyn):
        for step in (1, 2, 3):
            plan = plan_step(case, step)
            assert plan.sequences == 16
            for mb in plan.microbatches:
                for g in mb.groups:
                    assert len(g.sequences) <= 2
                    assert sum(padded_length(s.length, g.size) for s in g.sequences) <= \
                        g.size * case.layout.tokens_per_rank


def test_the_packing_check_counts_capacity_as_the_packer_does():
    """What the packer records (each group's sequence lengths) passes ``compare.packing_check``,
    which pads them with the packer's own rule (``spec.layout.padded_length``), on dynamic CP,
    fixed CP and static shapes alike: one padding rule for both."""
    from harness.compare import packing_check, packing_rule
    from harness.results import StepRecord
    from harness.spec.schema import ShapesSpec

    def static(case):
        train = case.train.model_copy(update={"max_seqs_per_microbatch": 4})
        return case.model_copy(update={"shapes": ShapesSpec(scope="attn"), "train": train})

    lognormal = {"lengths": {"distribution": "lognormal", "min": 3, "max": 64}}
    dyn = make_case(world=2, parallel={"dynamic_cp": [1, 2]}, data=lognormal,
                    train={"global_batch": 16, "seq_length": 64, "max_seqlen_per_rank": 32})
    fixed = make_case(world=2, parallel={"cp": 2}, data=lognormal,
                      train={"global_batch": 16, "seq_length": 64})
    for case in map(eager_arm, (dyn, fixed, static(dyn), static(fixed))):
        plans = [plan_step(case, step) for step in range(1, 7)]
        for p in plans:
            for mb, packed in zip(p.microbatches, p.packed()):
                for g, rec in zip(mb.groups, packed.groups):
                    assert rec.lengths == tuple(s.length for s in g.sequences)
        records = {0: [StepRecord(step=p.step, loss=1.0, grad_norm=1.0, packed=p.packed(),
                                  microbatches=len(p.microbatches), tokens=p.total_tokens)
                       for p in plans]}
        check = packing_check(case.arm, records, packing_rule(case))
        assert check.passed, check.detail
        assert ("padded" if case.layout.dynamic or case.static_shapes else "real") in check.detail
