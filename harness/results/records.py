"""Typed step records: what the workload writes once per rank and step and every reader reads.

``StepRecord`` (with ``MemoryProbe``, ``GraphStats`` and ``FrameReplays`` nested in it) is the
one shape of a line of ``rank<k>.jsonl``: the rank process builds it, ``StepWriter`` writes
``to_dict()`` and ``read_steps`` gives it back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional

from .files import ResultsError, decode_float


def _opt_int(value: Any, name: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResultsError(f"'{name}' must be an integer or null, got {value!r}")
    return value


def _opt_float(value: Any, name: str) -> Optional[float]:
    try:
        return decode_float(value)
    except ResultsError as exc:
        raise ResultsError(f"'{name}': {exc}") from None


def _from_fields(cls: type, data: Mapping[str, Any], what: str,
                 given: Optional[Mapping[str, Any]] = None) -> Any:
    """``cls(**data)`` for a dataclass of ints, floats, bools, strs (typed by annotation name)
    plus the already-parsed fields ``given``; unknown keys are errors, so a renamed key is caught
    where it is read."""
    given = dict(given or {})
    known = {f.name: f for f in fields(cls) if f.name not in given}
    unknown = sorted(set(data) - set(known) - set(given))
    if unknown:
        raise ResultsError(f"{what} has unknown keys {unknown} (known: {sorted(known)})")
    out: dict[str, Any] = {}
    for name, f in known.items():
        if name not in data:
            continue
        value, kind = data[name], str(f.type)
        if "int" in kind and "float" not in kind:
            out[name] = _opt_int(value, name)
        elif "float" in kind:
            out[name] = _opt_float(value, name)
        elif "bool" in kind:
            if not isinstance(value, bool):
                raise ResultsError(f"'{name}' must be true or false, got {value!r}")
            out[name] = value
        else:
            out[name] = None if value is None else str(value)
    try:
        return cls(**out, **given)
    except (TypeError, ValueError) as exc:
        raise ResultsError(f"{what}: {exc}") from None


@dataclass(frozen=True)
class MemoryProbe:
    """Memory of one rank after ``train.memory_probe_step`` and ``torch.cuda.empty_cache()``."""

    device_used_bytes: int  # whole device (NVML / cudaMemGetInfo: total - free), every process
    device_total_bytes: int
    allocated_bytes: int  # this process's caching allocator: allocated (= active after the step)
    active_bytes: int
    reserved_bytes: int


@dataclass(frozen=True)
class GraphStats:
    """What one rank's CUDA-graph capture built (recorded on the step after which it ran)."""

    summary: str  # the core's capture line
    variants: int  # CP variants captured
    physical_slots: int
    graphs: int
    pool_reserved_bytes: int  # every graph pool of the rank together
    pool_allocated_bytes: int
    arena_bytes: int
    largest_pool_bytes: int  # the largest single pool (one CP size with separate pools)
    pools: int  # 1 (slot-shared) or one per CP size
    capture_s: float
    warmup_s: float
    capture_peak_bytes: int
    warmup_peak_bytes: int


@dataclass(frozen=True)
class FrameReplays:
    """How many layer graphs one (CP size, physical slot) frame replayed in one step (forward
    replays, summed over the rank's layers; each has its backward replay)."""

    cp_size: int
    slot: int
    replays: int


@dataclass(frozen=True)
class PackedGroup:
    """One CP group of a packed microbatch: its CP size, the global-batch indices of the
    sequences it holds (ascending) and their real tokens."""

    cp: int
    sequences: tuple[int, ...]
    tokens: int


@dataclass(frozen=True)
class PackedMicrobatch:
    """What one microbatch of a step packed: its CP groups in pool order (the whole DP x CP
    pool's, the same on every rank of the arm)."""

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


def _int_list(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int)
                                          for x in value):
        raise ResultsError(f"'{name}' must be a list of integers, got {value!r}")
    return tuple(value)


def parse_packed(value: Any) -> tuple[PackedMicrobatch, ...]:
    """``packed`` as written by ``StepRecord.to_dict`` (ResultsError naming what is wrong)."""
    if not isinstance(value, list):
        raise ResultsError(f"'packed' must be a list of microbatches, got {value!r}")
    out = []
    for mb in value:
        groups = mb.get("groups") if isinstance(mb, Mapping) else None
        if not isinstance(groups, list) or set(mb) != {"groups"} or not all(
                isinstance(g, Mapping) for g in groups):
            raise ResultsError(f"'packed' entry must be {{\"groups\": [...]}}, got {mb!r}")
        parsed = []
        for g in groups:
            if set(g) != {"cp", "sequences", "tokens"}:
                raise ResultsError(f"'packed' group has keys {sorted(g)}, expected "
                                   "['cp', 'sequences', 'tokens']")
            cp, tokens = _opt_int(g["cp"], "cp"), _opt_int(g["tokens"], "tokens")
            if cp is None or tokens is None:
                raise ResultsError(f"'packed' group needs integer cp and tokens, got {dict(g)!r}")
            parsed.append(PackedGroup(cp, _int_list(g["sequences"], "sequences"), tokens))
        out.append(PackedMicrobatch(tuple(parsed)))
    return tuple(out)


_NESTED = {"memory_probe": MemoryProbe, "graph_stats": GraphStats}


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

    step: int
    loss: Optional[float] = None
    aux_loss: Optional[float] = None
    grad_norm: Optional[float] = None
    nan: bool = False
    skipped: bool = False
    tokens: Optional[int] = None
    microbatches: Optional[int] = None
    cp_sizes: tuple[int, ...] = ()
    lr: Optional[float] = None
    step_time_s: Optional[float] = None
    device: Optional[str] = None
    # The golden platform of the device (``cpu``, ``h200``, ``gb200``: ``golden.platform_key`` of
    # the CUDA device name), set by the rank process (``rank_main``) on every record it writes.
    platform: Optional[str] = None
    allocated_bytes: Optional[int] = None
    reserved_bytes: Optional[int] = None
    active_bytes: Optional[int] = None
    max_allocated_bytes: Optional[int] = None
    graphed: bool = False
    memory_probe: Optional[MemoryProbe] = None
    graph_stats: Optional[GraphStats] = None
    replays: tuple[FrameReplays, ...] = ()  # graphed steps: per (CP size, slot), in that order
    packed: tuple[PackedMicrobatch, ...] = ()  # the step's microbatches, in schedule order

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise ValueError(f"a step record needs an integer 'step' >= 1, got {self.step!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cp_sizes"] = list(self.cp_sizes)
        out["replays"] = [asdict(f) for f in self.replays]
        out["packed"] = [{"groups": [{"cp": g.cp, "sequences": list(g.sequences),
                                      "tokens": g.tokens} for g in mb.groups]}
                         for mb in self.packed]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StepRecord":
        """Read a record (ResultsError naming the key for an unknown or mistyped field)."""
        if "step" not in data:
            raise ResultsError("step record has no 'step'")
        sizes = data.get("cp_sizes", [])
        if not isinstance(sizes, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in sizes):
            raise ResultsError(f"'cp_sizes' must be a list of integers, got {sizes!r}")
        frames = data.get("replays", [])
        if not isinstance(frames, list) or any(not isinstance(f, Mapping) for f in frames):
            raise ResultsError(f"'replays' must be a list of objects, got {frames!r}")
        given: dict[str, Any] = {"cp_sizes": tuple(sizes),
                                 "replays": tuple(_from_fields(FrameReplays, f, "'replays' entry")
                                                  for f in frames),
                                 "packed": parse_packed(data.get("packed", []))}
        for key, kind in _NESTED.items():
            value = data.get(key)
            if value is not None and not isinstance(value, Mapping):
                raise ResultsError(f"'{key}' must be an object or null, got {value!r}")
            given[key] = None if value is None else _from_fields(kind, value, f"'{key}'")
        flat = {k: v for k, v in data.items() if k not in given}
        return _from_fields(cls, flat, "step record", given)


