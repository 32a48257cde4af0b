#!/usr/bin/env bash
# Megatron-LM's own pretrain_gpt.py under the harness on one GPU, from the repository root:
#     bash bench/megatron_gpu.sh
# runs cases/megatron/pretrain-gpt-tiny.yaml (a tiny GPT on Megatron's mock data, Megatron's local
# transformer layers: no Transformer Engine, no apex; eager, its repeat, the graph arm with
# --cuda-graph-impl local, and eager-resumed: saved at iteration 10, exited, loaded, on to 20;
# compared bitwise) through `python3 -m harness run`, then the gate.
#
# Needs (bench/megatron_fetch.md says how): the Megatron-LM sources in .megatron/ (git-ignored:
# carry it), the harness's own packages importable (pydantic, submitit: the .whl folder, as for
# bench/gpu_check.sh), and on the machine Python >= 3.12 (Megatron uses typing.override), torch
# with CUDA, triton, numpy, packaging, tensorboard (Megatron writes no event file without it),
# pybind11 and a C++ compiler (Megatron's dataset index helpers are C++, built here once).
#
# Writes to $OUT (default ./gpu-logs): megatron_gpu.log (everything printed), megatron.md (the
# figures: per arm its steps, losses, step time, memory; the verdict's pairs, the graph_vs_eager
# pair's memory checks and the resume pair's checks), megatron_resume.md (per iteration, eager vs eager-resumed from both Megatron's
# TensorBoard scalars and its log lines: bench/resume_series.py), megatron.tgz (the sweep:
# records, verdict, reports, every arm's log.txt and TensorBoard files; no checkpoints). Exit code: the
# gate's (0 pass, 1 a check failed, 2 errors), 2 when something it needs is missing.
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
LOG=$OUT/megatron_gpu.log
CASE=cases/megatron/pretrain-gpt-tiny.yaml
MEG=$PWD/.megatron
SWEEP=${SWEEP:-$(mktemp -d)/megatron}
: > "$LOG"
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
fail() { say "$*"; exit 2; }

[ -f "$MEG/pretrain_gpt.py" ] || fail "no $MEG/pretrain_gpt.py: unpack Megatron-LM there" \
    "(bench/megatron_fetch.md) and carry .megatron"

say "environment"
{ nvidia-smi -L; $PY - <<'EOF'
import importlib, sys
import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"python {sys.version.split()[0]}  torch {torch.__version__} (CUDA {torch.version.cuda})  "
      f"GPU {gpu}")
for name in ("triton", "numpy", "packaging", "tensorboard", "pybind11", "einops",
             "transformer_engine", "apex", "pydantic", "submitit"):
    try:
        print(f"  {name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except ImportError as exc:
        print(f"  {name}: not importable ({exc})")
EOF
} 2>&1 | tee -a "$LOG"

say "Megatron-LM imports (.megatron)"
(cd "$MEG" && $PY -c "import megatron.core, megatron.training, gpt_builders, model_provider
from megatron.core.package_info import __version__
print('megatron-core', __version__)") 2>&1 | tee -a "$LOG" || fail "Megatron-LM does not import here"

# Megatron runs `make -C megatron/core/datasets` on rank 0 at every start; its Makefile names the
# library with `python3-config --extension-suffix` and compiles with `python3 -m pybind11`.
# Build it here once; where make or python3-config is missing, stand-ins on PATH: make succeeds
# when the library is built, python3-config prints this Python's suffix.
say "Megatron's dataset helpers (C++)"
DS=$MEG/megatron/core/datasets
SUFFIX=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ ! -f "$DS/helpers_cpp$SUFFIX" ]; then
    ${CXX:-c++} -O3 -Wall -shared -std=c++17 -fPIC $($PY -m pybind11 --includes) \
        "$DS/helpers.cpp" -o "$DS/helpers_cpp$SUFFIX" 2>&1 | tee -a "$LOG" \
        || fail "cannot compile $DS/helpers.cpp (a C++ compiler and pybind11 are needed)"
fi
SHIMS=$(mktemp -d)
command -v make >/dev/null || printf '#!/bin/sh\ntest -f %s\n' "$DS/helpers_cpp$SUFFIX" > "$SHIMS/make"
command -v python3-config >/dev/null || printf '#!/bin/sh\necho %s\n' "$SUFFIX" > "$SHIMS/python3-config"
chmod +x "$SHIMS"/* 2>/dev/null
export PATH=$SHIMS:$PATH
ls -l "$DS"/helpers_cpp* "$SHIMS" 2>&1 | tee -a "$LOG"

say "python3 -m harness run $CASE --out $SWEEP"
$PY -m harness run "$CASE" --out "$SWEEP" 2>&1 | tee -a "$LOG"
say "python3 -m harness gate $SWEEP"
$PY -m harness gate "$SWEEP" 2>&1 | tee -a "$LOG"
gate_rc=$?

say "figures -> $OUT/megatron.md"
$PY - "$SWEEP" "$OUT/megatron.md" <<'EOF' 2>&1 | tee -a "$LOG"
import json, statistics, sys
from pathlib import Path
from harness.results import read_outcome, read_steps

sweep, out = Path(sys.argv[1]), Path(sys.argv[2])
case = next(p.parent for p in sweep.glob("*/plan.json"))
lines = [f"# {case.name} on {sweep}", "",
         "| arm | outcome | steps | loss step 1 | loss last | grad norm last | "
         "step time s (median, steps 2+) | max allocated MiB |", "|---|---|---|---|---|---|---|---|"]
for arm in sorted(p for p in case.iterdir() if (p / "outcome.json").is_file()):
    outcome = read_outcome(arm)
    recs = read_steps(arm).get(0, [])
    times = [r.step_time_s for r in recs[1:] if r.step_time_s is not None]
    peak = [r.max_allocated_bytes for r in recs if r.max_allocated_bytes is not None]
    cell = lambda v, f: format(v, f) if v is not None else "-"
    lines.append(f"| {arm.name} | {outcome.status} | {len(recs)} | "
                 f"{cell(recs[0].loss if recs else None, '.6f')} | "
                 f"{cell(recs[-1].loss if recs else None, '.6f')} | "
                 f"{cell(recs[-1].grad_norm if recs else None, '.6f')} | "
                 f"{cell(statistics.median(times) if times else None, '.4f')} | "
                 f"{cell(max(peak) / 2**20 if peak else None, '.1f')} |")
verdict = json.loads((case / "verdict.json").read_text())
lines += ["", f"verdict: {verdict['status']}", ""]
for pair in verdict["pairs"]:
    failed = [c["name"] for c in pair["checks"] if c["applicable"] and not c["passed"]]
    lines.append(f"* {pair['pair']}: {pair['status']}"
                 + (f" (failed: {', '.join(failed)})" if failed else "")
                 + (f" ({pair['error']})" if pair.get("error") else ""))
    if pair["contract"] == "graph_vs_eager":  # memory in the pair (harness/compare/pair_memory.py)
        lines += [f"  * {c['name']}: {'n/a' if not c['applicable'] else 'figure' if c.get('figure') else 'pass' if c['passed'] else 'FAIL'}"
                  f": {c['detail']}" for c in pair["checks"]
                  if c["name"] in ("allocated_delta_pct", "max_allocated_delta_pct",
                                   "allocated_growth_pct", "device_delta_pct", "graph_pool_bytes")]
    if pair["contract"] == "resume":
        lines += [f"  * {c['name']}: {'n/a' if not c['applicable'] else 'pass' if c['passed'] else 'FAIL'}"
                  f": {c['detail']}" for c in pair["checks"]]
out.write_text("\n".join(lines) + "\n")
print(out.read_text())
EOF
$PY bench/resume_series.py "$(dirname "$(ls "$SWEEP"/*/plan.json | head -1)")" \
    --out "$OUT/megatron_resume.md" 2>&1 | tee -a "$LOG"
tar -czf "$OUT/megatron.tgz" --exclude=ckpt -C "$(dirname "$SWEEP")" "$(basename "$SWEEP")"
say "gate exit $gate_rc; the sweep in $OUT/megatron.tgz"
exit $gate_rc
