"""A resumed arm's checkpoint, saved several ways side by side, against the disk's own speed.

Builds the state one rank of a case checkpoints (its model chunks, initialised as the run does,
and its optimizer state after one step, the real shapes and dtypes), on this machine's GPU when
there is one, and saves it with each method in turn, ``--repeats`` rounds, into ``--dir``:

  harness         ``harness.workload.checkpoint.save`` as it is now, durable (a periodic one)
  harness-resume  the same, not durable (the harness's stop of a ``-resumed`` arm)
  fsync           torch.save into a Python file, no CRC32, then fsync (the save before this bench)
  no-fsync        the same without the fsync
  pinned          the same with torch's ``use_pinned_memory_for_d2h``
  path            torch.save to a path (torch's own writer) instead of a Python file, no fsync
  staged          every tensor copied to the host first (timed apart), then saved as ``path``

and writes the same number of bytes with ``dd`` (the disk's rate, with and without fdatasync).
Between methods the page cache is written back (``sync``, not timed) so one method's dirty pages
do not slow the next. Each saved file is then loaded as a resumed arm does (memory-mapped) and
checked equal to the state, tensor by tensor.

Run from the repository root (a GPU machine for a CUDA state)::

    python bench/checkpoint_save.py [--case cases/focused/gpu1-qwen3-graphs.yaml] [--repeats 2]
                                    [--dir DIR] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.serialization import config as serialization_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from harness.spec import load_cases  # noqa: E402
from harness.workload import checkpoint  # noqa: E402
from harness.workload.model import build_chunks  # noqa: E402
from harness.workload.optim import make_optimizer  # noqa: E402

DEFAULT_CASE = "cases/focused/gpu1-qwen3-graphs.yaml"


def rank_state(case_path: str, device: torch.device) -> dict[str, Any]:
    """The state rank 0 of the case's first matrix entry checkpoints (``train._state``'s keys)."""
    case = load_cases([case_path])[0]
    par = case.parallel
    chunks = build_chunks(case.model, case.train.seed, par.pp, par.vpp, 0, par.ep, 0, device)
    params = [p for c in chunks for p in c.parameters()]
    opt = make_optimizer(params, case.train)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()  # creates every optimizer state tensor, as after a real step
    for p in params:
        p.grad = None
    return {"step": 10, "case_id": case.id, "rank": 0, "world_size": 1,
            "chunks": [c.state_dict() for c in chunks], "optimizer": opt.state_dict()}


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


def to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to("cpu")
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


def _sync_device() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _to_file(state: Any, path: Path, *, fsync: bool, pinned: bool = False) -> dict[str, float]:
    t0 = time.perf_counter()
    with open(path, "wb") as f, serialization_config.patch(
            {"save.compute_crc32": False, "save.use_pinned_memory_for_d2h": pinned}):
        torch.save(state, f)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    return {"total": time.perf_counter() - t0}


def _to_path(state: Any, path: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    with serialization_config.patch({"save.compute_crc32": False}):
        torch.save(state, str(path))
    return {"total": time.perf_counter() - t0}


def _staged(state: Any, path: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    host = to_host(state)
    _sync_device()
    t1 = time.perf_counter()
    with serialization_config.patch({"save.compute_crc32": False}):
        torch.save(host, str(path))
    t2 = time.perf_counter()
    return {"total": t2 - t0, "to host": t1 - t0}


def _harness(state: Any, path: Path, durable: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    saved = checkpoint.save(path.parent / "harness", 0, 10, state, durable=durable)
    took = time.perf_counter() - t0
    os.replace(saved, path)
    return {"total": took}


METHODS: dict[str, Callable[[Any, Path], dict[str, float]]] = {
    "harness": lambda s, p: _harness(s, p, durable=True),
    "harness-resume": lambda s, p: _harness(s, p, durable=False),
    "fsync": lambda s, p: _to_file(s, p, fsync=True),
    "no-fsync": lambda s, p: _to_file(s, p, fsync=False),
    "pinned": lambda s, p: _to_file(s, p, fsync=False, pinned=True),
    "path": _to_path,
    "staged": _staged,
}


def dd_rate(folder: Path, size: int) -> dict[str, float]:
    """Seconds ``dd`` takes to write ``size`` bytes into ``folder``, with and without fdatasync."""
    out: dict[str, float] = {}
    count = max(1, size // (64 << 20))
    for name, extra in (("dd", []), ("dd + fdatasync", ["conv=fdatasync"])):
        target = folder / "dd.bin"
        os.sync()
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=64M", f"count={count}", *extra],
                       check=True, capture_output=True)
        out[name] = time.perf_counter() - t0
        target.unlink()
    return out


def equal_after_load(state: Any, path: Path) -> bool:
    loaded = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    mine, theirs = tensors(state), tensors(loaded)
    return len(mine) == len(theirs) and all(
        torch.equal(a.cpu(), b) for a, b in zip(mine, theirs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default=DEFAULT_CASE)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    state = rank_state(args.case, device)
    _sync_device()
    size = sum(t.numel() * t.element_size() for t in tensors(state))
    print(f"state of {args.case} rank 0 on {device}: {len(tensors(state))} tensors, "
          f"{size / 2**30:.2f} GiB (built in {time.perf_counter() - t0:.1f} s)", flush=True)
    folder = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    equal: dict[str, bool] = {}
    for _ in range(args.repeats):
        for name in args.methods:
            path = folder / f"{name}.pt"
            os.sync()
            times[name].append(METHODS[name](state, path))
            if name not in equal:
                equal[name] = equal_after_load(state, path)
            path.unlink()
            print(f"  {name}: {times[name][-1]}", flush=True)
    disk = dd_rate(folder, size)
    rows = []
    print(f"\n| method | seconds (median of {args.repeats}) | GB/s | parts | restored equal |")
    print("|---|---|---|---|---|")
    for name in args.methods:
        total = statistics.median(t["total"] for t in times[name])
        parts = ", ".join(f"{k} {statistics.median(t[k] for t in times[name]):.1f} s"
                          for k in times[name][0] if k != "total")
        rows.append({"method": name, "seconds": total, "equal": equal[name], "runs": times[name]})
        rate = f"{size / total / 1e9:.2f}" if total > 0 else "-"
        print(f"| {name} | {total:.2f} | {rate} | {parts or '-'} | "
              f"{'yes' if equal[name] else 'NO'} |")
    for name, took in disk.items():
        print(f"| {name} (zeros, same bytes) | {took:.2f} | {size / took / 1e9:.2f} | - | - |")
    if args.json is not None:
        args.json.write_text(json.dumps({"case": args.case, "device": str(device), "bytes": size,
                                         "rows": rows, "dd": disk}, indent=1))
    return 0 if all(equal.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
