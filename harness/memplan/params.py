"""Parameters per PP rank, counted on the workload's own model built on the meta device."""

from __future__ import annotations

import torch

from harness.spec.schema import Case
from harness.workload.model import ModelChunk, chunk_layouts


def rank_params(case: Case, pp_rank: int) -> int:
    """Parameters PP rank ``pp_rank`` of ``case`` trains (its chunks, its EP share of experts)."""
    lay = case.layout
    total = 0
    with torch.device("meta"):
        for i, cl in enumerate(chunk_layouts(case.model.layers, lay.pp, lay.vpp, pp_rank)):
            chunk = ModelChunk(case.model, cl.layers, cl.first, cl.last, lay.ep, 0, i)
            total += sum(p.numel() for p in chunk.parameters())
    return total
