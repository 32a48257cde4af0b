"""The memory plan's records (frozen, pure): what ``plan --memory`` prints, ``plan --json`` and
``validate`` carry, preflight compares with the device and arms store beside what they measure."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

MIB = 2**20


@dataclass(frozen=True)
class MemoryTarget:
    """What the prediction assumes of the machine the case runs on.

    ``varlen_native_gqa``: the target torch's flash varlen takes fewer K/V heads (torch >= 2.12);
    None: what this process's torch does. Older torch repeats K/V to the query heads, which the
    attention block then saves (about a third more per CP2 frame on Qwen3-30B-A3B shapes).
    ``device_bytes``: the device's memory (a profile's ``gpu_memory_gib``), None when unknown."""

    varlen_native_gqa: Optional[bool] = None
    device_bytes: Optional[int] = None


@dataclass(frozen=True)
class VariantMemory:
    """One CP size of one PP rank: one graphed block's forward as capture keeps it, and the
    arenas a plan of this CP size alone (one pool per CP size) would carve."""

    cp_size: int
    block_saved_bytes: int  # native saved tensors of one block forward (arena components)
    block_output_bytes: int  # its outputs
    frame_bytes: int  # one arena frame: static inputs + components, aligned
    arena_bytes: int  # this CP size's plan alone: the backing allocation
    pool_bytes: int  # its graph pool: backing + graph transients, in segments
    transient_bytes: int  # the largest transient of one block's forward or backward graph
    eager_layer_bytes: int  # what an eager layer-microbatch keeps for its backward (attn + MoE)


@dataclass(frozen=True)
class MegatronEstimate:
    """``report_theoretical_memory`` of Megatron-LM, re-derived (:mod:`.megatron`)."""

    weights_and_optimizer_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_and_optimizer_bytes + self.activation_bytes


@dataclass(frozen=True)
class RankMemory:
    """One PP rank of a case (every DP/CP/EP rank of a stage holds the same bytes)."""

    pp_rank: int
    ranks: tuple[int, ...]  # the global ranks of this stage
    params: int  # parameters on the rank
    weight_bytes: int  # fp32 master weights (the model trains in fp32 under autocast)
    grad_bytes: int  # fp32 gradients (kept for the whole arm: fused wgrad accumulation)
    optimizer_bytes: int  # Adam's two fp32 moments
    variants: tuple[VariantMemory, ...]  # ascending CP size
    arena_bytes: int  # the slot-shared plan over every CP size: one backing
    pool_shared_bytes: int  # one MemPool for every CP size (what the graph arm holds)
    pool_separate_bytes: int  # one pool per CP size (the sum baseline)
    in_flight: int  # the most layer-microbatches held for their backward at once
    step_transient_bytes: int  # what the optimizer step adds for a moment (grad norm, DP bucket)
    eager_peak_bytes: int  # eager arm: static + in-flight eager layers + last-stage logits
    graph_peak_bytes: int  # graph arm: static + pool + in-flight eager MoE parts
    megatron: MegatronEstimate

    @property
    def static_bytes(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        """The expected peak allocated of the rank: the larger of its eager and graph arms."""
        return max(self.eager_peak_bytes, self.graph_peak_bytes)

    def parts(self) -> dict[str, int]:
        """The predicted peak by part (what preflight prints when it refuses)."""
        graph = self.graph_peak_bytes >= self.eager_peak_bytes
        rest = self.peak_bytes - self.static_bytes - (self.pool_shared_bytes if graph else 0)
        out = {"weights": self.weight_bytes, "gradients": self.grad_bytes,
               "optimizer state": self.optimizer_bytes}
        if graph:
            out["graph pool"] = self.pool_shared_bytes
        step = rest == self.step_transient_bytes
        out["optimizer step transient" if step else "activations in flight"] = rest
        return out

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["variants"] = [asdict(v) for v in self.variants]
        out["megatron"] = {**asdict(self.megatron), "total_bytes": self.megatron.total_bytes}
        out["peak_bytes"] = self.peak_bytes
        out["static_bytes"] = self.static_bytes
        return out


@dataclass(frozen=True)
class CaseMemory:
    """The memory plan of one case: a record per PP rank, and what it assumed."""

    case: str
    target: MemoryTarget
    ranks: tuple[RankMemory, ...]  # by PP rank
    seconds: float  # how long the prediction took (CPU)

    def of_rank(self, rank: int) -> RankMemory:
        for r in self.ranks:
            if rank in r.ranks:
                return r
        raise KeyError(f"rank {rank} is not in the layout of {self.case}")

    @property
    def peak_bytes(self) -> int:
        return max(r.peak_bytes for r in self.ranks)

    def fits(self) -> bool:
        return self.target.device_bytes is None or self.peak_bytes <= self.target.device_bytes

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "target": asdict(self.target), "seconds": round(self.seconds, 3),
                "peak_bytes": self.peak_bytes, "ranks": [r.to_json() for r in self.ranks]}
