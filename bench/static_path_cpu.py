"""The GPU mutation rows' faults, seen on CPU: static-shape eager arm vs the dynamic reference.

A graph case's arms need CUDA, but its eager arm (static shapes: fixed buffers, device-side
metadata, the static MoE with scope ``full``) and its reference arm (the ordinary dynamic-shape
path on one rank) also run on CPU. For a tiny graph case this prints, clean and with each fault of
``bench/mutations.py --gpu`` applied (one line patched in a temporary copy, as there), the worst
relative difference over 4 steps between the two arms per metric: what the reference pair of the
GPU case compares. Clean, the two paths agree to fp32-parity noise; a fault in the static path
moves only the static arm::

    python bench/static_path_cpu.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import mutations  # noqa: E402

# Runs inside the (patched) copy: both arms of a tiny graph case on CPU, worst rel per metric.
PROBE = r"""
import json, os, sys
import torch.distributed as dist
from harness.arms import plan_case
from harness.launch.ranks.ports import pick_free_port
from harness.spec.presets import resolve_model
from harness.spec.schema import Case, ModelSpec
from harness.workload import RankContext, train_arm

scope = sys.argv[1]
case = Case.model_validate(dict(
    id="g", name="g", source="<probe>", model=resolve_model(ModelSpec(layers=2)).model_dump(),
    parallel={}, train=dict(steps=4, global_batch=8, seq_length=128, lr=3e-3, seed=3,
                            deterministic=True, dtype="bf16", max_seqs_per_microbatch=8,
                            checkpoint_every=0),
    data={"lengths": {"distribution": "lognormal", "min": 8, "max": 128}},
    compare={"graph_vs_eager": {}, "reference": {}}, graphs={"scope": scope, "warmup_steps": 2},
    resources={"gpus_per_node": 1}))
plan = plan_case(case)
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(pick_free_port()))
dist.init_process_group("gloo", rank=0, world_size=1)
runs = {}
for name in ("eager", "reference"):
    records = []
    train_arm(plan.arm(name).case, RankContext(0, 1, 0, "cpu", "none"), records.append)
    runs[name] = records
worst = {}
for a, b in zip(runs["eager"], runs["reference"]):
    for key in ("loss", "grad_norm", "aux_loss"):
        x, y = getattr(a, key), getattr(b, key)
        worst[key] = max(worst.get(key, 0.0), abs(x - y) / abs(y))
print(json.dumps(worst))
"""


def probe(root: Path, scope: str) -> dict:
    env = {**os.environ, "PYTHONPATH": mutations.copy_pythonpath(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE, scope], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"probe failed in {root}:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    rows = [("clean", None, scope) for scope in ("attn", "full")]
    rows += [(m.name, m, "full" if m.select and m.select.endswith("full") else "attn")
             for m in mutations.MUTATIONS if m.gpu]
    print("| fault | scope | worst rel loss | worst rel grad norm | worst rel aux loss |")
    print("|---|---|---|---|---|")
    for name, m, scope in rows:
        root = Path(tempfile.mkdtemp(prefix=f"dcp-static-{name}-"))
        try:
            mutations.copy_repo(root)
            if m is not None:
                mutations.apply(root, m)
            w = probe(root, scope)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"| {name} | {scope} | {w['loss']:.2e} | {w['grad_norm']:.2e} | "
              f"{w['aux_loss']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
