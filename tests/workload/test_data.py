import torch

from harness.workload.data import RULE_PROB, sequence_lengths, sequence_tokens, successor_table

from tests.workload.factories import make_case


def test_lengths_depend_on_seed_and_step_not_layout():
    a = make_case(parallel={"pp": 2}, world=2)
    b = make_case(parallel={"cp": 2}, world=4)
    for step in (1, 2, 3):
        assert sequence_lengths(a.train, a.data, step) == sequence_lengths(b.train, b.data, step)
    assert sequence_lengths(a.train, a.data, 1) != sequence_lengths(a.train, a.data, 2)
    c = make_case(train={"seed": 8})
    assert sequence_lengths(a.train, a.data, 1) != sequence_lengths(c.train, c.data, 1)


def test_lengths_respect_bounds_and_distribution():
    case = make_case(
        train={"global_batch": 200, "seq_length": 100},
        data={"lengths": {"distribution": "lognormal", "min": 10, "max": 400}},
    )
    lengths = sequence_lengths(case.train, case.data, 1)
    assert len(lengths) == 200
    assert min(lengths) >= 10 and max(lengths) <= 100  # clipped to seq_length
    assert len(set(lengths)) > 20
    fixed = make_case(data={"lengths": {"distribution": "fixed", "min": 4, "max": 32}})
    assert set(sequence_lengths(fixed.train, fixed.data, 1)) == {32}


def test_tokens_follow_the_successor_rule():
    table = successor_table(7, 64)
    assert sorted(table.tolist()) == list(range(64))
    inp, tgt = sequence_tokens(7, 1, 3, 2000, 64, table)
    assert inp.shape == tgt.shape == (2000,)
    assert torch.equal(inp[1:], tgt[:-1])
    follow = (table[inp] == tgt).float().mean().item()
    assert abs(follow - (RULE_PROB + (1 - RULE_PROB) / 64)) < 0.03
    again, _ = sequence_tokens(7, 1, 3, 2000, 64, table)
    assert torch.equal(inp, again)
