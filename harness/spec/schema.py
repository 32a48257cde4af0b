"""The case-file schema (pydantic v2). Unknown keys are errors everywhere.

A YAML case file holds one :class:`CaseFile`. ``matrix:`` expansion and preset
resolution turn it into one or more :class:`Case` objects (see ``expand.py``): the user's cases,
which the harness plans. Each arm of a case runs an :class:`ArmCase`, derived from it
(``harness.spec.derive``). The ``compare:`` section (:class:`CompareSpec`) takes one section per
registered comparison (``harness.spec.comparisons``; each comparison's module defines its own).
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
    SerializationInfo,
    model_serializer,
    model_validator,
)

from pydantic_core import PydanticUndefined

from harness.spec.layout import ParallelLayout
# Upper bounds of sizes (le=): limits.py says why each is what it is.
from harness.spec.limits import limit

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


class Strict(BaseModel):
    """The base of every section of a case file (a comparison's settings too): unknown keys are
    errors; inf/nan are never valid settings (lr: .inf, max_abs: .nan); a number field given a
    YAML boolean is an error."""

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


class LrDecay(Choice):
    CONSTANT = "constant"
    LINEAR = "linear"
    COSINE = "cosine"


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
METRIC_FIELDS = ("loss", "aux_loss", "grad_norm", "lr", "params_norm", "step_time_s", "tokens",
                 "allocated_bytes", "reserved_bytes", "active_bytes", "max_allocated_bytes",
                 "skipped", "nan")
MetricField = Literal["loss", "aux_loss", "grad_norm", "lr", "params_norm", "step_time_s", "tokens",
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


class MetricsSpec(Strict):
    """Where a command's metrics come from: ``path`` is relative to the arm's folder (defaults:
    ``tensorboard``, ``log.txt`` (the ranks' output), ``metrics/rank{rank}.jsonl``); ``tags``
    maps step-record fields to TensorBoard tags or Megatron log keys, over Megatron's."""

    source: MetricsSource
    path: Optional[str] = Field(default=None, min_length=1)
    tags: Optional[dict[MetricField, str]] = None


class CommandResume(Strict):
    """How a command saves and loads its checkpoint, for the ``-resumed`` arms of
    ``compare.resume`` (docs/command-cases.md): the first run of such an arm gets ``save`` added
    (it must save after step ``{stop}``, ``compare.resume.at_step``, and exit), the second
    ``load`` (it must load that checkpoint and go on to ``train.steps``). ``iteration_file``: a
    file the command writes naming the iteration its latest checkpoint holds (Megatron's
    ``latest_checkpointed_iteration.txt``), read between the two runs."""

    save: list[str] = Field(min_length=1)
    load: list[str] = Field(min_length=1)
    iteration_file: Optional[str] = Field(default=None, min_length=1)


class CommandSpec(Strict):
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
    resume: Optional[CommandResume] = None

    @field_validator("argv", mode="before")
    @classmethod
    def _argv_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("argv is a list of arguments, never a shell string: write "
                             "[python, train.py, --steps, '{steps}']")
        return value


# --------------------------------------------------------------------------- model
class ModelSpec(Strict):
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


class ModelPreset(Strict):
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
class ParallelSpec(Strict):
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
class OptimizerSpec(Strict):
    name: OptimizerName = OptimizerName.ADAMW
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    # Global grad-norm clip; null turns clipping off.
    grad_clip: Optional[float] = Field(default=1.0, gt=0)


class LrScheduleSpec(Strict):
    """The learning rate over the steps, Megatron's ``OptimizerParamScheduler``: a linear warmup
    from 0 over ``warmup_steps``, then ``decay`` from ``train.lr`` towards ``min_lr`` over the run
    (``lr_decay_iters`` = ``train.steps``). Step s (1-based) runs at the rate of the s - 1 steps
    before it, so the first step of a warmup runs at 0 (docs/case-files.md gives the formula)."""

    # Megatron's lr_warmup_iters; 0: no warmup.
    warmup_steps: int = Field(default=0, ge=0)
    # Megatron's lr_decay_style after the warmup.
    decay: LrDecay = LrDecay.CONSTANT
    # Megatron's min_lr: where the decay ends.
    min_lr: float = Field(default=0.0, ge=0)


class TrainSpec(Strict):
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
    lr_schedule: LrScheduleSpec = LrScheduleSpec()

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any, info: SerializationInfo) -> Any:
        """A constant rate (the default) is left out: the case files, plans and case hashes
        written before the schedule existed stay as they were."""
        out = handler(self)
        if self.lr_schedule == LrScheduleSpec():
            out.pop("lr_schedule", None)
        return out

    @model_validator(mode="after")
    def _schedule_fits(self) -> "TrainSpec":
        sched = self.lr_schedule
        if sched.warmup_steps > self.steps:
            raise ValueError(f"lr_schedule.warmup_steps ({sched.warmup_steps}) is more than "
                             f"train.steps ({self.steps})")
        if sched.decay is not LrDecay.CONSTANT and not sched.min_lr < self.lr:
            raise ValueError(f"lr_schedule.min_lr ({sched.min_lr:g}) must be below train.lr "
                             f"({self.lr:g}) for a {sched.decay.value} decay")
        return self


class LengthSpec(Strict):
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


class DataSpec(Strict):
    lengths: LengthSpec = LengthSpec()


# --------------------------------------------------------------------------- compare
class Tolerance(Strict):
    max_abs: Optional[float] = Field(default=None, ge=0)
    max_rel: Optional[float] = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _some_bound(self) -> "Tolerance":
        if self.max_abs is None and self.max_rel is None:
            raise ValueError("give max_abs, max_rel or both")
        return self


LossBound = Union[Literal["exact"], Tolerance]


class SanitySpec(Strict):
    """Run sanity checks every arm gets (each on by default, each switchable): a model that
    stopped learning (grad norm exactly zero, or loss that never moves from its first value) or
    blew up (loss above ``loss_spike_factor`` x the lowest loss of the earlier steps)."""

    grad_norm_nonzero: bool = True
    loss_moves: bool = True
    # The loss is stuck when no step moves it more than this (relative to step 1's loss).
    loss_moves_rel: float = Field(default=1e-6, ge=0)
    # None: spikes are not checked.
    loss_spike_factor: Optional[float] = Field(default=1.5, gt=1)
    # Largest max/mean of the causal attention work (query-key pairs) over the ranks of one CP
    # group in one microbatch; the load-balanced split (rank r holds chunks r and 2cp-1-r) gives
    # 1.0. None: balance is not checked.
    cp_balance: Optional[float] = Field(default=1.05, ge=1)


class CompareSpec(Strict):
    """The ``compare:`` section: one optional section per registered comparison
    (``compare.<name>``, its settings model; ``harness.spec.comparisons`` adds them, each
    comparison's module registers its own: ``harness.compare.registry``), then ``sanity``."""

    # Run sanity checks of every arm; None: all on with their defaults.
    sanity: Optional[SanitySpec] = None


# --------------------------------------------------------------------------- graphs
class GraphSpec(Strict):
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


class ShapesSpec(Strict):
    """How the eager arms lay a microbatch out. ``static`` runs the static-shape path of the
    graph cases (fixed per-rank token buffers, fixed-size sequence metadata, the static
    attention, and with scope ``full`` the static MoE) without CUDA graphs, so it runs eagerly
    on CPU too. A case with ``graphs:`` is static with the graphs' scope (``Case.static_scope``,
    the one rule) and takes no ``shapes:`` section."""

    mode: ShapeMode = ShapeMode.STATIC
    # The static blocks (GraphScope): attn (the attention block; the MoE eagerly after it) or
    # full (the whole layer with the static MoE; ep 1).
    scope: GraphScope = GraphScope.ATTN


class Execution(Strict):
    """How an arm runs a case: set by arm derivation (``harness.spec.derive``), never by files."""

    graphed: bool = False
    # shared: every CP variant in one MemPool (slot-shared); separate: one pool per CP size.
    pools: Pools = Pools.SHARED
    # The harness stops the arm after this step (its processes exit after checkpointing it) and
    # starts it again from that checkpoint (a ``-resumed`` arm of ``compare.resume``).
    interrupt_after: Optional[int] = Field(default=None, ge=1)
    # The one-rank arm trained beside Hugging Face's Qwen3-MoE (``compare.oracle``).
    oracle: bool = False
    # Its processes start otherwise than the first run's in everything the numbers must not
    # depend on (``harness.launch.ranks.variation``: hash seed, rank start order, working and
    # temporary folders, the environment's order, a cold start): the repeat arm of
    # ``compare.repeat`` and the one-rank reference arm.
    vary_processes: bool = False

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any, info: SerializationInfo) -> Any:
        """``vary_processes`` is left out while false: plans written before it stay as they were."""
        out = handler(self)
        if not self.vary_processes:
            out.pop("vary_processes", None)
        return out


# --------------------------------------------------------------------------- resources
class ResourcesSpec(Strict):
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


class Expectation(Strict):
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
class EmulateSpec(Strict):
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


# --------------------------------------------------------------------------- memory model
class MemoryModelSpec(Strict):
    """How close the memory plan (``harness.memplan``, ``dcp-harness plan CASE --memory``) must
    come to what a CUDA rank measures: ``max_rel`` bounds ``|predicted / measured - 1|`` of the
    graph pool, the arenas and the peak allocated, per arm and rank (``<arm>.memory_model``).
    Without it the ratios are recorded as a figure and bound nothing."""

    max_rel: float = Field(gt=0, le=1)


# --------------------------------------------------------------------------- file / case
def _unset(value: Any) -> bool:
    """``exclude_if`` of a section added after case hashes were first stored (``command``,
    ``memory_model``; every section added later takes it too): left out of ``case.json`` and
    ``plan.json`` while unset, so the hash of a case without it is what it was."""
    return value is None


class CaseSections(Strict):
    """The sections a case file and a case hold alike, each declared once here: :class:`CaseFile`
    reads them from YAML, the loader copies them into :class:`Case` (``Case.of_file``), and
    ``case.json`` / ``plan.json`` write them as declared. ``model`` (as written, resolved in a
    case) and ``compare`` (the user's pairs, no arm case's) are declared where they differ."""

    parallel: ParallelSpec = ParallelSpec()
    train: TrainSpec
    data: DataSpec = DataSpec()
    graphs: Optional[GraphSpec] = None
    shapes: Optional[ShapesSpec] = None
    resources: ResourcesSpec = ResourcesSpec()
    # A parked case: known broken, flaky or expected to fail (reports show it, the gate does not
    # count it).
    expect: Optional[Expectation] = None
    # Emulated ranks of the case's layout (``EmulateSpec``); None: a real run.
    emulate: Optional[EmulateSpec] = None
    # A training command run in place of the built-in workload (``CommandSpec``).
    command: Optional[CommandSpec] = Field(default=None, exclude_if=_unset)
    # A bound on the memory plan against what CUDA ranks measure (``MemoryModelSpec``).
    memory_model: Optional[MemoryModelSpec] = Field(default=None, exclude_if=_unset)


class _FileHead(Strict):
    """What a case file says before its sections (declared first, so errors list it first)."""

    name: str = Field(pattern=NAME_PATTERN)
    description: Optional[str] = None
    tags: list[str] = []
    model: ModelSpec = ModelSpec()


class CaseFile(CaseSections, _FileHead):
    """One YAML file as written by a user (before matrix expansion and preset resolution): its
    head, the sections (:class:`CaseSections`), its pairs and its matrix."""

    compare: CompareSpec = Field(default_factory=CompareSpec)
    # Dotted field path -> list of values; the cartesian product gives one case each.
    matrix: Optional[dict[str, list]] = None


class _CaseHead(Strict):
    """What a case adds to a file's head: its id and the file it came from; its model resolved."""

    id: str = Field(pattern=NAME_PATTERN)
    name: str
    source: str  # path of the YAML file it came from
    description: Optional[str] = None
    tags: tuple[str, ...] = ()
    model: ResolvedModel


class BaseCase(CaseSections, _CaseHead):
    """What a case and an arm's case share: matrix expanded, preset resolved, preflight passed.
    The user's case is :class:`Case` (its ``compare:`` section); an arm's case is
    :class:`ArmCase` (its arm and how it runs), derived by ``harness.spec.derive``. Dumped
    (``case.json``, ``plan.json``) in the order its fields are declared."""

    # The matrix values that produced this case (dotted path -> value), for ids and reports.
    matrix_values: dict[str, object] = {}

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


class Case(BaseCase):
    """The user's case: one matrix point of a case file, with its ``compare:`` section (the pairs
    its arms form belong to it, never to an arm's case). ``case.json`` holds it with an arm case's
    own fields unset (``arm: null``, the default ``execution``), as it always has: the case hashes
    of earlier sweeps and golden folders hold; read back, they are dropped again."""

    compare: CompareSpec = Field(default_factory=CompareSpec)

    @classmethod
    def of_file(cls, spec: CaseFile, *, id: str, source: str, model: ResolvedModel,
                matrix_values: dict[str, object]) -> "Case":
        """The case of one matrix point of ``spec``: every field the file and the case share
        (the sections, ``compare``, the head) copied by name, the rest given."""
        shared = {name: getattr(spec, name) for name in CaseFile.model_fields if name != "matrix"}
        return cls(**{**shared, "id": id, "source": source, "model": model,
                      "matrix_values": matrix_values})

    @model_validator(mode="before")
    @classmethod
    def _drop_arm_keys(cls, data: Any) -> Any:
        """``case.json``'s arm-case fields, unset (see the class doc)."""
        if not isinstance(data, dict):
            return data
        arm = _arm_own_fields()
        return {k: v for k, v in data.items() if k not in arm or not _is_unset(arm[k], v)}

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any, info: SerializationInfo) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        return {**data, **{name: _unset_value(field, info.mode)
                           for name, field in _arm_own_fields().items()}}


class ArmCase(BaseCase):
    """The case one arm runs, derived from the user's case (``harness.spec.derive``): the same
    id and shape, its own layout and sections, no pairs."""

    arm: str = Field(min_length=1)  # the arm's configuration name (``harness.spec.derive.ArmSpec.base``)
    execution: Execution = Execution()


def _arm_own_fields() -> dict[str, Any]:
    """The fields an arm case has and the user's case has not (``arm``, ``execution``)."""
    return {n: f for n, f in ArmCase.model_fields.items() if n not in BaseCase.model_fields}


def _unset_value(field: Any, mode: str) -> Any:
    """What ``case.json`` writes for an arm case's field a user's case leaves unset: its default
    (None where it has none)."""
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return default.model_dump(mode=mode)
    return None if default is PydanticUndefined else default


def _is_unset(field: Any, value: Any) -> bool:
    """Whether ``value`` (as ``case.json`` holds it) is an arm case's field left unset."""
    default = field.get_default(call_default_factory=True)
    if value is None:
        return True
    if isinstance(default, BaseModel):
        return type(default).model_validate(value) == default
    return default is not PydanticUndefined and value == default
