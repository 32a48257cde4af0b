"""The whole device's memory as this process alone would leave it: the memory probe's
``device_used_bytes`` when other processes share the GPU (issue 50).

``torch.cuda.mem_get_info`` says what the whole device holds: every process's allocations and
CUDA contexts, and the driver's own reservation. An arm run beside others on one GPU (the local
backend's GPU jobs, ``dcp-harness run --gpu-jobs``) would count its neighbours too. NVML accounts
device memory per process (``nvmlDeviceGetComputeRunningProcesses``: ``usedGpuMemory``), so
:func:`device_used_alone` takes the whole device's figure less the other processes' usage: on a
device this process has to itself, the same bytes as before (nothing to subtract); beside
neighbours, the figure it would have had alone, exactly where NVML's accounting is exact
(``bench/nvml_exact.py`` checks that identity on a GPU, to the byte).

The other processes' usage is read before and after ``mem_get_info``, again until both readings
agree (a neighbour that allocated in between would make the difference wrong). Without NVML
(``pynvml`` from the ``nvidia-ml-py`` package not importable, or no NVML on this machine) nothing
is subtracted and ``others`` is None: the whole device's figure, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

ATTEMPTS = 20  # readings of the other processes until two in a row agree


@dataclass(frozen=True)
class DeviceUsed:
    """``used``: the whole device's used bytes less ``others`` (None: not read, nothing
    subtracted); ``total``: the device's bytes."""

    used: int
    total: int
    others: Optional[int]


def nvml_others(index: int, pid: int) -> Optional[Callable[[], int]]:
    """A reader of the bytes NVML accounts to compute processes other than ``pid`` on the GPU of
    NVML index ``index``, or None where NVML cannot be read or does not list ``pid`` (a process
    with a CUDA context there: called from the probe)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # no package, no driver library, no device: the whole device's figure
        return None

    def read() -> int:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid != pid)

    try:  # NVML must list this process (it holds a CUDA context): else its process ids are not
        # this process's (another PID namespace) and telling the others apart is not possible
        if pid not in {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}:
            return None
    except Exception:
        return None
    return read


def device_used_alone(mem_get_info: Callable[[], tuple[int, int]],
                      others: Optional[Callable[[], int]]) -> DeviceUsed:
    """The whole device's used bytes (``mem_get_info() -> (free, total)``) less what ``others()``
    says the other processes hold, read around it until two readings agree."""
    if others is None:
        free, total = mem_get_info()
        return DeviceUsed(total - free, total, None)
    before = others()
    for _ in range(ATTEMPTS):
        free, total = mem_get_info()
        after = others()
        if after == before:
            return DeviceUsed(total - free - after, total, after)
        before = after
    raise RuntimeError(f"the other processes on the GPU changed their memory in each of {ATTEMPTS} "
                       "readings around the memory probe; run the arm alone (--gpu-jobs 1)")


def nvml_index(device: Any) -> int:
    """NVML's index of torch CUDA device ``device``: ``CUDA_VISIBLE_DEVICES`` maps torch's
    ordinals onto NVML's (torch's own mapping, which reads UUIDs there too; else the plain
    indices of that variable)."""
    import torch

    try:
        return int(torch.cuda._get_nvml_device_index(device))
    except Exception:  # a torch without it
        ordinal = torch.device(device).index or 0
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                   if v.strip()]
        if ordinal < len(visible) and visible[ordinal].isdigit():
            return int(visible[ordinal])
        return ordinal


def probe(device: Any) -> DeviceUsed:
    """This process's view of CUDA ``device`` after the caller emptied the allocator's cache:
    :func:`device_used_alone` with NVML's other processes."""
    import torch

    return device_used_alone(lambda: torch.cuda.mem_get_info(device),
                             nvml_others(nvml_index(device), os.getpid()))
