"""Parameters per PP rank, counted on the workload's own model built on the meta device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec.schema import Case
from harness.workload.model import ModelChunk, chunk_layouts, is_expert_param


@dataclass(frozen=True)
class RankParams:
    """Parameter counts of one PP rank: all, the largest one tensor, the dense (not expert) ones."""

    total: int
    largest: int
    dense: int


def rank_params(case: Case, pp_rank: int) -> RankParams:
    """Parameters PP rank ``pp_rank`` of ``case`` trains (its chunks, its EP share of experts)."""
    lay = case.layout
    total = largest = dense = 0
    with torch.device("meta"):
        for i, cl in enumerate(chunk_layouts(case.model.layers, lay.pp, lay.vpp, pp_rank)):
            chunk = ModelChunk(case.model, cl.layers, cl.first, cl.last, lay.ep, 0, i)
            for name, p in chunk.named_parameters():
                total += p.numel()
                largest = max(largest, p.numel())
                dense += 0 if is_expert_param(name) else p.numel()
    return RankParams(total, largest, dense)
