"""Megatron's estimate, re-derived: ``report_theoretical_memory`` of Megatron-LM's
``megatron/training/theoretical_memory_usage.py`` (weights and optimizer state plus activations
of the most loaded pipeline stage, from the arguments alone), written again here for the shapes a
case file gives, so that it sits beside our prediction for every case.

The parts of Megatron's formula that apply to these cases (no tensor or sequence parallelism, no
MLA, no MTP, RMSNorm, SwiGLU experts, untied embeddings, every layer MoE, micro batch size 1):

* parameters of a layer: attention ``2 h^2 (1 + g/a) (q/h)`` (``q = a * d`` the query projection
  size, ``g`` the KV heads) plus ``2 h (1.5 E_local F + 1)`` for the experts and the norms;
  experts are counted per expert-parallel rank (``E / ep``), as on the most loaded rank;
* the most loaded shard holds ``L / pp`` layers and the embedding (``h V``); bytes per parameter
  18 without the distributed optimizer (our optimizer is not distributed);
* activations, "without sequence parallelism": ``s b h (10 + 24 / tp)`` per layer times ``L``
  (``L / pp`` layers times ``pp`` microbatches in flight on the first stage), the embedding's
  ``8 s b pp + s b h pp``, times the interleaved schedule's ``1 + (pp - 1) / (pp vpp)``, plus the
  logits when ``pp == 1``, times 1.05.

It reads no CP size, no CUDA-graph pool and no dtype: it is the same for every CP variant.
"""

from __future__ import annotations

from harness.memplan.records import MegatronEstimate


def megatron_estimate(*, hidden: int, heads: int, kv_heads: int, head_dim: int, layers: int,
                      experts: int, moe_ffn: int, vocab: int, seq_length: int, pp: int, vpp: int,
                      ep: int, microbatches: int | None = None, micro_batch: int = 1,
                      tp: int = 1) -> MegatronEstimate:
    """Megatron's theoretical bytes of the most loaded rank (see the module docstring)."""
    h, s, b = hidden, seq_length, micro_batch
    query = heads * head_dim
    attn = 2 * h * h * ((1 + kv_heads / heads) * (query / h))
    moe_layer = 2 * h * (moe_ffn * (experts // ep) * 1.5 + 1) + attn
    block = moe_layer * layers + h  # + the final norm
    embedding = h * vocab
    most_loaded = (block / pp + embedding) / tp
    if pp == 1:
        most_loaded += embedding / tp  # the untied output layer on the same rank
    weights_and_optimizer = most_loaded * 18

    act = s * b * h * (10 + 24 / tp) * layers
    act += 8 * s * b * pp + s * b * h * pp
    if vpp > 1:
        act *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1 and microbatches is not None:
        act *= min(1, microbatches / pp)
    if pp == 1:
        act += (s * b * vocab / tp + s * b * h) * 2
    act *= 1.05
    return MegatronEstimate(int(weights_and_optimizer), int(act))
