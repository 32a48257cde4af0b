"""How a local sweep placed its arms on the GPU: ``<sweep>/placement.json`` (issue 50).

The local backend's GPU lane (``harness.launch.gpu_lane``) runs several arms at once on one GPU
where their figures allow it (``harness.launch.gpu_jobs``) and writes, as each arm ends, one
:class:`PlacedArm` per arm it ran: its predicted bytes, whether it ran alone and why, when it
started and ended, and the arms that ran beside it. ``--gpu-jobs 1`` (serial) records the same,
every arm alone. The reports say how the sweep was placed from this file (``summary.md``); a sweep
run again into the same folder keeps the arms of earlier runs it did not run again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from pydantic import ConfigDict

from .files import PathLike
from .records import Bool, Float, Int, Str
from .typed import read_json_record, write_json_record

PLACEMENT_FILE = "placement.json"
_FORBID = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class PlacedArm:
    """One arm the GPU lane ran."""

    __pydantic_config__ = _FORBID

    case_id: Str
    arm: Str
    bytes: Int  # predicted bytes on its GPU (its ranks at once, their CUDA contexts)
    predicted: Bool  # from the memory plan (False: a stand-in, the arm has no memory plan)
    ranks_at_once: Int  # of its emulated ranks, how many ran side by side on one GPU
    started_at: Float  # epoch seconds
    ended_at: Float
    alone: Optional[Str] = None  # why it ran with nothing beside it (None: it could share)
    beside: tuple[Str, ...] = ()  # "case / arm" of every arm that ran while it ran


@dataclass(frozen=True)
class Placement:
    """``placement.json``: the GPU lane's setting and every arm it placed."""

    __pydantic_config__ = _FORBID

    gpu_jobs: Int  # the most arms at once (1: serial)
    capacity_bytes: Int  # the predicted bytes arms side by side may use on a GPU
    per_process_memory: Bool  # NVML's per-process accounting read: device_used is an arm's own
    arms: tuple[PlacedArm, ...] = ()
    note: Optional[Str] = None  # how the setting was chosen

    def most_at_once(self) -> int:
        """The most arms that ran at the same time."""
        best = 0
        for a in self.arms:
            at = sum(1 for b in self.arms if b.started_at <= a.started_at < b.ended_at)
            best = max(best, at)
        return best

    def summary(self) -> str:
        """One line for the reports."""
        alone = [a for a in self.arms if a.alone]
        if self.gpu_jobs == 1:
            return (f"GPU arms one after another (--gpu-jobs 1): {len(self.arms)} arm(s); "
                    f"{PLACEMENT_FILE}")
        return (f"GPU arms placed by predicted memory: up to {self.gpu_jobs} at once, "
                f"{self.capacity_bytes / 2**30:.0f} GiB; {len(self.arms)} arm(s), at most "
                f"{self.most_at_once()} ran at once, {len(alone)} alone (a neighbour would move "
                f"a judged figure); whole-device memory "
                f"{'per process (NVML)' if self.per_process_memory else 'of the whole device'}; "
                f"{PLACEMENT_FILE}")


def placement_path(sweep: PathLike) -> Path:
    return Path(sweep) / PLACEMENT_FILE


def read_placement(sweep: PathLike) -> Optional[Placement]:
    """The sweep's placement, or None where its GPU lane placed nothing (a ResultsError naming
    the file when it cannot be read)."""
    return read_json_record(placement_path(sweep), Placement, "GPU placement")


def record_placed(sweep: PathLike, setting: Placement, arm: PlacedArm) -> Path:
    """Add ``arm`` to the sweep's ``placement.json`` under ``setting`` (its arms ignored), over
    an earlier record of the same arm."""
    old = read_placement(sweep)
    kept = tuple(a for a in (old.arms if old else ())
                 if (a.case_id, a.arm) != (arm.case_id, arm.arm))
    return write_json_record(placement_path(sweep), replace(setting, arms=kept + (arm,)))
