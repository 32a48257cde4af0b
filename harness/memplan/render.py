"""The memory plan as text: one block per PP rank, MiB."""

from __future__ import annotations

from harness.memplan.records import MIB, CaseMemory, RankMemory


def _m(n: int) -> str:
    return f"{n / MIB:,.0f}"


def rank_text(r: RankMemory) -> list[str]:
    ranks = f"ranks {r.ranks[0]}..{r.ranks[-1]}" if len(r.ranks) > 1 else f"rank {r.ranks[0]}"
    lines = [f"  PP stage {r.pp_rank} ({ranks}): {r.params / 1e9:.3f}e9 parameters; weights {_m(r.weight_bytes)}, "
             f"gradients {_m(r.grad_bytes)}, optimizer state {_m(r.optimizer_bytes)} MiB"]
    for v in r.variants:
        lines.append(f"    CP{v.cp_size}: one block forward saves {_m(v.block_saved_bytes)} + outputs "
                     f"{_m(v.block_output_bytes)} MiB (frame {_m(v.frame_bytes)}); alone: arenas "
                     f"{_m(v.arena_bytes)}, pool {_m(v.pool_bytes)} MiB; eager layer-microbatch "
                     f"{_m(v.eager_layer_bytes)} MiB")
    if r.pool_shared_bytes:
        lines.append(f"    graph pool: shared {_m(r.pool_shared_bytes)} MiB (arenas {_m(r.arena_bytes)}), "
                     f"separate pools {_m(r.pool_separate_bytes)} MiB")
    lines.append(f"    expected peak {_m(r.peak_bytes)} MiB (eager arms {_m(r.eager_peak_bytes)}, graph arm "
                 f"{_m(r.graph_peak_bytes)}; {r.in_flight} layer-microbatches in flight); Megatron's "
                 f"estimate {_m(r.megatron.total_bytes)} MiB (weights and optimizer "
                 f"{_m(r.megatron.weights_and_optimizer_bytes)}, activations {_m(r.megatron.activation_bytes)})")
    return lines


def case_text(cm: CaseMemory) -> str:
    gqa = {None: "as this torch", True: "native", False: "repeated"}[cm.target.varlen_native_gqa]
    head = f"memory of {cm.case} (K/V heads to flash varlen: {gqa}; planned in {cm.seconds:.1f} s)"
    lines = [head]
    for r in cm.ranks:
        lines += rank_text(r)
    if cm.target.device_bytes is not None:
        verdict = "fits" if cm.fits() else "does NOT fit"
        lines.append(f"  largest expected peak {_m(cm.peak_bytes)} MiB {verdict} the device's "
                     f"{_m(cm.target.device_bytes)} MiB")
    return "\n".join(lines)
