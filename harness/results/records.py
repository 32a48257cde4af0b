"""Typed step records: what the workload writes once per rank and step and every reader reads.

``StepRecord`` (with ``MemoryProbe``, ``GraphStats``, ``FrameReplays`` and ``PackedMicrobatch``
nested in it) is the
one shape of a line of ``rank<k>.jsonl``: the rank process builds it, ``StepWriter`` writes
its pydantic dump (``typed.record_json``) and ``read_steps`` gives it back through
:meth:`StepRecord.from_dict`, which validates with the same type (a ``TypeAdapter`` of these
frozen dataclasses): an unknown key, a value
of the wrong JSON type or a missing field is a ``ResultsError`` naming the field, in the words a
bad case file gets (``harness.spec.validation``). Readers take ``StepRecord`` only and read its
attributes; :func:`field_of` reads one named by a string (a series of any numeric field).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, Mapping, Optional

from pydantic import BeforeValidator, ConfigDict, Field, PlainSerializer, Strict

from .typed import OmitEmpty, OmitNone, read_typed


def _whole(value: Any) -> Any:
    """An integral float (``4096.0``) reads as the integer it is; anything else is left as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# The JSON types of a record, exactly: a bool is not a number, a number is not a string.
Int = Annotated[int, BeforeValidator(_whole), Strict()]
Float = Annotated[float, Strict()]  # an int reads as a float; NaN and infinities are kept
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
Step = Annotated[Int, Field(ge=1)]
_FORBID = ConfigDict(extra="forbid")  # an unknown key is an error: a renamed field is caught


@dataclass(frozen=True)
class MemoryProbe:
    """Memory of one rank after ``train.memory_probe_step`` and ``torch.cuda.empty_cache()``."""

    __pydantic_config__ = _FORBID

    device_used_bytes: Int  # whole device (cudaMemGetInfo: total - free) less others_bytes
    device_total_bytes: Int
    allocated_bytes: Int  # this process's caching allocator: allocated (= active after the step)
    active_bytes: Int
    reserved_bytes: Int
    # NVML's usage of the other processes on the device at the probe, subtracted from
    # device_used_bytes (the figure this process would have had alone: arms sharing one GPU,
    # harness.metrics.device_memory); None where NVML was not read (nothing subtracted)
    others_bytes: Optional[Int] = None


@dataclass(frozen=True)
class GraphStats:
    """What one rank's CUDA-graph capture built (recorded on the step after which it ran)."""

    __pydantic_config__ = _FORBID

    summary: Str  # the core's capture line
    variants: Int  # CP variants captured
    physical_slots: Int
    graphs: Int
    pool_reserved_bytes: Int  # every graph pool of the rank together
    pool_allocated_bytes: Int
    arena_bytes: Int
    largest_pool_bytes: Int  # the largest single pool (one CP size with separate pools)
    pools: Int  # 1 (slot-shared) or one per CP size
    capture_s: Float
    warmup_s: Float
    capture_peak_bytes: Int
    warmup_peak_bytes: Int


@dataclass(frozen=True)
class PredictedMemory:
    """What ``harness.memplan`` predicted for this arm on this rank, before it ran (recorded by
    the rank process on CUDA, beside what the rank measures): the graph pool and arenas of a
    graph arm (None for an eager arm), the peak allocated, and Megatron's estimate."""

    __pydantic_config__ = _FORBID

    pool_bytes: Optional[Int]
    arena_bytes: Optional[Int]
    peak_bytes: Int
    megatron_bytes: Int


@dataclass(frozen=True)
class FrameReplays:
    """How many layer graphs one (CP size, physical slot) frame replayed in one step (forward
    replays, summed over the rank's layers; each has its backward replay)."""

    __pydantic_config__ = _FORBID

    cp_size: Int
    slot: Int
    replays: Int


def _pairs(value: Any) -> Any:
    """A mapping of settings (as written to JSON) reads as sorted (name, value) pairs."""
    return tuple(sorted(value.items())) if isinstance(value, Mapping) else value


def _object(pairs: Any) -> dict[str, str]:
    return dict(pairs)


# (name, value) pairs, sorted by name, in the record; a JSON object in the file.
Settings = Annotated[tuple[tuple[Str, Str], ...], BeforeValidator(_pairs), PlainSerializer(_object)]


@dataclass(frozen=True)
class RunEnvironment:
    """What a rank process ran with that changes numerics, speed or memory: the torch, CUDA and
    NCCL versions, the device, and the allocator / NCCL / determinism settings of its
    environment that were set (``harness.environment.SETTINGS``; unset ones are left out).
    ``device_id`` names the physical device, not a version: the CUDA GPU's UUID (``GPU-...``), or
    for a CPU rank the host's name; a golden step-time bound measured by repeats holds on the
    devices the repeats ran on (``harness.compare.golden_perf``). Recorded on the first step
    record each rank process writes (again after a resume)."""

    __pydantic_config__ = _FORBID

    torch: Str
    cuda: Optional[Str] = None  # torch.version.cuda of a CUDA build, None on a CPU build
    nccl: Optional[Str] = None  # the NCCL torch was built with, where it has one
    # the CUDA device's name; on CPU the CPU's (``harness.environment.cpu_name``)
    device_name: Optional[Str] = None
    settings: Settings = ()  # (variable, value), sorted by variable
    # the GPU's UUID, or the CPU rank's host name; left out while unset (older readers' layout)
    device_id: Annotated[Optional[Str], OmitNone] = None
    # What decides the kernels (``harness.kernels.probe``: torch build, ATen CPU capability, BLAS
    # ISA, threads; CUDA device, cuDNN, cuBLAS), (key, value) sorted by key; empty (and left out
    # of the file) in records written before it was recorded
    kernels: Annotated[Settings, OmitEmpty] = ()


@dataclass(frozen=True)
class AttentionWork:
    """One rank's causal attention work in one microbatch: the query-key pairs its attention
    computes per layer (a query at position p of its sequence sees p + 1 keys), in the CP group
    that starts at pool rank ``group`` (``cp`` ranks)."""

    __pydantic_config__ = _FORBID

    microbatch: Int
    group: Int
    cp: Int
    work: Int


@dataclass(frozen=True)
class OracleStep:
    """What the oracle (Hugging Face Qwen3-MoE with torch's AdamW and clip_grad_norm_, trained
    beside the one-rank arm: ``harness.workload.oracle``) gave on one step: its LM loss, aux loss
    (our definition, from its router) and grad norm, and the largest relative differences from
    ours of the logits (before the step), the gradients (after clipping) and the parameters
    (after the optimizer step), and the learning rate its scheduler gave the step;
    ``unavailable`` says why the oracle did not run (the rest None)."""

    __pydantic_config__ = _FORBID

    loss: Optional[Float] = None
    aux_loss: Optional[Float] = None
    grad_norm: Optional[Float] = None
    logits_rel: Optional[Float] = None
    grads_rel: Optional[Float] = None
    params_rel: Optional[Float] = None
    lr: Optional[Float] = None
    unavailable: Optional[Str] = None


@dataclass(frozen=True)
class StateDigest:
    """Digests of the training state a resume must carry over (``harness.workload.state_digest``):
    the optimizer's state and the RNG's, taken from the live objects."""

    __pydantic_config__ = _FORBID

    optimizer: Str
    rng: Str


@dataclass(frozen=True)
class PackedGroup:
    """One CP group of a packed microbatch: its CP size, the global-batch indices of the
    sequences it holds (ascending), their real tokens, and each one's length in the same order
    (``lengths``; empty in records written before they were recorded)."""

    __pydantic_config__ = _FORBID

    cp: Int
    sequences: tuple[Int, ...]
    tokens: Int
    lengths: Annotated[tuple[Int, ...], OmitEmpty] = ()  # left out while empty (older records)


@dataclass(frozen=True)
class PackedMicrobatch:
    """What one microbatch of a step packed: its CP groups in pool order (the whole DP x CP
    pool's, the same on every rank of the arm)."""

    __pydantic_config__ = _FORBID

    groups: tuple[PackedGroup, ...]

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.groups)

    @property
    def sequences(self) -> tuple[int, ...]:
        return tuple(i for g in self.groups for i in g.sequences)

    @property
    def grouping(self) -> tuple[tuple[int, ...], ...]:
        """The sequences of each group: what decides the per-group arithmetic."""
        return tuple(g.sequences for g in self.groups)

    def describe(self) -> str:
        """``CP2 [0 3 5] 120`` per group, groups joined by `` + ``."""
        return " + ".join(f"CP{g.cp} [{' '.join(map(str, g.sequences))}] {g.tokens}"
                          for g in self.groups)


@dataclass(frozen=True)
class StepRecord:
    """One rank's record of one completed step: what the workload writes and every reader reads.

    ``loss`` is the global per-token LM loss (identical on every rank), ``aux_loss`` Megatron's
    unscaled load-balancing loss averaged over layers, ``grad_norm`` the global norm before
    clipping. Memory fields are None without CUDA. ``platform`` names the kind of device (golden
    files are kept per platform). ``graphed`` says whether the step replayed CUDA
    graphs; ``memory_probe`` and ``graph_stats`` are set on the steps where they were measured;
    ``replays`` counts a graphed step's replays per (CP size, physical slot) frame.
    ``packed`` is what the step's microbatches held (every CP group's sequences and tokens;
    empty in records written before it was recorded): what the packing checks read.
    """

    __pydantic_config__ = _FORBID

    step: Step
    loss: Optional[Float] = None
    aux_loss: Optional[Float] = None
    grad_norm: Optional[Float] = None
    nan: Bool = False
    skipped: Bool = False
    tokens: Optional[Int] = None
    microbatches: Optional[Int] = None
    cp_sizes: tuple[Int, ...] = ()
    lr: Optional[Float] = None
    # The L2 norm of the rank's replica of the weights (Megatron's ``params norm``): the same on
    # every rank that holds the same weights (``ranks_agree``: a data-parallel replica that drifts).
    params_norm: Annotated[Optional[Float], OmitNone] = None
    step_time_s: Optional[Float] = None
    # The rank process's CPU time (every thread) over the step: on a shared CPU host the figure
    # neighbours move less than the wall-clock step_time_s (docs/history.md, the drift rule).
    cpu_time_s: Annotated[Optional[Float], OmitNone] = None  # left out while unset (older records)
    device: Optional[Str] = None
    # The golden platform of the device (``cpu``, ``h200``, ``gb200``: ``golden.platform_key`` of
    # the CUDA device name), set by the rank process (``rank_main``) on every record it writes.
    platform: Optional[Str] = None
    allocated_bytes: Optional[Int] = None
    reserved_bytes: Optional[Int] = None
    active_bytes: Optional[Int] = None
    max_allocated_bytes: Optional[Int] = None
    graphed: Bool = False
    memory_probe: Optional[MemoryProbe] = None
    graph_stats: Optional[GraphStats] = None
    replays: tuple[FrameReplays, ...] = ()  # graphed steps: per (CP size, slot), in that order
    packed: tuple[PackedMicrobatch, ...] = ()  # the step's microbatches, in schedule order
    # What the rank process ran with (versions, allocator and NCCL settings): on the first record
    # each rank process writes.
    environment: Optional[RunEnvironment] = None
    # What harness.memplan predicted for this arm and rank (CUDA ranks): on the first record each
    # rank process writes, beside the memory the records measure.
    memory_predicted: Optional[PredictedMemory] = None
    # The step this rank process resumed after (it loaded that step's checkpoint); None: it
    # started from step 1. Set on every record the process writes.
    resumed_from: Optional[Step] = None
    # The step the checkpoint this rank process loaded holds, by the checkpoint's own metadata
    # (``harness.workload.checkpoint``; None: it loaded none). Set on every record it writes.
    checkpoint_step: Optional[Step] = None
    # The state at the harness's stop (on the record of the step the arm stops after, taken before
    # its checkpoint is written) and right after a resumed process restored its checkpoint (on
    # the first record that process writes): ``compare.resume`` checks that they are equal. Left
    # out of the file while unset, as the oracle's (the layout older readers know).
    stop_state: Annotated[Optional[StateDigest], OmitNone] = None
    loaded_state: Annotated[Optional[StateDigest], OmitNone] = None
    # This rank's causal attention work per microbatch (schedule order; empty in records written
    # before it was recorded): what ``<arm>.cp_balance`` compares across each CP group.
    attention_work: tuple[AttentionWork, ...] = ()
    # The oracle arm's (``compare.oracle``) comparison with Hugging Face's Qwen3-MoE on this step.
    oracle: Annotated[Optional[OracleStep], OmitNone] = None

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise ValueError(f"a step record needs an integer 'step' >= 1, got {self.step!r}")

    # Kept: the one parse every reader of step records shares (rank files, a command's JSON
    # lines, the record API), its non-finite names decoded by the caller.
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StepRecord":
        """A record from its JSON object (non-finite floats decoded, as ``read_steps`` gives
        it); a ResultsError naming each unknown, mistyped or missing field."""
        return read_typed(StepRecord, data, "step record", nonfinite=False)


FIELDS = frozenset(f.name for f in fields(StepRecord))


def field_of(record: StepRecord, key: str) -> Any:
    """The field ``key`` of a record (a series of a field chosen by name); a KeyError naming
    the fields for a name a step record does not have."""
    if key not in FIELDS:
        raise KeyError(f"step records have no field '{key}' (fields: {', '.join(sorted(FIELDS))})")
    return getattr(record, key)


