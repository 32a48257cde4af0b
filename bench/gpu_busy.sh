#!/usr/bin/env bash
# Where the focused suite's GPU time goes and how busy it keeps one GPU (issue 50, item 1), from
# the repository root on a machine with one idle GPU:  bash bench/gpu_busy.sh
# 1. bench/nvml_exact.py: NVML's per-process memory accounting against the whole device's figure.
# 2. SERIAL_K's cases, one arm after another (`python3 -m harness run`), NVML sampled every 200 ms
#    beside it (bench/gpu_busy.py): per arm its wall, GPU utilisation, memory; bench/arm_phases.py.
# 3. PACKED_K's selections (space-separated groups, `,` inside a group reads ` or `), each group a
#    `run` of its own, all at once on the same GPU: how much their arms slow each other down.
# Into $OUT: busy.log (everything printed), nvml_exact.json, busy.tgz (the sweeps, the samples).
cd "$(dirname "$0")/.."
LOG_NAME=busy W_NAME=busy
source bench/gpu_sweep_common.sh
SERIAL_K=${SERIAL_K-"gpu1-emulated or scope-attn or gpu1-qwen3-perf or tiny-moe-eager"}
PACKED_K=${PACKED_K-"gpu4 gpu2-dcp12 slot-ring scope-full"}

say "nvml_exact"
$PY bench/nvml_exact.py --json "$OUT/nvml_exact.json" 2>&1 | tee -a "$LOG"

if [ -n "$SERIAL_K" ]; then
  $PY bench/gpu_busy.py sample "$W/serial.csv" & sampler=$!
  say "serial: run cases/focused -k '$SERIAL_K'"
  t0=$SECONDS
  $PY -m harness run cases/focused -k "$SERIAL_K" --out "$W/serial" > "$W/serial.txt" 2>&1
  say "serial: exit $?, $((SECONDS - t0)) s"
  tail -5 "$W/serial.txt" | tee -a "$LOG"
  kill "$sampler"; wait "$sampler"
  $PY bench/gpu_busy.py arms "$W/serial" "$W/serial.csv" --json "$W/serial_busy.json" 2>&1 | tee -a "$LOG"
  $PY bench/arm_phases.py "$W/serial" 2>&1 | tee -a "$LOG"
fi

if [ -n "$PACKED_K" ]; then
  $PY bench/gpu_busy.py sample "$W/packed.csv" & sampler=$!
  say "packed: one run per group at once: $PACKED_K"
  t0=$SECONDS
  pids=() dirs=()
  for g in $PACKED_K; do
    name=${g//,/_}
    $PY -m harness run cases/focused -k "${g//,/ or }" --out "$W/p_$name" > "$W/p_$name.txt" 2>&1 &
    pids+=($!) dirs+=("$W/p_$name")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    say "packed ${dirs[$i]##*/}: exit $rc at $((SECONDS - t0)) s"
    tail -3 "${dirs[$i]}.txt" | tee -a "$LOG"
  done
  kill "$sampler"; wait "$sampler"
  $PY bench/gpu_busy.py arms "${dirs[@]}" "$W/packed.csv" --json "$W/packed_busy.json" 2>&1 | tee -a "$LOG"
  for d in "${dirs[@]}"; do $PY bench/arm_phases.py "$d" 2>&1 | tee -a "$LOG"; done
fi
find "$W" -name checkpoint -type d -prune -exec rm -rf {} + 2>/dev/null
tar -czf "$OUT/busy.tgz" -C "$(dirname "$W")" busy 2>/dev/null
say "done"
