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
cd "$(dirname "$0")/.."
SERIAL_END=${SERIAL_END:-540}
END=${END:-590}  # this script ends by then (the call's limit less a margin)
source bench/gpu_sweep_common.sh
sampled_run packed 300
sampled_run serial $((SERIAL_END - SECONDS)) --gpu-jobs 1
say "compare"
$PY bench/pack_compare.py "$W/serial" "$W/packed" --md "$OUT/compare.md" 2>&1 | tee -a "$LOG"
for name in packed serial; do
  phases_and_busy "$name"
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
