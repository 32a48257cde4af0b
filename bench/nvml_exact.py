"""Is NVML's per-process memory accounting exact on this GPU? (issue 50, item 1)

Run on a machine with one idle NVIDIA GPU (nothing else on it)::

    python bench/nvml_exact.py [--json OUT.json]

It starts worker processes (each: torch, a CUDA context, tensors of the sizes asked), and at
quiet moments (every worker between two commands) reads, in the parent: NVML's device memory
(``nvmlDeviceGetMemoryInfo``: used), NVML's per-process ``usedGpuMemory`` of every compute
process, and in each worker ``torch.cuda.mem_get_info`` (total - free, what the workload's memory
probe records as ``device_used_bytes``). Two identities are checked, in bytes:

* ``device``: NVML used == baseline + the sum of every process's ``usedGpuMemory``, where the
  baseline is NVML used with no process (the driver's own reservation);
* ``as alone``: a worker's ``device_used_bytes`` measured with neighbours on the device, less
  its neighbours' ``usedGpuMemory`` (``harness.metrics.device_share``'s figure), equals the same
  worker's figure measured alone before the neighbours came, to the byte.

Exit 0 when both hold in every scenario, 1 otherwise; a table per scenario either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

GIB = 2**30
MIB = 2**20

WORKER = r"""
import json, os, sys, torch
torch.cuda.init(); dev = torch.device("cuda:0"); torch.empty(1, device=dev)
held = []
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "alloc":
        held.append(torch.empty(int(arg), dtype=torch.uint8, device=dev))
    elif cmd == "free":
        held.clear(); torch.cuda.empty_cache()
    elif cmd == "transient":  # allocate, free, keep the cache (reserved, not allocated)
        t = torch.empty(int(arg), dtype=torch.uint8, device=dev); del t
    elif cmd == "probe":
        torch.cuda.synchronize(); torch.cuda.empty_cache()
    elif cmd == "quit":
        break
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info(dev)
    print(json.dumps({"pid": os.getpid(), "used": total - free, "total": total,
                      "reserved": torch.cuda.memory_reserved(dev)}), flush=True)
"""


class Worker:
    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.pid = self.p.pid
        self.last: dict[str, Any] = self.ask("probe")

    def ask(self, cmd: str) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        self.last = json.loads(self.p.stdout.readline())
        return self.last

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        self.p.wait(30)


def nvml_view(h: Any) -> dict[str, Any]:
    import pynvml

    info = pynvml.nvmlDeviceGetMemoryInfo(h)
    procs = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    out = {"used": int(info.used), "total": int(info.total), "free": int(info.free),
           "procs": procs}
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        out["used_v2"], out["reserved_v2"] = int(v2.used), int(v2.reserved)
    except Exception as exc:  # older bindings or driver
        out["v2"] = f"{type(exc).__name__}: {exc}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows: list[dict[str, Any]] = []
    ok = True
    base = nvml_view(h)
    if base["procs"]:
        print(f"the GPU is not idle: processes {base['procs']}; run this alone")
        return 2
    baseline = base["used"]
    print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, baseline used {baseline / MIB:.1f} MiB "
          f"of {base['total'] / MIB:.0f} MiB; v2: {base.get('used_v2', base.get('v2'))}")

    def check(name: str, workers: list[Worker]) -> None:
        nonlocal ok
        view = nvml_view(h)
        procs = view["procs"]
        dev_ok = view["used"] == baseline + sum(procs.values())
        line = {"scenario": name, "nvml_used": view["used"], "sum_procs": sum(procs.values()),
                "baseline": baseline, "device_identity": dev_ok, "workers": []}
        for w in workers:
            others = sum(v for pid, v in procs.items() if pid != w.pid)
            line["workers"].append({"pid": w.pid, "nvml_own": procs.get(w.pid),
                                    "device_used": w.last["used"],
                                    "as_alone": w.last["used"] - others,
                                    "cuda_vs_nvml_used": w.last["used"] - view["used"]})
        ok &= dev_ok
        rows.append(line)
        print(f"{name}: NVML used {view['used'] / MIB:.1f} MiB = baseline + procs "
              f"{(baseline + sum(procs.values())) / MIB:.1f}: {dev_ok}; " + "; ".join(
                  f"pid {x['pid']} own {x['nvml_own'] and x['nvml_own'] / MIB} MiB, mem_get_info "
                  f"used - NVML used {x['cuda_vs_nvml_used'] / MIB:+.1f} MiB, as alone "
                  f"{x['as_alone'] / MIB:.1f} MiB" for x in line["workers"]))

    def alone_then_packed(name: str, first: list[str], neighbours: list[list[str]]) -> None:
        nonlocal ok
        a = Worker()
        for c in first:
            a.ask(c)
        a.ask("probe")
        check(f"{name}: A alone", [a])
        alone = a.last["used"]
        others = []
        for cmds in neighbours:
            w = Worker()
            for c in cmds:
                w.ask(c)
            others.append(w)
        a.ask("probe")  # every worker idle from here until the check
        check(f"{name}: A beside {len(others)}", [a, *others])
        as_alone = rows[-1]["workers"][0]["as_alone"]
        same = as_alone == alone
        ok &= same
        rows[-1]["as_alone_equal"] = same
        print(f"  {name}: A's figure alone {alone / MIB:.1f} MiB, beside neighbours less their "
              f"NVML usage {as_alone / MIB:.1f} MiB: {'equal' if same else 'DIFFERS'} "
              f"({(as_alone - alone) / MIB:+.3f} MiB)")
        for w in [a, *others]:
            w.close()

    t0 = time.time()
    alone_then_packed("context only", [], [[]])
    alone_then_packed("4 GiB beside 7 GiB", [f"alloc {4 * GIB}"], [[f"alloc {7 * GIB}"]])
    alone_then_packed("odd sizes, 3 neighbours", [f"alloc {3 * GIB + 12345}", f"alloc {777 * MIB}"],
                      [[f"alloc {GIB + 1}"], [f"transient {5 * GIB}"], [f"alloc {20 * MIB}"]])
    alone_then_packed("after empty_cache", [f"alloc {6 * GIB}", "free", f"alloc {GIB}"],
                      [[f"alloc {2 * GIB}", "free"], [f"alloc {9 * GIB}"]])
    print(f"nvml_exact: {'exact' if ok else 'NOT exact'} in every scenario ({time.time() - t0:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"baseline": baseline, "rows": rows, "exact": ok}, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
