"""Preflight that knows the device: a case's predicted peak per rank against its GPUs' memory.

:func:`device_target` turns what a Slurm profile says (``gpu_memory_gib``, ``torch_version``) into
a :class:`MemoryTarget`; :func:`job_memory` plans a case for it (None for a case without a memory
plan); :func:`refusal` is the ``ConfigError`` text of a case that does not fit, with the
predicted bytes by part. One rule: a case fits when every rank's expected peak is at most the
device's memory."""

from __future__ import annotations

from typing import Optional

from harness.memplan.predict import MemoryPlanError, predict_case
from harness.memplan.records import MIB, CaseMemory, MemoryTarget
from harness.spec.schema import Case

GIB = 2**30


def native_gqa_of(torch_version: Optional[str]) -> Optional[bool]:
    """Whether a torch of ``torch_version`` hands fewer K/V heads to flash varlen (``enable_gqa``
    came with torch 2.12); None when the version is not given."""
    if not torch_version:
        return None
    try:
        major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        raise ValueError(f"torch_version {torch_version!r} is not a version like 2.11 or 2.12.1") from None
    return (major, minor) >= (2, 12)


def device_target(gpu_memory_gib: Optional[float], torch_version: Optional[str]) -> MemoryTarget:
    return MemoryTarget(native_gqa_of(torch_version),
                        None if gpu_memory_gib is None else int(gpu_memory_gib * GIB))


def job_memory(case: Case, target: MemoryTarget) -> Optional[CaseMemory]:
    """The memory plan of ``case``'s ranks (the emulated ones, or every PP stage), or None when
    the case has no memory plan (dynamic shapes, fp32)."""
    lay = case.layout
    stages = None
    if case.emulate is not None:
        stages = sorted({lay.pp_rank(r) for r in case.emulate.ranks})
    try:
        return predict_case(case, target, pp_ranks=stages)
    except MemoryPlanError:
        return None


def rank_peaks_text(case: Case, cm: CaseMemory) -> str:
    """``rank 0..1 59,937 MiB, ...``: the expected peak of each (emulated) rank, by stage."""
    parts = []
    for r in cm.ranks:
        ranks = [x for x in r.ranks if case.emulate is None or x in case.emulate.ranks]
        if not ranks:
            continue
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}..{ranks[-1]}"
        parts.append(f"{who} {r.peak_bytes / MIB:,.0f} MiB")
    return ", ".join(parts)


def refusal(case: Case, cm: CaseMemory, profile: str) -> Optional[str]:
    """Why ``case`` cannot run on ``profile``'s GPUs (None: every rank fits)."""
    dev = cm.target.device_bytes
    if dev is None or cm.fits():
        return None
    worst = max(cm.ranks, key=lambda r: r.peak_bytes)
    parts = ", ".join(f"{k} {v / MIB:,.0f}" for k, v in worst.parts().items())
    return (f"case '{case.id}' ({case.source}): predicted peak {worst.peak_bytes / MIB:,.0f} MiB on PP "
            f"stage {worst.pp_rank} (ranks {list(worst.ranks)}) exceeds profile '{profile}''s "
            f"{dev / MIB:,.0f} MiB (gpu_memory_gib) by {(worst.peak_bytes - dev) / MIB:,.0f} MiB; "
            f"by part, MiB: {parts} (dcp-harness plan {case.source} --memory). Shorten "
            "train.max_seqlen_per_rank / seq_length, use more PP stages, or fewer layers")
