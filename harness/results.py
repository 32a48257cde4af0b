"""The results store: per-step JSONL records, arm outcomes and atomic JSON files.

Layout of one sweep folder (see docs/internals.md)::

    <sweep>/<case_id>/case.json
    <sweep>/<case_id>/<arm>/rank<k>.jsonl     one JSON object per completed step
    <sweep>/<case_id>/<arm>/outcome.json      ArmOutcome
    <sweep>/<case_id>/<arm>/log.txt
    <sweep>/<case_id>/verdict.json
    <sweep>/summary.md, junit.xml, index.json

Files are standard JSON: a non-finite float is stored as the string ``"NaN"``, ``"Infinity"``
or ``"-Infinity"`` and read back as a float. This module is a leaf (no torch, no workload).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar, Union

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")

CASE_FILE = "case.json"
VERDICT_FILE = "verdict.json"
OUTCOME_FILE = "outcome.json"
LOG_FILE = "log.txt"
SUMMARY_FILE = "summary.md"
JUNIT_FILE = "junit.xml"
INDEX_FILE = "index.json"

ARM_STATUSES = ("ok", "failed", "timeout", "infra", "skipped")

_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")
_NONFINITE_TO_STR = {math.inf: "Infinity", -math.inf: "-Infinity"}
_STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ResultsError(Exception):
    """A results file exists but cannot be used (corrupt line, wrong shape)."""


# --------------------------------------------------------------------------- paths
def case_dir(sweep_dir: PathLike, case_id: str) -> Path:
    return Path(sweep_dir) / case_id


def arm_dir(sweep_dir: PathLike, case_id: str, arm: str) -> Path:
    return Path(sweep_dir) / case_id / arm


def rank_file(arm_dir_: PathLike, rank: int) -> Path:
    return Path(arm_dir_) / f"rank{rank}.jsonl"


# --------------------------------------------------------------------------- JSON helpers
def encode_nonfinite(obj: Any) -> Any:
    """Return ``obj`` with non-finite floats replaced by their string names (tuples -> lists)."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        return _NONFINITE_TO_STR.get(obj, obj)
    if isinstance(obj, Mapping):
        return {str(k): encode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_nonfinite(v) for v in obj]
    return obj


def decode_float(value: Any) -> Optional[float]:
    """A JSON number, null or non-finite name -> float or None. Anything else is an error."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ResultsError(f"expected a number, got a boolean {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _STR_TO_NONFINITE:
        return _STR_TO_NONFINITE[value]
    raise ResultsError(f"expected a number, got {value!r}")


def _decode_record(obj: Any) -> Any:
    if isinstance(obj, str) and obj in _STR_TO_NONFINITE:
        return _STR_TO_NONFINITE[obj]
    if isinstance(obj, dict):
        return {k: _decode_record(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_record(v) for v in obj]
    return obj


def dumps(obj: Any, *, indent: Optional[int] = 2) -> str:
    """Standard JSON (non-finite floats as strings)."""
    return json.dumps(encode_nonfinite(obj), indent=indent, allow_nan=False, ensure_ascii=False)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder + fsync + os.replace."""
    write_bytes_atomic(path, text.encode("utf-8"))


def current_umask() -> int:
    """This process's umask (read from /proc on Linux; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # pragma: no cover - platforms without /proc/self/status
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0666 less the umask."""
    return 0o666 & ~current_umask()


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + os.replace); the file
    gets the mode an ordinary write would (0644 under umask 022), not mkstemp's 0600."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(target.parent)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Write ``obj`` as standard JSON atomically (readers see the old file or the new one)."""
    write_text_atomic(path, dumps(obj) + "\n")


def read_json(path: PathLike) -> Any:
    """Parse a JSON file; raises ResultsError naming the file when it is not valid JSON
    (torn, truncated or not UTF-8)."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ResultsError(f"{p}: not valid JSON ({exc}); delete it and re-run the case") from exc


def read_json_record(path: PathLike, parse: Callable[[Mapping[str, Any]], T]) -> Optional[T]:
    """``parse`` of the JSON object in ``path``; None when there is no such file. A file that is
    not a JSON object, or that ``parse`` rejects (ResultsError), raises ResultsError naming it."""
    p = Path(path)
    if not p.is_file():
        return None
    data = read_json(p)
    if not isinstance(data, dict):
        raise ResultsError(f"{p}: expected a JSON object, got a {type(data).__name__}; "
                           "delete it and re-run the case")
    try:
        return parse(data)
    except ResultsError as exc:
        raise ResultsError(f"{p}: {exc}") from exc


# --------------------------------------------------------------------------- typed step records
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

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise ValueError(f"a step record needs an integer 'step' >= 1, got {self.step!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cp_sizes"] = list(self.cp_sizes)
        out["replays"] = [asdict(f) for f in self.replays]
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
                                                  for f in frames)}
        for key, kind in _NESTED.items():
            value = data.get(key)
            if value is not None and not isinstance(value, Mapping):
                raise ResultsError(f"'{key}' must be an object or null, got {value!r}")
            given[key] = None if value is None else _from_fields(kind, value, f"'{key}'")
        flat = {k: v for k, v in data.items() if k not in given}
        return _from_fields(cls, flat, "step record", given)


# --------------------------------------------------------------------------- step records
def _parse_lines(path: Path, data: bytes) -> tuple[list[dict], int]:
    """Parse complete lines of a JSONL file. Returns (records, byte length of the good prefix).

    The last line is torn when it lacks its newline or does not parse; it is left out. Any
    other bad line is corruption and raises ResultsError.
    """
    records: list[dict] = []
    good = 0
    pos = 0
    lineno = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl
        raw = data[pos:end]
        lineno += 1
        is_last = nl < 0 or nl == len(data) - 1
        if nl < 0:  # no newline: the write was interrupted
            break
        if raw.strip():
            try:
                rec = json.loads(raw.decode("utf-8"))
                if not isinstance(rec, dict):
                    raise ValueError(f"a {type(rec).__name__}, not an object")
            except (ValueError, UnicodeDecodeError) as exc:
                if is_last:
                    break
                raise ResultsError(
                    f"{path}:{lineno}: corrupt step record ({exc}); the file was edited or two "
                    f"writers shared it. Delete the arm folder {path.parent} and re-run."
                ) from exc
            records.append(_decode_record(rec))
        pos = end + 1
        good = pos
    return records, good


def read_rank_file(path: PathLike) -> list[StepRecord]:
    """The typed records of one rank file (a torn last line ignored); ResultsError naming
    file:line for a line that is not a valid step record."""
    p = Path(path)
    out = []
    for lineno, raw in enumerate(_parse_lines(p, p.read_bytes())[0], start=1):
        try:
            out.append(StepRecord.from_dict(raw))
        except ResultsError as exc:
            raise ResultsError(f"{p}: record {lineno}: {exc}. Delete the arm folder {p.parent} "
                               "and re-run") from None
    return out


def read_steps(arm_dir_: PathLike) -> dict[int, list[StepRecord]]:
    """Rank -> typed step records of one arm (a torn last line ignored). Missing folder -> {}."""
    d = Path(arm_dir_)
    out: dict[int, list[dict]] = {}
    if not d.is_dir():
        return out
    for child in d.iterdir():
        m = _RANK_FILE.match(child.name)
        if m and child.is_file():
            out[int(m.group(1))] = read_rank_file(child)
    return dict(sorted(out.items()))


class StepWriter:
    """Appends one rank's step records to ``<arm_dir>/rank<k>.jsonl``, durably per step.

    Each record must hold an integer ``step`` (1-based). Every append is flushed and fsynced,
    so a killed run loses at most the step in flight. On open, a torn last line (left by a kill
    mid-write) is cut off. With ``resume=True`` (default) existing records are kept and a record
    whose step is not after the last recorded step is dropped (``append`` returns False), so a
    resumed arm never duplicates steps; ``resume=False`` starts the file afresh.
    """

    def __init__(self, arm_dir: PathLike, rank: int, *, resume: bool = True) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        self.path = rank_file(arm_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._last_step = 0
        if resume and self.path.exists():
            data = self.path.read_bytes()
            records, good = _parse_lines(self.path, data)
            if good != len(data):
                with open(self.path, "r+b") as fh:
                    fh.truncate(good)
                    fh.flush()
                    os.fsync(fh.fileno())
            self._last_step = max((_step_of(r, self.path) for r in records), default=0)
        else:
            with open(self.path, "wb") as fh:
                fh.flush()
                os.fsync(fh.fileno())
            _fsync_dir(self.path.parent)

    def completed_steps(self) -> int:
        """Number of the last durably recorded step (0 when none): resume after it."""
        return self._last_step

    def append(self, record: Union[StepRecord, Mapping[str, Any]]) -> bool:
        """Write one step record durably. Returns False (and writes nothing) for a step that is
        already recorded; raises ValueError for a record without a valid ``step`` (a mapping is
        read through :meth:`StepRecord.from_dict`, so what is written can be read back)."""
        if not isinstance(record, StepRecord):
            _step_of(record, self.path)
            try:
                record = StepRecord.from_dict(record)
            except ResultsError as exc:
                raise ValueError(f"{self.path}: {exc}") from None
        step = record.step
        if step <= self._last_step:
            return False
        line = json.dumps(encode_nonfinite(record.to_dict()), allow_nan=False, ensure_ascii=False)
        with open(self.path, "ab") as fh:
            fh.write(line.encode("utf-8") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._last_step = step
        return True


def _step_of(record: Mapping[str, Any], where: Path) -> int:
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"{where}: a step record needs an integer 'step' >= 1, got {step!r}")
    return step


# --------------------------------------------------------------------------- arm outcome
@dataclass(frozen=True)
class ArmOutcome:
    """How one arm's run ended.

    status: ``ok`` (every rank exited 0), ``failed`` (a rank crashed), ``timeout`` (the arm ran
    past its limit), ``infra`` (the launcher/cluster failed: node lost, job never started),
    ``skipped`` (not run: this machine cannot run it, e.g. no CUDA; ``detail`` says why).
    ``repro`` is a one-line shell command that re-runs the arm; ``log_tail`` the last log lines
    (plus stacks of hung ranks); ``restarts`` how often it was requeued/resumed.
    """

    status: str
    returncode: Optional[int] = None
    wall_s: float = 0.0
    log_tail: str = ""
    repro: str = ""
    restarts: int = 0
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in ARM_STATUSES:
            raise ValueError(f"ArmOutcome.status must be one of {ARM_STATUSES}, got {self.status!r}")
        if self.restarts < 0:
            raise ValueError(f"ArmOutcome.restarts must be >= 0, got {self.restarts}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """One line, e.g. ``timeout after 1800.0 s (returncode None): ranks 1 hung``."""
        if self.status == "skipped":
            return f"skipped: {self.detail}"
        what = {"ok": "ok", "failed": "failed", "timeout": "timeout", "infra": "infrastructure failure"}
        text = f"{what[self.status]} after {self.wall_s:.1f} s (returncode {self.returncode})"
        return f"{text}: {self.detail}" if self.detail else text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ArmOutcome":
        known = {"status", "returncode", "wall_s", "log_tail", "repro", "restarts", "detail"}
        unknown = set(data) - known
        if unknown:
            raise ResultsError(f"outcome has unknown keys {sorted(unknown)}")
        if "status" not in data:
            raise ResultsError("outcome has no 'status'")
        rc = data.get("returncode")
        try:
            return cls(
                status=str(data["status"]),
                returncode=None if rc is None else int(rc),
                wall_s=decode_float(data.get("wall_s", 0.0)) or 0.0,
                log_tail=str(data.get("log_tail", "")),
                repro=str(data.get("repro", "")),
                restarts=int(data.get("restarts", 0)),
                detail=str(data.get("detail", "")),
            )
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"bad outcome: {exc}") from exc


def write_outcome(arm_dir_: PathLike, outcome: ArmOutcome) -> Path:
    path = Path(arm_dir_) / OUTCOME_FILE
    write_json_atomic(path, outcome.to_dict())
    return path


def read_outcome(arm_dir_: PathLike) -> Optional[ArmOutcome]:
    """The arm's outcome, or None when it has none yet (never ran or never finished)."""
    return read_json_record(Path(arm_dir_) / OUTCOME_FILE, ArmOutcome.from_dict)


def list_arm_dirs(case_dir_: PathLike) -> dict[str, Path]:
    """Arm name -> folder for every sub-folder of a case holding an outcome or rank files."""
    d = Path(case_dir_)
    out: dict[str, Path] = {}
    if not d.is_dir():
        return out
    for child in sorted(d.iterdir()):
        if not child.is_dir():
            continue
        if (child / OUTCOME_FILE).is_file() or any(
            _RANK_FILE.match(p.name) for p in child.iterdir()
        ):
            out[child.name] = child
    return out
