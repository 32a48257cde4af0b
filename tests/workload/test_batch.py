
from harness.workload.batch import local_batch, shard_layout
from harness.workload.data import Sequence, successor_table
from harness.workload.packing import GroupWork, padded_length


def test_cp_rank_holds_chunks_r_and_2cp_minus_1_minus_r():
    seg, pos = shard_layout([16], 2, 0)
    assert pos.tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    seg, pos = shard_layout([16], 2, 1)
    assert pos.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert seg.tolist() == [0] * 8


def test_shards_cover_every_padded_position_once():
    lengths = [5, 16, 9]
    for cp in (1, 2, 4):
        got = {}
        for r in range(cp):
            seg, pos = shard_layout(lengths, cp, r)
            assert len(pos) == sum(padded_length(n, cp) for n in lengths) // cp
            for s, p in zip(seg.tolist(), pos.tolist()):
                got.setdefault(s, []).append(p)
        for s, n in enumerate(lengths):
            assert sorted(got[s]) == list(range(padded_length(n, cp)))


def test_local_batches_reassemble_the_sequences_and_mask_padding():
    table = successor_table(3, 50)
    group = GroupWork(0, 2, (Sequence(0, 7), Sequence(4, 12)))
    full = local_batch(GroupWork(0, 1, group.sequences), 0, 3, 1, 50, table)
    assert full.valid.all() and full.inputs.shape[0] == 19
    tokens = {}
    for r in range(2):
        b = local_batch(group, r, 3, 1, 50, table)
        assert b.unit_tokens == 19
        assert b.key_positions.shape[0] == 2 * b.inputs.shape[0]
        for i in range(b.inputs.shape[0]):
            key = (int(b.segments[i]), int(b.positions[i]))
            assert bool(b.valid[i]) == (key[1] < (7, 12)[key[0]])
            if b.valid[i]:
                tokens[key] = (int(b.inputs[i]), int(b.targets[i]))
    expect = {(int(full.segments[i]), int(full.positions[i])): (int(full.inputs[i]), int(full.targets[i]))
              for i in range(full.inputs.shape[0])}
    assert tokens == expect
