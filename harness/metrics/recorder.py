"""The record API: any training loop writes the harness's step records itself.

    from harness.metrics import StepRecorder

    recorder = StepRecorder()            # rank from RANK, folder from DCP_HARNESS_METRICS_DIR
    for step in range(1, steps + 1):
        loss, grad_norm = train_step()
        recorder.record(step, loss=loss, grad_norm=grad_norm, step_time_s=elapsed, lr=lr,
                        **cuda_memory(device))
    recorder.close()

Under the harness (a command case with ``metrics: {source: record}``) the launcher sets
``DCP_HARNESS_METRICS_DIR`` to the arm's ``metrics/`` folder and reads ``rank<k>.jsonl`` back from
there; outside it, pass ``folder=``. Each record is a ``harness.results.StepRecord`` validated
before it is written and appended durably (``harness.results.StepWriter``): a resumed run keeps
the steps already recorded. The first record of a process carries its environment (torch, CUDA,
NCCL versions; ``harness.environment``) and every record the device's golden platform. What the
built-in workload records is all here: memory by pool (:func:`cuda_memory`, the
``memory_probe=`` of :func:`memory_probe`), the graph pool's bytes and the capture line
(``graph_stats=GraphStats(...)``, :func:`pool_bytes` of a ``torch.cuda.MemPool``), so every check
of the harness has its data.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from harness.environment import current_environment
from harness.golden import platform_key
from harness.results import GraphStats, MemoryProbe, ResultsError, StepRecord, StepWriter

METRICS_DIR_ENV = "DCP_HARNESS_METRICS_DIR"


def _device_platform(device: Any) -> str:
    import torch

    dev = torch.device(device)
    return platform_key(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else dev.type


class StepRecorder:
    """Writes this rank's step records to ``<folder>/rank<rank>.jsonl`` (see the module doc).
    ``device``: the torch device the rank trains on (default ``cuda:LOCAL_RANK`` with CUDA,
    else ``cpu``); ``environ``: where RANK, LOCAL_RANK and the folder are read (default
    ``os.environ``)."""

    def __init__(self, folder: Union[str, Path, None] = None, rank: Optional[int] = None,
                 device: Any = None, environ: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        where = folder if folder is not None else env.get(METRICS_DIR_ENV)
        if not where:
            raise ValueError(f"StepRecorder needs a folder: pass folder=, or run under the "
                             f"harness (it sets {METRICS_DIR_ENV})")
        self.rank = int(env.get("RANK", "0")) if rank is None else rank
        self.device = device if device is not None else _default_device(env)
        self.platform = _device_platform(self.device)
        self._writer = StepWriter(Path(where), self.rank)
        self._environment = current_environment(self.device)
        self.path = self._writer.path

    def record(self, step: int, **fields: Any) -> bool:
        """Record step ``step`` with ``fields`` of ``StepRecord`` (``loss``, ``grad_norm``,
        ``step_time_s``, ``lr``, ``skipped``, memory bytes, ``memory_probe``, ``graph_stats``,
        ...); ``nan`` is set when the loss or grad norm is not finite. False (nothing written)
        for a step already recorded; a ValueError naming the field for a value a step record
        cannot hold."""
        try:
            record = StepRecord.from_dict({"step": step, "platform": self.platform,
                                           **{k: _plain(v) for k, v in fields.items()}})
        except ResultsError as exc:
            raise ValueError(f"{self.path}: step {step}: {exc}") from None
        if record.environment is None and self._environment is not None:
            record = dataclasses.replace(record, environment=self._environment)
        if not record.nan and not all(v is None or math.isfinite(v)
                                      for v in (record.loss, record.grad_norm)):
            record = dataclasses.replace(record, nan=True)
        written = self._writer.append(record)
        if written:
            self._environment = None
        return written

    def close(self) -> None:
        """Nothing is buffered (each record is fsynced); kept so a loop can say it is done."""


def _plain(value: Any) -> Any:
    """A dataclass field value (``MemoryProbe``, ``GraphStats``) as the dict a record reads."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _default_device(env: Mapping[str, str]) -> Any:
    import torch

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        local = int(env.get("LOCAL_RANK", "0"))
        return f"cuda:{local if local < count else 0}"
    return "cpu"


def cuda_memory(device: Any) -> dict[str, Optional[int]]:
    """This process's caching-allocator bytes on ``device`` after a step: ``allocated_bytes``,
    ``reserved_bytes``, ``active_bytes``, ``max_allocated_bytes`` (None on a CPU device)."""
    import torch

    if torch.device(device).type != "cuda":
        return {"allocated_bytes": None, "reserved_bytes": None, "active_bytes": None,
                "max_allocated_bytes": None}
    stats = torch.cuda.memory_stats(device)
    return {"allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
            "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
            "active_bytes": int(stats.get("active_bytes.all.current", 0)),
            "max_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0))}


def memory_probe(device: Any) -> MemoryProbe:
    """The memory probe the built-in workload takes (after ``torch.cuda.empty_cache()``): the
    whole device's used bytes as this process alone would leave it (less the other processes'
    NVML usage: ``device_memory``), the device's total, and this process's allocated / active /
    reserved."""
    import torch

    from harness.metrics.device_memory import probe

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    seen = probe(device)
    mem = cuda_memory(device)
    return MemoryProbe(device_used_bytes=int(seen.used), device_total_bytes=int(seen.total),
                       allocated_bytes=int(mem["allocated_bytes"] or 0),
                       active_bytes=int(mem["active_bytes"] or 0),
                       reserved_bytes=int(mem["reserved_bytes"] or 0), others_bytes=seen.others)


def pool_bytes(pool: Any) -> tuple[int, int]:
    """(reserved, allocated) bytes of a ``torch.cuda.MemPool`` (a graph pool): what
    ``GraphStats.pool_reserved_bytes`` / ``pool_allocated_bytes`` hold."""
    from harness.slotmem.allocator import pool_bytes as _bytes

    got = _bytes(tuple(pool.id))
    return got.reserved, got.allocated


__all__ = ["METRICS_DIR_ENV", "GraphStats", "MemoryProbe", "StepRecorder", "cuda_memory",
           "memory_probe", "pool_bytes"]
