"""The oracle arm (``compare.oracle``): the one-rank training trained beside an implementation
no one here wrote, Hugging Face transformers' Qwen3-MoE with ``torch.optim.AdamW`` /
``torch.optim.Adam`` and ``torch.nn.utils.clip_grad_norm_``, on the same tokens and the same
packed-sequence boundaries, step by step.

Our side is the arm's own training step (``train._train_step``: the packer, the model's layers,
the loss, the gradient reduction, the grad norm, clipping and the optimizer step every arm runs).
The oracle side is ``Qwen3MoeForCausalLM`` built from a config mapped from the case's model
(:func:`hf_config`) with our initial weights copied in (:func:`copy_weights`); each packed
sequence runs through it alone (its positions from 0, attending only to itself: the boundaries
of our packed microbatch), the LM loss is the summed token cross entropy over the step's real
tokens divided by their count, as ours. Where the mapping cannot be exact:

* the aux loss: transformers' own ``load_balancing_loss_func`` concatenates every layer's router
  logits and does not divide by top-k, so it is another quantity. The oracle computes ours
  (Megatron's, per microbatch: ``E / (T^2 k) sum_e P_e n_e``, weighted by ``T / N``, averaged
  over layers) from the HF router's own logits (captured from each ``mlp.gate``) and trains with
  it, so the gradients compare; the aux check compares that definition, not HF's number;
* the optimizer's parameter groups and the learning rate: transformers' own rules, not ours.
  Which parameters decay is ``Trainer.get_decay_parameter_names`` (no biases, no norms); the
  schedule is ``transformers.optimization``'s warmup-then-constant / polynomial (power 1: linear)
  / cosine-with-min-lr schedule for the case's ``train.lr_schedule``, stepped after each optimizer
  step (Megatron's formula in other code: step s runs at the rate after s - 1 steps);
* rounding: HF runs each sequence as a batch of one, fused ``gate_up_proj`` expert GEMMs and its
  own attention and RoPE kernels, so the two sides agree to rounding, not bitwise (the bounds of
  ``compare.oracle`` are measured: bench/RESULTS-log.md).

Each step record of the arm carries an :class:`~harness.results.OracleStep`: the oracle's loss,
aux loss and grad norm, and the largest relative differences of the logits (before the step), the
gradients (after clipping) and the parameters (after the optimizer step). Without transformers
(``pip install 'dcp-harness[oracle]'``) the arm trains our side alone and says why on every
record (``OracleStep.unavailable``): the pair is then skipped (kind ``needs-package``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from harness.results import OracleStep, StepRecord
from harness.spec.schema import Case, LrDecay, OptimizerName, ResolvedModel
from harness.workload.batch import local_batch
from harness.workload.data import Table, sequence_tokens, successor_table
from harness.workload.model import ModelChunk
from harness.workload.packing import StepPlan, plan_step
from harness.workload.runtime import RankContext

MISSING = ("transformers is not installed: the oracle (Hugging Face Qwen3-MoE) cannot run; "
           "pip install 'dcp-harness[oracle]'")


def available() -> Optional[str]:
    """None when transformers can be imported, else why not (:data:`MISSING`)."""
    return None if importlib.util.find_spec("transformers") is not None else MISSING


def hf_config(m: ResolvedModel) -> Any:
    """The transformers ``Qwen3MoeConfig`` of our model: every layer MoE, top-k renormalised
    (``norm_topk_prob``), no shared expert, untied head, no dropout, default RoPE."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.moe_ffn,
        moe_intermediate_size=m.moe_ffn, num_hidden_layers=m.layers, num_attention_heads=m.heads,
        num_key_value_heads=m.kv_heads, head_dim=m.head_dim, num_experts=m.experts,
        num_experts_per_tok=m.experts_per_token, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=m.norm_eps, rope_theta=m.rope_theta,
        tie_word_embeddings=False, attention_dropout=0.0, attention_bias=False,
        router_aux_loss_coef=m.aux_loss_coeff, output_router_logits=False,
        max_position_embeddings=1 << 16, use_cache=False)


def pairs(chunk: ModelChunk, hf: Any) -> list[tuple[str, torch.Tensor, Callable[[], torch.Tensor]]]:
    """(name, our parameter, the HF tensor in our layout) for every parameter of our one-rank
    chunk: the mapping both the copy and the comparisons use. HF's experts are fused
    (``gate_up_proj`` ``[E, 2F, H]``, ``down_proj`` ``[E, H, F]``); ours are stacked ``[E, H, F]``
    / ``[E, F, H]``."""
    model = hf.model
    out: list[tuple[str, torch.Tensor, Callable[[], torch.Tensor]]] = [
        ("embed", chunk.embed.weight, lambda: model.embed_tokens.weight),
        ("final_norm", chunk.final_norm.weight, lambda: model.norm.weight),
        ("head", chunk.head.weight, lambda: hf.lm_head.weight),
    ]
    for i, (ours, theirs) in enumerate(zip(chunk.layers, model.layers)):
        a, b = ours.attn, theirs.self_attn
        ffn = ours.moe.experts.gate.shape[-1]
        ex = theirs.mlp.experts
        out += [
            (f"layers.{i}.input_norm", ours.input_norm.weight, lambda t=theirs: t.input_layernorm.weight),
            (f"layers.{i}.post_attn_norm", ours.post_attn_norm.weight,
             lambda t=theirs: t.post_attention_layernorm.weight),
            (f"layers.{i}.q_proj", a.q_proj.weight, lambda b=b: b.q_proj.weight),
            (f"layers.{i}.k_proj", a.k_proj.weight, lambda b=b: b.k_proj.weight),
            (f"layers.{i}.v_proj", a.v_proj.weight, lambda b=b: b.v_proj.weight),
            (f"layers.{i}.o_proj", a.o_proj.weight, lambda b=b: b.o_proj.weight),
            (f"layers.{i}.q_norm", a.q_norm.weight, lambda b=b: b.q_norm.weight),
            (f"layers.{i}.k_norm", a.k_norm.weight, lambda b=b: b.k_norm.weight),
            (f"layers.{i}.router", ours.moe.router.weight, lambda t=theirs: t.mlp.gate.weight),
            (f"layers.{i}.experts.gate", ours.moe.experts.gate,
             lambda ex=ex, f=ffn: ex.gate_up_proj[:, :f, :].transpose(1, 2)),
            (f"layers.{i}.experts.up", ours.moe.experts.up,
             lambda ex=ex, f=ffn: ex.gate_up_proj[:, f:, :].transpose(1, 2)),
            (f"layers.{i}.experts.down", ours.moe.experts.down,
             lambda ex=ex: ex.down_proj.transpose(1, 2)),
        ]
    return out


def copy_weights(chunk: ModelChunk, hf: Any) -> None:
    """Our initial weights into the HF model (through :func:`pairs`' views)."""
    with torch.no_grad():
        for _, ours, theirs in pairs(chunk, hf):
            theirs().copy_(ours.detach())


def _grad_view(hf: Any, theirs: Callable[[], torch.Tensor], name: str) -> torch.Tensor:
    """The HF gradient of a mapped tensor, in our layout."""
    ex_names = ("experts.gate", "experts.up", "experts.down")
    if not name.endswith(ex_names):
        tensor = theirs()
        return tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
    layer = hf.model.layers[int(name.split(".")[1])].mlp.experts
    ffn = layer.down_proj.shape[-1]
    fused = (layer.gate_up_proj.grad if layer.gate_up_proj.grad is not None
             else torch.zeros_like(layer.gate_up_proj))
    down = layer.down_proj.grad if layer.down_proj.grad is not None else torch.zeros_like(layer.down_proj)
    if name.endswith("experts.gate"):
        return fused[:, :ffn, :].transpose(1, 2)
    if name.endswith("experts.up"):
        return fused[:, ffn:, :].transpose(1, 2)
    return down.transpose(1, 2)


def _worst_rel(items: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The largest ``||a - b|| / ||b||`` over tensor pairs (``|a - b|`` where ``b`` is 0)."""
    worst = 0.0
    for a, b in items:
        diff = float((a.double() - b.double()).norm())
        ref = float(b.double().norm())
        worst = max(worst, diff / ref if ref > 0 else diff)
    return worst


class _Routers:
    """Forward hooks on every HF layer's router: its logits, per call, in layer order."""

    def __init__(self, hf: Any) -> None:
        self.logits: list[torch.Tensor] = []
        self.handles = [layer.mlp.gate.register_forward_hook(self._hook) for layer in hf.model.layers]

    def _hook(self, module: Any, args: Any, output: Any) -> None:
        self.logits.append(output[0])


def _our_logits(chunk: ModelChunk, inputs: Callable[[int], Any], count: int) -> list[torch.Tensor]:
    with torch.no_grad():
        return [chunk(mb.inputs, mb.ctx).float() for mb in (inputs(m) for m in range(count))]


def oracle_step(case: Case, plan: StepPlan, table: Table, chunk: ModelChunk, hf: Any,
                opt: "HfOptimizer", ours_logits: list[torch.Tensor],
                device: torch.device) -> tuple[float, float, float, float, float]:
    """One training step of the HF model on ``plan``'s sequences; returns (loss, aux loss, grad
    norm, logits max rel difference from ours, the step's learning rate)."""
    m, t = case.model, case.train
    n_step = plan.total_tokens
    e, k = m.experts, m.experts_per_token
    routers = _Routers(hf)
    opt.optimizer.zero_grad(set_to_none=True)
    loss_total = torch.zeros((), dtype=torch.float64, device=device)
    aux_total = 0.0
    logit_diff, logit_ref = 0.0, 0.0
    try:
        for mi, mb in enumerate(plan.microbatches):
            group = mb.group_of(0)
            b = local_batch(group, 0, t.seed, plan.step, m.vocab, table)
            ce = torch.zeros((), device=device)
            routers.logits.clear()
            per_seq_logits = []
            for j, s in enumerate(group.sequences):
                inp, tgt = sequence_tokens(t.seed, plan.step, s.index, s.length, m.vocab, table)
                out = hf(input_ids=inp.to(device)[None], use_cache=False)
                logits = out.logits[0].float()
                per_seq_logits.append(logits)
                ce = ce + F.cross_entropy(logits, tgt.to(device), reduction="sum")
                rows = (b.segments == j) & b.valid
                ours = ours_logits[mi][rows.to(ours_logits[mi].device)]
                theirs = logits.detach()[b.positions[rows].to(device)]
                logit_diff = max(logit_diff, float((ours.to(device) - theirs).abs().max()))
                logit_ref = max(logit_ref, float(theirs.abs().max()))
            unit = sum(s.length for s in group.sequences)
            layers = m.layers
            # routers.logits: per sequence, per layer (layer order within a sequence's forward)
            per_layer = [torch.cat([routers.logits[j * layers + li]
                                    for j in range(len(group.sequences))]) for li in range(layers)]
            aux_mb = torch.zeros((), device=device)
            for lg in per_layer:
                probs = torch.softmax(lg.float(), dim=-1)
                top = probs.topk(k, dim=-1).indices
                counts = F.one_hot(top, e).float().sum(dim=(0, 1))
                aux_mb = aux_mb + (probs.sum(dim=0) * counts).sum() * (e / (unit * unit * k))
            weight = unit / n_step
            aux_total += float(aux_mb.detach()) * weight / layers
            objective = ce / n_step + m.aux_loss_coeff * weight * aux_mb
            objective.backward()
            loss_total = loss_total + ce.detach().double() / n_step
    finally:
        for h in routers.handles:
            h.remove()
    clip = t.optimizer.grad_clip
    norm = float(torch.nn.utils.clip_grad_norm_(hf.parameters(), clip if clip is not None
                                                else math.inf))
    (lr,) = set(opt.scheduler.get_last_lr())
    if math.isfinite(norm):
        opt.optimizer.step()
    opt.scheduler.step()
    return (float(loss_total), aux_total, norm,
            (logit_diff / logit_ref if logit_ref else logit_diff), float(lr))


@dataclasses.dataclass(frozen=True)
class HfOptimizer:
    """The oracle's optimizer and its learning-rate scheduler (transformers' own)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any


def hf_optimizer(hf: Any, case: Case) -> HfOptimizer:
    """``torch.optim.AdamW`` (or ``Adam``) over the HF model in the two groups transformers'
    ``Trainer`` makes (``get_decay_parameter_names``: no bias, no norm decays), and the schedule
    ``transformers.optimization`` gives the case's ``train.lr_schedule``."""
    from transformers import optimization as hf_opt
    from transformers.trainer import Trainer

    t = case.train
    o, sched = t.optimizer, t.lr_schedule
    decay = set(Trainer.get_decay_parameter_names(None, hf))  # uses no Trainer state
    named = list(hf.named_parameters())
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": o.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    cls = torch.optim.AdamW if o.name is OptimizerName.ADAMW else torch.optim.Adam
    opt = cls([g for g in groups if g["params"]], lr=t.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    if sched.decay is LrDecay.COSINE:
        scheduler = hf_opt.get_cosine_with_min_lr_schedule_with_warmup(
            opt, sched.warmup_steps, t.steps, min_lr=sched.min_lr)
    elif sched.decay is LrDecay.LINEAR:
        scheduler = hf_opt.get_polynomial_decay_schedule_with_warmup(
            opt, sched.warmup_steps, t.steps, lr_end=sched.min_lr, power=1.0)
    else:
        scheduler = hf_opt.get_constant_schedule_with_warmup(opt, sched.warmup_steps)
    return HfOptimizer(opt, scheduler)


def train_oracle(case: Case, ctx: RankContext, on_step: Callable[[StepRecord], None],
                 step_fn: Callable[..., StepRecord], setup: Any, opt: torch.optim.Optimizer,
                 inputs_of: Callable[[StepPlan], Callable[[int], Any]], start: int, last: int
                 ) -> None:
    """Train steps ``start + 1 .. last`` of the one-rank arm with ``step_fn`` (our step) beside
    the HF oracle, recording each step with its :class:`OracleStep` (module doc)."""
    missing = available()
    table = successor_table(case.train.seed, case.model.vocab).tolist()
    (chunk,) = setup.chunks
    device = setup.device
    hf = opt_hf = None
    if missing is None:
        from transformers import Qwen3MoeForCausalLM

        hf = Qwen3MoeForCausalLM(hf_config(case.model)).to(device=device, dtype=torch.float32)
        hf.train()
        copy_weights(chunk, hf)
        opt_hf = hf_optimizer(hf, case)
    for step in range(start + 1, last + 1):
        plan = plan_step(case, step)
        ours_logits = _our_logits(chunk, inputs_of(plan), len(plan.microbatches)) if hf else []
        record = step_fn(step)
        if hf is None:
            on_step(dataclasses.replace(record, oracle=OracleStep(unavailable=missing)))
            continue
        loss, aux, norm, logits_rel, lr = oracle_step(case, plan, table, chunk, hf, opt_hf,
                                                  ours_logits, device)
        mapped = pairs(chunk, hf)
        grads = _worst_rel([(ours.grad if ours.grad is not None else torch.zeros_like(ours),
                             _grad_view(hf, theirs, name))
                            for name, ours, theirs in mapped])
        params = _worst_rel([(ours.detach(), theirs().detach()) for _, ours, theirs in mapped])
        on_step(dataclasses.replace(record, oracle=OracleStep(
            loss=loss, aux_loss=aux, grad_norm=norm, logits_rel=logits_rel, grads_rel=grads,
            params_rel=params, lr=lr)))
