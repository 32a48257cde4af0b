"""``<arm>.packing``: an arm's recorded microbatches against what its case asks for (hand-made
records; no training)."""

from __future__ import annotations

import pytest

from harness.compare import PackingRule, evaluate_case, packing_check, packing_rule
from harness.results import PackedGroup, PackedMicrobatch, StepRecord
from harness.spec.layout import ParallelLayout

from tests.test_compare import OK

PP2 = ParallelLayout(nodes=1, gpus_per_node=2, seq_length=64, global_batch=6, pp=2, vpp=1)


def mb(*groups: tuple[int, ...], cp: int = 1, tokens: int = 10) -> PackedMicrobatch:
    return PackedMicrobatch(tuple(PackedGroup(cp, g, tokens * len(g)) for g in groups))


def records(steps: list[tuple[PackedMicrobatch, ...]], ranks: int = 2) -> dict[int, list[StepRecord]]:
    return {r: [StepRecord(step=i + 1, loss=2.0, grad_norm=1.0, microbatches=len(p), packed=p,
                           tokens=sum(m.tokens for m in p))
                for i, p in enumerate(steps)] for r in range(ranks)}


THREE = (mb((0, 1)), mb((2, 3)), mb((4, 5)))


def test_an_arm_packing_what_its_case_asks_passes_saying_what_that_is() -> None:
    c = packing_check("fixed-cp2", records([THREE, THREE]), PackingRule(PP2, microbatches=3))
    assert c.passed and c.value == 0
    assert c.detail == ("2 steps of 3 microbatches as the case asks (train.microbatches 3, every "
                        "sequence once, 1 bin(s) of train.seq_length 64 real tokens at CP1)")


def test_a_count_other_than_train_microbatches_fails_naming_the_steps_and_counts() -> None:
    four = (mb((0, 1)), mb((2,)), mb((3,)), mb((4, 5)))
    c = packing_check("fixed-cp2", records([THREE, four, four]), PackingRule(PP2, microbatches=3))
    assert not c.passed and c.value == 2
    assert "2 of 3 steps do not pack as the case asks" in c.detail
    assert "step 2: 4 microbatches where train.microbatches asks for 3" in c.detail
    assert "step 3: 4 microbatches where train.microbatches asks for 3" in c.detail


@pytest.mark.parametrize("step, problem", [
    ((mb((0, 1)), mb((2, 3)), mb((4,))), "sequence(s) 5 of the 6 in no microbatch"),
    ((mb((0, 1)), mb((2, 3)), mb((3, 4, 5))), "sequence(s) 3 in more than one microbatch"),
    ((mb((0, 1)), mb((2, 3, 4, 5), tokens=20)),
     "microbatch 1: a CP1 group of 80 tokens, above train.seq_length 64"),
    ((mb((0, 1, 2, 3, 4, 5)), mb(())), "microbatch 1: a CP1 group without a sequence"),
    ((mb((0, 1, 2), (3, 4, 5)),), "microbatch 0: its CP groups cover 2 of the 1 DP x CP ranks"),
    ((mb((0, 1, 2), cp=2), mb((3, 4, 5), cp=2)), "a CP2 group; the layout runs CP 1"),
])
def test_the_packers_rule_is_checked_where_train_microbatches_is_not_set(step, problem) -> None:
    c = packing_check("eager", records([step]), packing_rule_free())
    assert not c.passed and problem in c.detail, c.detail


def packing_rule_free() -> PackingRule:
    return PackingRule(ParallelLayout(nodes=1, gpus_per_node=1, seq_length=64, global_batch=6))


def test_a_count_the_schedule_cannot_run_fails() -> None:
    vpp = ParallelLayout(nodes=1, gpus_per_node=2, seq_length=64, global_batch=6, pp=2, vpp=2)
    five = (mb((0,)), mb((1,)), mb((2,)), mb((3,)), mb((4, 5)))
    c = packing_check("eager", records([five]), PackingRule(vpp))
    assert not c.passed and "5 microbatches, which the schedule cannot run" in c.detail


def test_ranks_that_packed_differently_fail() -> None:
    data = records([THREE])
    data[1] = [StepRecord(step=1, loss=2.0, grad_norm=1.0, microbatches=3, tokens=60,
                          packed=(mb((0, 2)), mb((1, 3)), mb((4, 5))))]
    c = packing_check("eager", data, PackingRule(PP2))
    assert not c.passed and "step 1: rank 1 packed other microbatches than rank 0" in c.detail


def test_static_shapes_cap_the_sequences_of_a_group() -> None:
    c = packing_check("eager", records([THREE]), PackingRule(PP2, max_seqs=1))
    assert not c.passed
    assert "2 sequences in a CP group, above train.max_seqs_per_microbatch 1" in c.detail


DCP = ParallelLayout(nodes=1, gpus_per_node=2, seq_length=64, global_batch=3,
                     cp_sizes=(1, 2), dynamic=True, max_seqlen_per_rank=32)
DCP_TWO = ParallelLayout(nodes=1, gpus_per_node=2, seq_length=64, global_batch=2,
                         cp_sizes=(1, 2), dynamic=True, max_seqlen_per_rank=32)  # 2 sequences


def group(cp: int, lengths: dict[int, int], recorded: bool = True) -> PackedGroup:
    """A CP group of the sequences ``lengths`` (index -> length), with or without the lengths."""
    return PackedGroup(cp, tuple(lengths), sum(lengths.values()),
                       tuple(lengths.values()) if recorded else ())


def test_dynamic_cp_groups_are_bounded_by_cp_times_max_seqlen_per_rank() -> None:
    ok = (PackedMicrobatch((group(2, {0: 60}),)),
          PackedMicrobatch((group(1, {1: 30}), group(1, {2: 20}))))
    assert packing_check("dcp", records([ok]), PackingRule(DCP)).passed
    over = (PackedMicrobatch((group(1, {0: 60}), group(1, {1: 10, 2: 10}))),)
    c = packing_check("dcp", records([over]), PackingRule(DCP))
    assert not c.passed and "a CP1 group of 60 tokens, 60 padded to multiples of 1, above cp x " \
                           "max_seqlen_per_rank = 32" in c.detail


def test_capacity_counts_padded_tokens_as_the_packer_does() -> None:
    # 57 + 5 = 62 real tokens fit CP2 x 32 = 64, but padded to multiples of 4 they are 60 + 8 =
    # 68: the packer never builds this group (it counts padded tokens), so the check fails it.
    spill = (PackedMicrobatch((group(2, {0: 57, 1: 5}),)),)
    c = packing_check("dcp", records([spill]), PackingRule(DCP_TWO))
    assert not c.passed and ("a CP2 group of 62 tokens, 68 padded to multiples of 4, above cp x "
                             "max_seqlen_per_rank = 64") in c.detail
    snug = (PackedMicrobatch((group(2, {0: 58, 1: 2}),)),)  # 60 + 4 = 64 padded: fits
    assert packing_check("dcp", records([snug]), PackingRule(DCP_TWO)).passed
    # A fixed-CP eager bin counts real tokens (its packer does); a static one padded tokens.
    fixed = ParallelLayout(nodes=1, gpus_per_node=2, seq_length=64, global_batch=2, cp_sizes=(2,))
    assert packing_check("fixed-cp2", records([spill]), PackingRule(fixed)).passed
    c = packing_check("fixed-cp2", records([spill]), PackingRule(fixed, static=True))
    assert not c.passed and "68 padded to multiples of 4, above train.seq_length 64" in c.detail


def test_records_without_lengths_pass_or_fail_only_where_their_tokens_settle_it() -> None:
    fits = (PackedMicrobatch((group(2, {0: 30, 1: 20}, recorded=False),)),)  # <= 50 + 2 x 3
    assert packing_check("dcp", records([fits]), PackingRule(DCP_TWO)).passed
    unsure = (PackedMicrobatch((group(2, {0: 57, 1: 5}, recorded=False),)),)
    c = packing_check("dcp", records([unsure]), PackingRule(DCP_TWO))
    assert not c.passed and "up to 68 padded" in c.detail and "re-run the arm" in c.detail
    bad = (PackedMicrobatch((group(2, {0: 60, 1: 5}, recorded=False),)),)
    c = packing_check("dcp", records([bad]), PackingRule(DCP_TWO))
    assert not c.passed and "a CP2 group of 65 tokens, above cp x max_seqlen_per_rank = 64" in c.detail


def test_lengths_that_do_not_add_up_to_the_groups_tokens_fail() -> None:
    wrong = (PackedMicrobatch((PackedGroup(2, (0, 1), 40, (30, 20)),)),)
    c = packing_check("dcp", records([wrong]), PackingRule(DCP_TWO))
    assert not c.passed and "lists 2 sequence lengths adding up to 50" in c.detail


def test_records_without_microbatches_make_it_not_applicable() -> None:
    old = {0: [StepRecord(step=1, loss=2.0, grad_norm=1.0)]}
    c = packing_check("eager", old, PackingRule(PP2))
    assert not c.applicable and "written before dcp-harness recorded them" in c.detail


def test_evaluate_case_adds_the_check_to_every_entry_of_the_arm() -> None:
    from harness.compare import Pair

    pair = Pair("repeat", "repeat", ("eager", "eager-repeat"), {})
    four = (mb((0, 1)), mb((2,)), mb((3,)), mb((4, 5)))
    v = evaluate_case("c", [pair], {"eager": (OK, records([THREE], 1)),
                                    "eager-repeat": (OK, records([four], 1))},
                      expected_steps=1, expected_ranks=1,
                      packing={"eager": PackingRule(PP2, 3), "eager-repeat": PackingRule(PP2, 3)})
    assert v.status == "fail"
    assert [c.name for c in v.pairs[0].failed_checks] == ["eager-repeat.packing"]
    assert "eager.packing" in [c.name for c in v.pairs[0].checks]


def test_the_rule_of_an_arm_case_follows_its_layout(tmp_path) -> None:
    from harness.arms import plan_case
    from harness.spec.loader import load_cases

    path = tmp_path / "c.yaml"
    path.write_text("name: c\nmodel: {preset: tiny, layers: 4}\n"
                    "parallel: {pp: 2, vpp: 2, dynamic_cp: [1, 2]}\n"
                    "train: {steps: 2, global_batch: 8, seq_length: 64, max_seqlen_per_rank: 32,"
                    " microbatches: 4, lr: 1.0e-3}\n"
                    "data: {lengths: {min: 8, max: 64}}\n"
                    "compare: {dcp_vs_fixed_cp: {fixed_cp: 2}, reference: {}}\n"
                    "resources: {gpus_per_node: 4}\n")
    plan = plan_case(load_cases([path])[0])
    rules = plan.packing_rules
    assert rules["dcp"].microbatches is None  # dynamic CP derives its count
    assert rules["fixed-cp2"].microbatches == 4 and rules["reference"].microbatches == 4
    assert rules["reference"] == packing_rule(plan.arm("reference").case)
