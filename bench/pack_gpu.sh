#!/usr/bin/env bash
# The focused suite packed on one GPU against the same suite serial, in one call (issue 50), from
# the repository root on a machine with one idle GPU:  bash bench/pack_gpu.sh
# 1. packed: `python3 -m harness run cases/focused` (the README's command: arms share the GPU by
#    their predicted memory), its gate; NVML sampled every 200 ms beside it (bench/gpu_busy.py);
# 2. serial: the same with --gpu-jobs 1 (one arm after another), its gate, sampled the same way;
#    stopped at SERIAL_END s after this script started (what it finished is compared);
# 3. bench/pack_compare.py serial vs packed (verdicts, losses bitwise, memory figures), per arm
#    utilisation (bench/gpu_busy.py arms) and phases (bench/arm_phases.py) of both;
# 4. bench/nvml_exact.py, while time is left (NVML's per-process accounting, to the byte).
# PACK_K: a -k selection of both runs (default every case).
# Into $OUT: pack.log (everything printed), compare.md, nvml_exact.json, pack.tgz (both sweeps
# without checkpoints, the samples).
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
LOG="$OUT/pack.log"
W=$(mktemp -d)/pack
mkdir -p "$W"
SERIAL_END=${SERIAL_END:-540}
END=${END:-590}  # this script ends by then (the call's limit less a margin)
say() { echo "== $* ($(date -u +%H:%M:%S), ${SECONDS} s)" | tee -a "$LOG"; }
sampled_run() {  # sampled_run NAME LIMIT_S ARGS...: a run of cases/focused into $W/NAME, then its gate
  local name=$1 limit=$2 t0=$SECONDS rc sampler
  shift 2
  $PY bench/gpu_busy.py sample "$W/$name.csv" & sampler=$!
  say "$name: run cases/focused $* (limit ${limit} s)"
  timeout "$limit" $PY -m harness run cases/focused ${PACK_K:+-k "$PACK_K"} "$@" --out "$W/$name" > "$W/$name.txt" 2>&1
  rc=$?
  say "$name: run exit $rc, $((SECONDS - t0)) s wall"
  grep -E "^GPU arms|^gate|^results" "$W/$name.txt" | tee -a "$LOG"
  kill "$sampler"; wait "$sampler"
  $PY -m harness gate "$W/$name" > "$W/$name.gate.txt" 2>&1
  rc=$?
  tail -3 "$W/$name.gate.txt" | tee -a "$LOG"
  say "$name: gate exit $rc"
}

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee -a "$LOG"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$LOG"
sampled_run packed 300
sampled_run serial $((SERIAL_END - SECONDS)) --gpu-jobs 1
say "compare"
$PY bench/pack_compare.py "$W/serial" "$W/packed" --md "$OUT/compare.md" 2>&1 | tee -a "$LOG"
for name in packed serial; do
  say "$name: utilisation per arm"
  $PY bench/gpu_busy.py arms "$W/$name" "$W/$name.csv" 2>&1 | tee -a "$LOG"
  say "$name: phases"
  $PY bench/arm_phases.py "$W/$name" 2>&1 | tail -16 | tee -a "$LOG"
done
find "$W" -name checkpoint -type d -prune -exec rm -rf {} + 2>/dev/null
tar -czf "$OUT/pack.tgz" -C "$(dirname "$W")" pack 2>/dev/null
left=$((END - SECONDS))
if [ "$left" -gt 20 ]; then
  say "nvml_exact (limit $((left - 5)) s)"
  timeout $((left - 5)) $PY bench/nvml_exact.py --json "$OUT/nvml_exact.json" 2>&1 | tee -a "$LOG"
fi
left=$((END - SECONDS))
if [ "$left" -gt 25 ]; then
  say "pytest -m cuda tests/metrics/test_device_memory.py (limit $((left - 5)) s)"
  timeout $((left - 5)) $PY -m pytest -m cuda tests/metrics/test_device_memory.py -q -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
fi
say "done"
