"""harness.memplan.cachesim and .kernels: the caching allocator's rules and the kernels' own
buffers, each against what PyTorch's sources say and what an H200 measured (bench/RESULTS-log.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.memplan.cachesim import PoolSim, round_size, segment_size
from harness.memplan.kernels import ReduceShape, flash_varlen_bwd_scratch, reduce_scratch

MIB = 2**20
DATA = Path(__file__).parent / "data"


def test_requests_round_to_512_bytes_and_map_the_allocator_s_segments() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(512) == 2 * MIB  # small pool
    assert segment_size(MIB) == 2 * MIB
    assert segment_size(MIB + 512) == 20 * MIB  # under 10 MiB: kLargeBuffer
    assert segment_size(10 * MIB) == 10 * MIB  # from 10 MiB: rounded to 2 MiB
    assert segment_size(31 * MIB) == 32 * MIB


def test_best_fit_splits_only_a_rest_worth_keeping_and_frees_merge() -> None:
    sim = PoolSim()
    sim.alloc("a", 3 * MIB)  # a 20 MiB segment, split: 17 MiB left
    sim.alloc("b", 16 * MIB)  # fits the rest (17 MiB), whose last 1 MiB is not split off
    assert sim.segments == [20 * MIB]
    sim.alloc("c", 2 * MIB)  # nothing free large enough: a new 20 MiB segment
    assert sim.segments == [20 * MIB, 20 * MIB]
    sim.free("a")
    sim.free("b")  # merges with a: the whole first segment free again
    sim.alloc("d", 19 * MIB)
    assert sim.reserved == 40 * MIB
    sim.alloc("e", 512)  # small requests never come from the large pool
    assert sim.segments[-1] == 2 * MIB and sim.reserved == 42 * MIB
    with pytest.raises(KeyError):
        sim.alloc("e", 512)


@pytest.mark.parametrize("name", ["pool_trace_gpu1_qwen3_attn", "pool_trace_gpu1_emulated_fixed_cp2_r3"])
def test_the_measured_capture_requests_give_the_measured_segments(name: str) -> None:
    # what one H200 recorded (torch.cuda.memory._record_memory_history around capture_plan):
    # replayed through the simulator, the capture's own requests map exactly the pool's segments
    doc = json.loads(gzip.open(DATA / f"{name}.json.gz", "rt").read())
    sim = PoolSim()
    for kind, addr, size in doc["events"]:
        if kind == "a":
            sim.alloc(addr, size)
        elif addr in sim._live:  # frees of blocks allocated before the recording started
            sim.free(addr)
    assert sorted(sim.segments, reverse=True) == doc["segments"]


def test_flash_varlen_backward_scratch_is_what_an_h200_allocated() -> None:
    # gpu1-qwen3-graphs' attention (4096 tokens, 32 heads, head dim 128, 16 + 1 sequences,
    # K/V repeated to 32 heads on torch 2.11), deterministic: softmax_d 802,816 bytes and
    # dq_accum 102,760,448 (one split on 132 SMs), measured by bench/pool_snapshot.py
    assert flash_varlen_bwd_scratch(4096, 4096, 32, 32, 128, 17, 2, True) == (802_816, 102_760_448)
    # fewer K/V heads handed to the kernel: dK / dV expanded to the query heads, in bf16
    assert flash_varlen_bwd_scratch(4096, 8192, 32, 4, 128, 17, 2, True)[2:] == (8192 * 32 * 128 * 2,) * 2
    # more splits when batch x heads leaves SMs idle
    assert flash_varlen_bwd_scratch(1024, 1024, 4, 4, 128, 2, 2, True)[1] == 17 * (1024 + 256) * 4 * 128 * 4


def test_a_reduction_across_thread_blocks_stages_what_an_h200_allocated() -> None:
    # the RMSNorm weight gradients of the attention block: sum over tokens and heads of an fp32
    # [4096, 32, 128] (q) and [4096, 4, 128] (k): 128 MiB and 16 MiB staging, as measured
    assert reduce_scratch(ReduceShape(128, 4096 * 32, False, 128))[0] == 128 * MIB
    assert reduce_scratch(ReduceShape(128, 4096 * 4, False, 128))[0] == 16 * MIB
    # a row-wise mean (RMSNorm's, over the last dimension) has many outputs: no staging
    assert reduce_scratch(ReduceShape(4096 * 32, 128, True)) == ()
