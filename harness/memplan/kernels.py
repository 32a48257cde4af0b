"""What CUDA kernels allocate inside one op, which meta tensors do not show (pure).

A meta run sees every tensor an op returns, not the buffers the op's CUDA implementation takes
from the caching allocator for itself and frees before it returns. Inside a graph capture those
land in the graph's pool, so the plan adds them, each re-derived from PyTorch's sources (torch
2.11; bench/RESULTS-log.md has the measured check, issue 42):

* :func:`flash_varlen_bwd_scratch`: ``mha_varlen_bwd``
  (``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``) allocates, after dq / dk /
  dv, ``softmax_d`` (fp32 ``[heads, total_q + 128 * batch]``), ``dq_accum`` (fp32 ``[total_q + 128
  * batch, heads, head_dim rounded to 32]``, ``nsplits`` of them, zeroed, under deterministic
  algorithms: ``nsplits = ceil(SMs / (batch * heads))``) and, with fewer K/V heads than query heads
  (GQA handed to the kernel), ``dk_expanded`` / ``dv_expanded`` (``[total_k, heads, head_dim]`` in
  the input dtype) that it sums into dk / dv; all freed when it returns;
* :func:`reduce_scratch`: a CUDA reduction that splits its input across thread blocks
  (``aten/src/ATen/native/cuda/Reduce.cuh``, ``setReduceConfig`` / ``global_memory_size``) takes a
  staging buffer of ``4 * outputs * ctas_per_output`` bytes (times ``block.x * output_vec_size``
  when the reduced dimension is not the fastest) and one int semaphore per output block;
* :func:`grouped_mm_scratch`: ``torch._grouped_mm`` in bf16 on Hopper
  (``aten/src/ATen/native/cuda/GroupMM.cu``, ``bf16bf16_grouped_gemm_impl_sm90_sm100``) takes,
  after its output, the CUTLASS arguments (per group three pointers, the group count rounded up
  to 2, three 8-byte strides and a 12-byte ``<M, N, K>`` problem shape) and then CUTLASS's
  workspace (``Gemm::get_workspace_size``): no scheduler workspace (the persistent group
  scheduler, ``sm90_tile_scheduler_group.hpp``), the mainloop's A and B TMA descriptors per SM,
  the epilogue's D descriptor per epilogue warp group (2 under the ping-pong schedule that
  groups of at most 128 rows or columns take, else 1) and C's, 128 bytes each; both freed when it
  returns;
* :func:`cublas_workspace_bytes`: cuBLAS's workspace, allocated from the caching allocator per
  (handle, stream) at the first product of a graph (the capture clears the cached ones before
  each graph, ``harness.slotmem.allocator.clear_cublas_workspaces``), ``CUBLAS_WORKSPACE_CONFIG``
  ``:4096:8`` (what deterministic cases set) or Hopper's default: 32 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

SMS = 132  # H100 SXM / H200 streaming multiprocessors (torch.cuda.get_device_properties)
MAX_THREADS_PER_SM = 2048  # Hopper and Blackwell
CUBLAS_WORKSPACE = 4096 * 1024 * 8  # ":4096:8": 8 buffers of 4096 KiB


def cublas_workspace_bytes() -> int:
    return CUBLAS_WORKSPACE


def _up(a: int, b: int) -> int:
    return -(-a // b)


def flash_varlen_bwd_scratch(total_q: int, total_k: int, heads: int, heads_k: int, head_dim: int,
                             batch: int, dtype_bytes: int, deterministic: bool,
                             sms: int = SMS) -> tuple[int, ...]:
    """Bytes of the buffers ``mha_varlen_bwd`` allocates after its outputs, in order (module doc)."""
    rounded = _up(head_dim, 32) * 32 if head_dim <= 128 else _up(head_dim, 64) * 64
    rows = total_q + 128 * batch
    nsplits = _up(sms, batch * heads) if deterministic else 1
    out = [heads * rows * 4, nsplits * rows * heads * rounded * 4]
    if heads_k != heads:
        out += [total_k * heads * head_dim * dtype_bytes] * 2
    return tuple(out)


TMA_DESCRIPTOR = 128  # sizeof(cute::TmaDescriptor)


def grouped_mm_scratch(groups: int, m: int, n: int, sms: int = SMS) -> tuple[int, int]:
    """Bytes of the two buffers ``torch._grouped_mm`` (bf16, Hopper) allocates after its output,
    in order: the grouped GEMM's arguments, CUTLASS's workspace (module doc). ``m`` and ``n``: the
    rows and columns of one group's product as the dispatch sees them (a ragged dimension divided
    by ``groups``), which pick the ping-pong schedule when either is at most 128."""
    args = _up(groups, 2) * 2 * 3 * 8 + groups * 12 + 3 * groups * 8
    epilogue_groups = 2 if min(m, n) <= 128 else 1
    workspace = 2 * TMA_DESCRIPTOR * sms + (epilogue_groups + 1) * TMA_DESCRIPTOR * sms
    return args, workspace


@dataclass(frozen=True)
class ReduceShape:
    """A reduction as TensorIterator sees a contiguous input: ``outputs`` results of
    ``inputs_per_output`` values each; ``fastest_reduced``: the innermost dimension is reduced;
    ``out_inner``: the size of the innermost kept dimension (its vectorisation)."""

    outputs: int
    inputs_per_output: int
    fastest_reduced: bool
    out_inner: int = 1


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def reduce_scratch(r: ReduceShape, sms: int = SMS, acc_bytes: int = 4) -> tuple[int, ...]:
    """The global buffer and semaphores a reduction of ``r`` allocates (empty: none), following
    ``setReduceConfig`` for a sum/mean with 4 values per thread per load (``vt0 = 4``)."""
    dim0, dim1 = (r.inputs_per_output, r.outputs) if r.fastest_reduced else (r.outputs, r.inputs_per_output)
    vec = 1
    if r.fastest_reduced:
        if dim0 > 128:
            dim0 //= 4  # vectorize along input (kInputVecSize 4)
    else:
        vec = 4
        while r.out_inner % vec:
            vec //= 2
        dim0 //= vec  # vectorize along output
    max_threads = 512 // vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(d0, 32)
    height = min(d1, max_threads // width)
    width = min(d0, max_threads // height)
    threads = width * height
    step_in = step_out = 1
    x_reduce = r.fastest_reduced
    if x_reduce:
        step_in *= width
    else:
        step_out *= width
    vpt = _up(r.inputs_per_output, step_in)
    split_warps = vpt >= min(height * 16, 256)
    if split_warps:
        step_in *= height
    else:
        step_out *= height
    target = sms * (MAX_THREADS_PER_SM // threads)
    grid = _up(r.outputs // vec, step_out)
    vpt = _up(r.inputs_per_output, step_in)
    if not (split_warps and vpt >= 256 and grid <= target):
        return ()
    ctas = max(min(_up(target, grid), _up(vpt, 16)), _up(vpt, 256))
    if ctas <= 1:
        return ()
    size = acc_bytes * r.outputs * ctas
    if not x_reduce:
        size *= width * vec
    return (size, 4 * grid)
