"""CP balance measured: each CP rank's causal attention work (``attention.causal_work``) of the
load-balanced split (rank r holds chunks r and 2cp-1-r) is equal across the group, a correct but
contiguous split is not, and ``<arm>.cp_balance`` tells them apart from the records."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from harness.compare.arm_checks import cp_balance  # noqa: E402
from harness.results import AttentionWork, StepRecord  # noqa: E402
from harness.workload.attention import causal_work  # noqa: E402
from harness.workload.batch import shard_layout  # noqa: E402


def contiguous(lengths: list[int], cp: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position once, rank r holding the r-th contiguous slice: correct, unbalanced."""
    segs, poss = [], []
    for ordinal, n in enumerate(lengths):
        span = n // cp
        pos = torch.arange(r * span, (r + 1) * span)
        segs.append(torch.full_like(pos, ordinal))
        poss.append(pos)
    return torch.cat(segs), torch.cat(poss)


def records(works: dict[int, int], cp: int) -> dict[int, list[StepRecord]]:
    return {r: [StepRecord(step=1, attention_work=(AttentionWork(0, 0, cp, w),))]
            for r, w in works.items()}


def test_causal_work_counts_query_key_pairs() -> None:
    seg = torch.tensor([0, 0, 0, 1, 1, -1])
    pos = torch.tensor([0, 1, 2, 4, 5, 0])  # a 3-token prefix; positions 4, 5 of another; padding
    assert causal_work(seg, pos) == (1 + 2 + 3) + (5 + 6)


@pytest.mark.parametrize("cp", [2, 4])
def test_the_load_balanced_split_is_balanced_and_a_contiguous_one_fails(cp: int) -> None:
    lengths = [64, 32, 16 * cp]
    balanced = {r: causal_work(*shard_layout(lengths, cp, r)) for r in range(cp)}
    assert len(set(balanced.values())) == 1
    check = cp_balance("dcp", records(balanced, cp), 1.05)
    assert check.passed and check.value == 1.0
    skewed = {r: causal_work(*contiguous(lengths, cp, r)) for r in range(cp)}
    assert sum(skewed.values()) == sum(balanced.values())  # the same work, split otherwise
    bad = cp_balance("dcp", records(skewed, cp), 1.05)
    assert not bad.passed and bad.value > 1.4
    assert "puts the causal work out of balance" in bad.detail and f"CP{cp} group" in bad.detail


def test_no_cp_group_no_balance_to_judge() -> None:
    check = cp_balance("eager", records({0: 100}, 1), 1.05)
    assert not check.applicable
