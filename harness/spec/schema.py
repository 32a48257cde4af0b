"""The case-file schema (pydantic v2). Unknown keys are errors everywhere.

A YAML case file holds one :class:`CaseFile`. ``matrix:`` expansion and preset
resolution turn it into one or more :class:`Case` objects (see ``expand.py``),
which is what every other part of the harness consumes.
"""

from __future__ import annotations

import json
import types
from datetime import date
from enum import Enum
from typing import Any, Literal, Optional, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.spec.layout import ParallelLayout
# Upper bounds of sizes (le=): limits.py says why each is what it is.
from harness.spec.limits import limit
from harness.spec.names import EAGER, GRAPH

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


def _takes_numbers(annotation: Any) -> bool:
    """Whether a field holds numbers (int/float, possibly Optional or in a list) but no bools."""
    if get_origin(annotation) in (Union, types.UnionType, list, tuple):
        return any(_takes_numbers(a) for a in get_args(annotation) if a is not type(None))
    return annotation in (int, float)


def _has_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value)


class _Strict(BaseModel):
    # Unknown keys are errors; inf/nan are never valid settings (lr: .inf, max_abs: .nan).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML reads ``yes``/``on``/``true`` as booleans and pydantic would take them as 1:
        a number field given a boolean is an error instead."""
        if info.field_name is not None and _has_bool(value) and _takes_numbers(
            cls.model_fields[info.field_name].annotation
        ):
            raise ValueError(f"expected a number, got {json.dumps(value)} (YAML reads "
                             "yes/no/on/off/true/false as booleans)")
        return value


class Choice(str, Enum):
    """One of a closed set of names a case file spells out (``scope: attn``). Read from YAML and
    written to JSON as its name; downstream code receives this type and compares members
    (``scope is GraphScope.FULL``), never strings."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class OptimizerName(Choice):
    ADAM = "adam"
    ADAMW = "adamw"


class DType(Choice):
    FP32 = "fp32"
    BF16 = "bf16"


class LengthDistribution(Choice):
    LOGNORMAL = "lognormal"
    UNIFORM = "uniform"
    FIXED = "fixed"


class GraphScope(Choice):
    # The attention block (input norm, attention, residual) is graphed and the MoE block runs
    # eagerly between graphs.
    ATTN = "attn"
    # The whole layer (static MoE: grouped GEMM, ep == 1 only); consecutive layers' graphs chain.
    FULL = "full"


class Pools(Choice):
    SHARED = "shared"  # every CP variant in one MemPool (slot-shared)
    SEPARATE = "separate"  # one pool per CP size


class DeviceKind(Choice):
    ANY = "any"  # CPU processes (gloo) stand in for GPUs where GPUs are short
    CUDA = "cuda"  # one CUDA GPU per rank


# --------------------------------------------------------------------------- command
# The step-record fields a metrics source can fill (harness.metrics maps tags / log keys to them).
METRIC_FIELDS = ("loss", "aux_loss", "grad_norm", "lr", "step_time_s", "tokens", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "max_allocated_bytes", "skipped", "nan")
MetricField = Literal["loss", "aux_loss", "grad_norm", "lr", "step_time_s", "tokens",
                      "allocated_bytes", "reserved_bytes", "active_bytes", "max_allocated_bytes",
                      "skipped", "nan"]
# The arm roles a command case gives arguments for (``command.arms``): the arm kinds of
# ``harness.spec.names.ARM_KINDS`` and ``repeat`` (added for the second run of a repeat pair;
# tests/spec/test_names.py checks that the two agree).
CommandRole = Literal["eager", "dcp", "graph", "graph-separate-pools", "fixed-cp",
                      "graph-fixed-cp", "reference", "repeat"]


class MetricsSource(Choice):
    TENSORBOARD = "tensorboard"  # event files (TensorBoard's reader), Megatron's tags
    MEGATRON_LOG = "megatron_log"  # Megatron's iteration and memory lines
    JSONL = "jsonl"  # one step record per line
    RECORD = "record"  # harness.metrics.StepRecorder, into the arm's metrics/ folder


class RankStart(Choice):
    PER_RANK = "per_rank"  # one process per rank, RANK / LOCAL_RANK / WORLD_SIZE / MASTER_* set
    LAUNCHER = "launcher"  # one process per node (torchrun), started with NNODES / NODE_RANK set


class MetricsSpec(_Strict):
    """Where a command's metrics come from: ``path`` is relative to the arm's folder (defaults:
    ``tensorboard``, ``log.txt`` (the ranks' output), ``metrics/rank{rank}.jsonl``); ``tags``
    maps step-record fields to TensorBoard tags or Megatron log keys, over Megatron's."""

    source: MetricsSource
    path: Optional[str] = Field(default=None, min_length=1)
    tags: Optional[dict[MetricField, str]] = None


class CommandSpec(_Strict):
    """A training command run in place of the built-in workload (docs/command-cases.md).
    ``argv`` is a list (never a shell string); ``{arm_dir}``, ``{steps}``, ``{world_size}``,
    ``{seed}``, ``{case_dir}``, ``{fixed_cp}`` (fixed-CP arms) in ``argv``, ``env`` values and
    ``arms`` are replaced per arm; ``arms`` gives each arm role the arguments added to ``argv``;
    ``secret_env`` names variables passed from the harness's own environment, never written."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = {}
    secret_env: list[str] = []
    cwd: Optional[str] = None  # relative to the case file's folder (default: that folder)
    ranks: RankStart = RankStart.PER_RANK
    arms: dict[CommandRole, list[str]] = {}
    metrics: MetricsSpec

    @field_validator("argv", mode="before")
    @classmethod
    def _argv_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("argv is a list of arguments, never a shell string: write "
                             "[python, train.py, --steps, '{steps}']")
        return value


# --------------------------------------------------------------------------- model
class ModelSpec(_Strict):
    """Model shape: a preset plus optional overrides of any of its fields."""

    preset: str = "tiny"
    layers: Optional[int] = Field(default=None, ge=1, le=limit("model.layers"))
    hidden: Optional[int] = Field(default=None, ge=1, le=limit("model.hidden"))
    heads: Optional[int] = Field(default=None, ge=1, le=limit("model.heads"))
    kv_heads: Optional[int] = Field(default=None, ge=1, le=limit("model.kv_heads"))
    head_dim: Optional[int] = Field(default=None, ge=2, le=limit("model.head_dim"))
    experts: Optional[int] = Field(default=None, ge=1, le=limit("model.experts"))
    experts_per_token: Optional[int] = Field(default=None, ge=1,
                                             le=limit("model.experts_per_token"))
    moe_ffn: Optional[int] = Field(default=None, ge=1, le=limit("model.moe_ffn"))
    vocab: Optional[int] = Field(default=None, ge=2, le=limit("model.vocab"))
    rope_theta: Optional[float] = Field(default=None, gt=0)
    norm_eps: Optional[float] = Field(default=None, gt=0)
    # Megatron's moe_aux_loss_coeff; 0 turns the load-balancing loss off.
    aux_loss_coeff: float = Field(default=1e-2, ge=0)


class ModelPreset(_Strict):
    """Every shape field of a model (a named preset); a case's ``model:`` section may override
    any of them."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_per_token: int
    moe_ffn: int
    vocab: int
    rope_theta: float
    norm_eps: float


class ResolvedModel(ModelPreset):
    """A model with every field known (preset + overrides)."""

    preset: str
    aux_loss_coeff: float


# --------------------------------------------------------------------------- parallel
class ParallelSpec(_Strict):
    """Parallel degrees as written. DP is derived: world / (pp * cp) for fixed CP; with dynamic CP
    the world / pp ranks of a stage form one DP x CP pool that each microbatch carves into CP
    groups. The derived sizes and their rules: ``Case.layout`` (``harness.spec.layout``)."""

    pp: int = Field(default=1, ge=1, le=limit("parallel.pp"))
    vpp: int = Field(default=1, ge=1, le=limit("parallel.vpp"))
    ep: int = Field(default=1, ge=1, le=limit("parallel.ep"))
    cp: Optional[int] = Field(default=None, ge=1, le=limit("parallel.cp"))
    dynamic_cp: Optional[list[int]] = None
    # Megatron's microbatch_group_size_per_vp_stage; default = pp.
    microbatch_group: Optional[int] = Field(default=None, ge=1,
                                            le=limit("parallel.microbatch_group"))

    @field_validator("dynamic_cp")
    @classmethod
    def _sorted_unique(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is None:
            return v
        if not v:
            raise ValueError("dynamic_cp must list at least one CP size")
        if any(x < 1 for x in v):
            raise ValueError("dynamic_cp sizes must be >= 1")
        if len(set(v)) != len(v):
            raise ValueError(f"dynamic_cp has repeated sizes: {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _cp_xor_dynamic(self) -> "ParallelSpec":
        if self.cp is not None and self.dynamic_cp is not None:
            raise ValueError("give either cp (fixed CP) or dynamic_cp, not both")
        return self


# --------------------------------------------------------------------------- train / data
class OptimizerSpec(_Strict):
    name: OptimizerName = OptimizerName.ADAMW
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    # Global grad-norm clip; null turns clipping off.
    grad_clip: Optional[float] = Field(default=1.0, gt=0)


class TrainSpec(_Strict):
    steps: int = Field(ge=1, le=limit("train.steps"))
    # Sequences per optimizer step (the whole DP x CP world together).
    global_batch: int = Field(ge=1, le=limit("train.global_batch"))
    # Longest sequence the data may hold, and the packed-microbatch capacity per CP group
    # for fixed CP (tokens). Sequences are clipped to it.
    seq_length: int = Field(ge=2, le=limit("train.seq_length"))
    # Dynamic CP: tokens one rank may hold; CP size per sequence follows Megatron's rule.
    max_seqlen_per_rank: Optional[int] = Field(default=None, ge=1,
                                               le=limit("train.max_seqlen_per_rank"))
    # Microbatches per step per pipeline (fixed CP). None: derived from the packing.
    microbatches: Optional[int] = Field(default=None, ge=1, le=limit("train.microbatches"))
    lr: float = Field(gt=0)
    seed: int = 1234
    deterministic: bool = True
    dtype: DType = DType.FP32
    # Steps between resume checkpoints (model + optimizer state, rank-local, ~12 bytes per
    # parameter per rank); 0 = never. Every step (the default) lets a killed, re-run or requeued
    # arm resume right after its last completed step; large models should save less often and
    # re-run the steps since their last checkpoint (their records are not duplicated).
    checkpoint_every: int = Field(default=1, ge=0, le=limit("train.checkpoint_every"))
    # Most packed sequences one CP group holds in a microbatch (Megatron's max_num_seqs /
    # thd_max_packed_sequences): the capacity of the fixed-size sequence metadata buffers
    # (cu_seqlens) of a graph case. Enforced by the packer; required when `graphs:` is set.
    max_seqs_per_microbatch: Optional[int] = Field(default=None, ge=1)
    # Step after which every rank empties the allocator cache and records the whole-device,
    # allocated/active and reserved memory (the figures of dcp_vs_fixed_cp); None: the last step.
    memory_probe_step: Optional[int] = Field(default=None, ge=1)
    optimizer: OptimizerSpec = OptimizerSpec()


class LengthSpec(_Strict):
    distribution: LengthDistribution = LengthDistribution.LOGNORMAL
    min: int = Field(default=16, ge=1, le=limit("data.lengths.min"))
    max: int = Field(default=256, ge=1, le=limit("data.lengths.max"))
    # lognormal: median length (default: geometric mean of min and max) and log-space sigma.
    median: Optional[float] = Field(default=None, gt=0)
    sigma: float = Field(default=0.75, gt=0)

    @model_validator(mode="after")
    def _min_le_max(self) -> "LengthSpec":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        return self


class DataSpec(_Strict):
    lengths: LengthSpec = LengthSpec()


# --------------------------------------------------------------------------- compare
class Tolerance(_Strict):
    max_abs: Optional[float] = Field(default=None, ge=0)
    max_rel: Optional[float] = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _some_bound(self) -> "Tolerance":
        if self.max_abs is None and self.max_rel is None:
            raise ValueError("give max_abs, max_rel or both")
        return self


LossBound = Union[Literal["exact"], Tolerance]


class RepeatContract(_Strict):
    """Run the same arm twice with the same seed; deterministic runs must match bitwise."""

    arm: str = EAGER
    loss: LossBound = "exact"


class GraphVsEagerContract(_Strict):
    """The ``graph`` arm against the eager arm of the same (static-shape) case: LM loss, aux loss
    and grad norm per step; ``exact`` = bitwise (deterministic mode)."""

    loss: LossBound = "exact"
    # Bounds of the aux loss and grad norm; None: the loss bound.
    aux_loss: Optional[LossBound] = None
    grad_norm: Optional[LossBound] = None


class DcpVsFixedCpContract(_Strict):
    """The dynamic-CP arm against the same data at one fixed CP size: LM loss, aux loss and grad
    norm per step, and memory deltas. Dynamic CP regroups tokens into other microbatches, which
    changes the per-microbatch aux loss (and through its gradient every later step) legitimately;
    the default bounds are the measured clean differences of the focused cases with a margin
    (docs/internals.md, "Measured noise")."""

    fixed_cp: int = Field(ge=1)
    loss: LossBound = Tolerance(max_rel=1e-3)
    aux_loss: LossBound = Tolerance(max_rel=0.03)
    grad_norm: LossBound = Tolerance(max_rel=2e-4)
    # Memory deltas (CUDA only), per rank, measured after train.memory_probe_step and
    # torch.cuda.empty_cache(), one-sided (DCP arm minus fixed-CP arm): whole-device used memory
    # in percent of the device's memory (None: +0.10 between graph arms, TE PR #3353's figure;
    # between eager arms a figure, reported, not checked),
    device_delta_pct: Optional[float] = Field(default=None, ge=0)
    # allocated (active) bytes and reserved bytes in percent of the fixed-CP arm's figure (None:
    # a figure, reported, not checked).
    active_delta_pct: Optional[float] = Field(default=None, ge=0)
    reserved_delta_pct: Optional[float] = Field(default=None, ge=0)


class GraphPoolsContract(_Strict):
    """``graph`` (every CP variant in ONE MemPool) against ``graph-separate-pools`` (one pool per
    CP size): graph-pool bytes of the slot-shared arm over the largest single variant's pool
    (the largest of the separate pools), per rank; the sum of the separate pools is reported."""

    max_ratio: float = Field(default=1.05, gt=0)
    # Both arms run the same layout and kernels (only the pool layout differs): LM loss and grad
    # norm per step, ``exact`` = bitwise; grad_norm None: the loss bound.
    loss: LossBound = "exact"
    grad_norm: Optional[LossBound] = None


class ReferenceContract(_Strict):
    """Candidate arms against the ``reference`` arm: the same model, data and training on ONE rank
    (pp = vpp = ep = 1, no CP; ``harness.spec.derive.as_reference``). What the math allows is
    compared per candidate (``harness.compare``): until the first step the candidate groups its
    tokens into other microbatches than the single rank (step 1 with DP, EP over DP or dynamic
    CP; for a layout without DP the first step whose microbatch count differs, e.g. raised for
    the interleaved schedule; never, otherwise) every metric must match under ``loss``,
    ``grad_norm``, ``aux_loss``; from that step on the per-microbatch aux loss is not comparable
    and, with the aux loss on, its gradient moves the weights apart, so loss (after that step)
    and grad norm (from it) are compared under ``regrouped_loss`` / ``regrouped_grad_norm``
    (with ``aux_loss_coeff: 0``: still under ``loss`` / ``grad_norm``). Default bounds: measured
    fp32 deterministic CPU noise x 10 (docs/internals.md, "Measured noise"); a bf16 case
    (e.g. a graph case, whose reference arm keeps its static shapes) must declare its own."""

    # Candidate arms; None: the case's eager arm (``dcp`` in a dynamic-CP case) and, with
    # compare.dcp_vs_fixed_cp, its fixed-CP arm.
    arms: Optional[list[str]] = None
    loss: LossBound = Tolerance(max_rel=1e-6)
    grad_norm: LossBound = Tolerance(max_rel=1e-6)
    aux_loss: LossBound = Tolerance(max_rel=1e-6)
    regrouped_loss: LossBound = Tolerance(max_rel=1e-3)
    regrouped_grad_norm: LossBound = Tolerance(max_rel=2e-4)


class StepTimeSpec(_Strict):
    """Step time against the golden values (``compare.golden.step_time``), as Megatron-LM checks
    ``iteration-time``: the median over a steady window of steps of the arm's step time (the
    slowest rank's time of each step) against the golden file's median over the same window,
    two-sided: slower by more than ``worse`` fails (a regression), faster by more than ``better``
    fails too and asks for a refresh of the golden values (the command is in the check), as
    Megatron's inference tests do with throughput. A bound left out is the golden file's
    ``rtol`` (derived from ``dcp-harness golden record --repeats N``), else the default
    (docs/internals.md, "Step time and memory bounds")."""

    # First and last step of the steady window; None: Megatron's (steps 5..20, or 30..45 when
    # the golden values run past step 25), cut to the case's steps.
    window: Optional[tuple[int, int]] = None
    worse: Optional[float] = Field(default=None, gt=0)
    better: Optional[float] = Field(default=None, gt=0)
    # Check step time on CPU ranks too. Off by default: the focused CPU cases share two cores
    # with everything else on the machine, and their step time moves by more between repeats than
    # any slowdown worth catching (docs/internals.md, "Step time and memory bounds").
    on_cpu: bool = False

    @field_validator("window")
    @classmethod
    def _ordered_window(cls, v: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
        if v is not None and not 1 <= v[0] <= v[1]:
            raise ValueError(f"window must be [first, last] with 1 <= first <= last, got {list(v)}")
        return v


class MemorySpec(_Strict):
    """Memory against the golden values (``compare.golden.memory``; CUDA runs only): allocated,
    max allocated and reserved bytes per step (largest over ranks), the graph pool of the capture
    step, and the whole device used after ``empty_cache`` at the memory probe, each two-sided
    like the step time (more than ``worse`` fails; less than ``better`` fails and asks for a
    refresh). A bound left out is the golden file's ``rtol``, else the default."""

    worse: Optional[float] = Field(default=None, gt=0)
    better: Optional[float] = Field(default=None, gt=0)


class GoldenContract(_Strict):
    """One arm's per-step LM loss, aux loss and grad norm, its step time and (where CUDA recorded
    them) its memory against committed golden values, as Megatron-LM's functional tests keep them:
    ``<dir>/<case id>/golden_values_<key>.json`` (``dcp-harness golden record``), one file per
    platform (``cpu``, ``h200``, ``gb200``, ...: numerics differ between GPU generations), the key
    ``<environment>_<platform>`` when ``environment`` is set (Megatron's ``{environment}_{platform}``).
    A key without a file is skipped with the reason and the record command (an error with
    ``required: true``); a missing metric or step, or an unreadable file, is an error, never a
    pass. The sweep keeps a copy of the files as they were when it ran."""

    # Folder of the golden files, relative to the case file's folder.
    dir: str = "golden"
    arm: str = EAGER
    # Platform of the golden file; None: the platform the arm ran on (its records' ``platform``:
    # ``cpu``, or the GPU from its CUDA device name, e.g. ``h200``).
    platform: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    # Environment part of the key (``golden_values_<environment>_<platform>.json``): a name of
    # your own (``dev``, ``lts``) or ``auto``: the one the arm's records give (torch and CUDA
    # versions, ``harness.golden.environment_key``, e.g. ``torch2.11-cu13.0``); None: no
    # environment in the key (``golden_values_<platform>.json``).
    environment: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    # True: a platform without a golden file is an error (exit 2) instead of a skipped entry.
    required: bool = False
    # Bounds of the LM loss, aux loss and grad norm; None: ``exact`` for a deterministic fp32 arm
    # against a CPU golden file (the spread of its repeats where they did not agree bitwise),
    # else max_rel 1e-5, 1e-5, 1e-4 (``harness.golden.loss_bound``).
    loss: Optional[LossBound] = None
    aux_loss: Optional[LossBound] = None
    grad_norm: Optional[LossBound] = None
    # Step time (median over a steady window) and memory, two-sided; null switches one off.
    step_time: Optional[StepTimeSpec] = StepTimeSpec()
    memory: Optional[MemorySpec] = MemorySpec()


class ResumeContract(_Strict):
    """Resume consistency, as Megatron-LM's ``ckpt-resume`` tests: each arm (``arms``; default the
    eager arm, and ``graph`` in a graph case, whose graphs are captured again after the resume) is
    run a second time as ``<arm>-resumed``, stopped by the harness after step ``at_step``
    (its processes exit after saving their checkpoint) and started again from that checkpoint;
    from the step after it on, its LM loss, aux loss and grad norm must match the uninterrupted
    arm's (``exact`` = bitwise, which needs ``train.deterministic``)."""

    arms: Optional[list[str]] = Field(default=None, min_length=1)
    # Step after which the arm is stopped; None: half the steps (train.steps // 2, at least 1).
    at_step: Optional[int] = Field(default=None, ge=1, le=limit("train.steps"))
    loss: LossBound = "exact"
    # Bounds of the aux loss and grad norm; None: the loss bound.
    aux_loss: Optional[LossBound] = None
    grad_norm: Optional[LossBound] = None

    def step(self, steps: int) -> int:
        """The step after which the arm is stopped (``at_step``, else half of ``steps``)."""
        return self.at_step if self.at_step is not None else max(1, steps // 2)

    def arm_names(self, graph_case: bool) -> list[str]:
        """The arms resumed: ``arms``, else the eager arm and, in a graph case, ``graph``."""
        return list(self.arms) if self.arms is not None else [EAGER] + ([GRAPH] if graph_case else [])


class SlotRingContract(_Strict):
    """Graph memory flat in the microbatch count (a graph case with fixed CP and PP/VPP): one graph
    arm ``graph-mb<M>`` per count in ``microbatches`` (``train.microbatches = M``). Once a count
    outnumbers the slot ring (microbatches share physical slots), a larger count must not grow
    the plan's physical slots, saved-arena or input-grad-arena counts (checked from the slot
    planner, on any machine: entry ``slot_ring-plan``), nor the graph pool's and arenas' bytes of
    any rank (CUDA: entry ``slot_ring``) by more than ``max_growth`` (relative)."""

    microbatches: list[int] = Field(min_length=2)
    max_growth: float = Field(default=0.01, ge=0)

    @field_validator("microbatches")
    @classmethod
    def _sorted_counts(cls, v: list[int]) -> list[int]:
        if any(m < 1 for m in v):
            raise ValueError("microbatch counts must be >= 1")
        if len(set(v)) != len(v):
            raise ValueError(f"microbatches has repeated counts: {v}")
        if any(m > limit("train.microbatches") for m in v):
            raise ValueError(f"a count is above {limit('train.microbatches')} (train.microbatches' bound)")
        return sorted(v)


class SanitySpec(_Strict):
    """Run sanity checks every arm gets (each on by default, each switchable): a model that
    stopped learning (grad norm exactly zero, or loss that never moves from its first value) or
    blew up (loss above ``loss_spike_factor`` x the lowest loss of the earlier steps)."""

    grad_norm_nonzero: bool = True
    loss_moves: bool = True
    # The loss is stuck when no step moves it more than this (relative to step 1's loss).
    loss_moves_rel: float = Field(default=1e-6, ge=0)
    # None: spikes are not checked.
    loss_spike_factor: Optional[float] = Field(default=1.5, gt=1)


class CompareSpec(_Strict):
    repeat: Optional[RepeatContract] = None
    graph_vs_eager: Optional[GraphVsEagerContract] = None
    dcp_vs_fixed_cp: Optional[DcpVsFixedCpContract] = None
    graph_pools: Optional[GraphPoolsContract] = None
    reference: Optional[ReferenceContract] = None
    golden: Optional[GoldenContract] = None
    resume: Optional[ResumeContract] = None
    slot_ring: Optional[SlotRingContract] = None
    # Run sanity checks of every arm; None: all on with their defaults.
    sanity: Optional[SanitySpec] = None


# --------------------------------------------------------------------------- graphs
class GraphSpec(_Strict):
    """Slot-shared CUDA graphs (Megatron's cuda_graph_scope / cuda_graph_warmup_steps). A case with
    this section runs every arm with static shapes (fixed per-rank token buffers, fixed-size
    sequence metadata), its graph arms captured after ``warmup_steps`` eager steps."""

    # attn: the attention block is graphed, the MoE runs eagerly between graphs; full: the whole
    # layer (GraphScope).
    scope: GraphScope = GraphScope.ATTN
    warmup_steps: int = Field(default=2, ge=1)
    # Eager passes of the core's ordered warmup over the rank's order before capture.
    capture_warmup_iters: int = Field(default=2, ge=1)


class ShapeMode(Choice):
    DYNAMIC = "dynamic"  # each rank's tokens as packed; per-sequence attention, host-sized MoE
    STATIC = "static"  # fixed per-rank buffers and metadata: the path graph arms replay


class ShapesSpec(_Strict):
    """How the eager arms lay a microbatch out. ``static`` runs the static-shape path of the
    graph cases (fixed per-rank token buffers, fixed-size sequence metadata, the static
    attention, and with scope ``full`` the static MoE) without CUDA graphs, so it runs eagerly
    on CPU too. A case with ``graphs:`` is static with the graphs' scope (``Case.static_scope``,
    the one rule) and takes no ``shapes:`` section."""

    mode: ShapeMode = ShapeMode.STATIC
    # The static blocks (GraphScope): attn (the attention block; the MoE eagerly after it) or
    # full (the whole layer with the static MoE; ep 1).
    scope: GraphScope = GraphScope.ATTN


class Execution(_Strict):
    """How an arm runs a case: set by arm derivation (``harness.spec.derive``), never by files."""

    graphed: bool = False
    # shared: every CP variant in one MemPool (slot-shared); separate: one pool per CP size.
    pools: Pools = Pools.SHARED
    # The harness stops the arm after this step (its processes exit after checkpointing it) and
    # starts it again from that checkpoint (a ``-resumed`` arm of ``compare.resume``).
    interrupt_after: Optional[int] = Field(default=None, ge=1)


# --------------------------------------------------------------------------- resources
class ResourcesSpec(_Strict):
    nodes: int = Field(default=1, ge=1, le=limit("resources.nodes"))
    # Ranks per node. Without GPUs the local launcher runs this many CPU (gloo) processes.
    gpus_per_node: int = Field(default=1, ge=1, le=limit("resources.gpus_per_node"))
    time_min: float = Field(default=30, gt=0, le=limit("resources.time_min"))
    profile: str = "local"
    # cuda: the case runs only on CUDA GPUs (one per rank); the local launcher skips it, with the
    # reason, on a machine without enough of them. any: CPU processes (gloo) stand in for GPUs.
    # A case with `graphs:` needs CUDA whatever this says.
    device: DeviceKind = DeviceKind.ANY


# --------------------------------------------------------------------------- parked cases
class ParkedStatus(Choice):
    BROKEN = "broken"  # known to fail (crash, hang, wrong result) until a fix lands
    FLAKY = "flaky"  # passes and fails from run to run
    XFAIL = "xfail"  # expected to fail (Megatron's TEST_EVALUATION: xpass); a pass is an XPASS


class Expectation(_Strict):
    """A parked case (``expect:``): it still runs and every report shows its verdict with the
    status and reason, but the gate does not count it. An ``xfail`` case that passes is reported
    as XPASS; with ``strict: true`` an XPASS fails the gate (pytest's strict xfail: the known
    problem is gone, so unpark the case). ``until`` past today is a warning naming the case."""

    status: ParkedStatus
    reason: str = Field(min_length=1)
    # Date (YYYY-MM-DD) by which the problem should be fixed; past it, reports warn.
    until: Optional[date] = None
    strict: bool = False

    @field_validator("reason")
    @classmethod
    def _says_why(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("give the reason the case is parked (an issue link, what fails)")
        return v.strip()

    @model_validator(mode="after")
    def _strict_only_for_xfail(self) -> "Expectation":
        if self.strict and self.status is not ParkedStatus.XFAIL:
            raise ValueError(f"strict applies to status xfail only (an XPASS fails the gate); "
                             f"a {self.status.value} case is not judged, drop strict")
        return self


# --------------------------------------------------------------------------- emulated ranks
class EmulateSpec(_Strict):
    """Emulated ranks: each listed global rank of the case's world (``resources.nodes x
    gpus_per_node``) runs alone on one device as rank r of that world, with the real layout,
    groups, data shard, packing and CP choice, schedule, slot plan, capture and replay; its
    communication is stood in for by the loopback layer (``harness/workload/loopback.py``). For
    sizing a large layout on one workstation GPU: memory, capture, replays and graph vs eager are
    the rank's own; its losses are not the model's, so loss, reference and golden checks are
    skipped (``harness.arms``). ``dcp-harness run CASE --emulate-ranks 0,15`` sets it."""

    # Global ranks to emulate, e.g. [0, 15]: the first rank of the first PP stage and the last
    # rank of the last (preflight: distinct, within the world).
    ranks: list[int]


# --------------------------------------------------------------------------- file / case
class CaseFile(_Strict):
    """One YAML file as written by a user (before matrix expansion and preset resolution)."""

    name: str = Field(pattern=NAME_PATTERN)
    description: Optional[str] = None
    tags: list[str] = []
    model: ModelSpec = ModelSpec()
    parallel: ParallelSpec = ParallelSpec()
    train: TrainSpec
    data: DataSpec = DataSpec()
    compare: CompareSpec = CompareSpec()
    graphs: Optional[GraphSpec] = None
    shapes: Optional[ShapesSpec] = None
    resources: ResourcesSpec = ResourcesSpec()
    # A parked case: known broken, flaky or expected to fail (reports show it, the gate does not
    # count it).
    expect: Optional[Expectation] = None
    # Emulated ranks of the case's layout (``EmulateSpec``); None: a real run.
    emulate: Optional[EmulateSpec] = None
    # A training command run in place of the built-in workload (``CommandSpec``).
    command: Optional[CommandSpec] = None
    # Dotted field path -> list of values; the cartesian product gives one case each.
    matrix: Optional[dict[str, list]] = None


class Case(_Strict):
    """One runnable case: matrix expanded, preset resolved, preflight passed."""

    id: str = Field(pattern=NAME_PATTERN)
    name: str
    source: str  # path of the YAML file it came from
    description: Optional[str] = None
    tags: tuple[str, ...] = ()
    model: ResolvedModel
    parallel: ParallelSpec
    train: TrainSpec
    data: DataSpec
    compare: CompareSpec
    graphs: Optional[GraphSpec] = None
    shapes: Optional[ShapesSpec] = None
    resources: ResourcesSpec
    expect: Optional[Expectation] = None
    # Emulated ranks (each alone on one device, loopback communication); None: a real run.
    emulate: Optional[EmulateSpec] = None
    command: Optional[CommandSpec] = None  # a training command instead of the built-in workload

    @model_serializer(mode="wrap")
    def _leave_out_no_command(self, handler: Any) -> Any:
        """A built-in case is dumped without ``command`` (its ``case.json`` and hash as before)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("command", 0) is None:
            del data["command"]
        return data
    # The matrix values that produced this case (dotted path -> value), for ids and reports.
    matrix_values: dict[str, object] = {}
    # Set only on a derived arm case (harness.spec.derive): its arm name and how it runs.
    arm: Optional[str] = None
    execution: Execution = Execution()

    @property
    def static_scope(self) -> Optional[GraphScope]:
        """The blocks of the static-shape path, or None for dynamic shapes: a graph case runs
        static shapes with ``graphs.scope`` (every arm but its reference), a case with
        ``shapes: {mode: static}`` with ``shapes.scope``."""
        if self.graphs is not None:
            return self.graphs.scope
        if self.shapes is not None and self.shapes.mode is ShapeMode.STATIC:
            return self.shapes.scope
        return None

    @property
    def static_shapes(self) -> bool:
        """Fixed per-rank token buffers and metadata (every arm of a graph case, or a case
        with ``shapes: {mode: static}``)."""
        return self.static_scope is not None

    @property
    def needs_cuda(self) -> bool:
        return self.graphs is not None or self.resources.device is DeviceKind.CUDA

    @property
    def emulated_ranks(self) -> tuple[int, ...]:
        """The emulated ranks, ascending (empty for a real run)."""
        return tuple(sorted(self.emulate.ranks)) if self.emulate is not None else ()

    @property
    def layout(self) -> ParallelLayout:
        """The parallel layout: degrees, world, derived sizes (``dp_cp``, ``dp``,
        ``tokens_per_rank``, ...) and their rules (``harness.spec.layout``)."""
        return ParallelLayout.of(self)
