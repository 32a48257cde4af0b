#!/usr/bin/env bash
# The focused suite on one GPU, packed and serial, in ONE device call (issue 50's Done-means
# table), from the repository root on a machine with one idle GPU:
#     bash bench/gpu_suite.sh
# 1. packed: `python3 -m harness run cases/focused` (the README's command: arms share the GPU by
#    their predicted memory; those a neighbour would move alone), its gate; NVML sampled every
#    200 ms beside it (bench/gpu_busy.py);
# 2. serial: the same with --gpu-jobs 1 (one arm after another), its gate, sampled the same way,
#    with the time left before the end less TAIL_S (what it finished is compared; the log says
#    when it was cut);
# 3. bench/pack_compare.py serial vs packed (per case wall, verdicts, losses bitwise, memory
#    figures), then per arm the utilisation (bench/gpu_busy.py arms) and the phases
#    (bench/arm_phases.py) of both.
# Needs: one idle CUDA GPU (H100 80GB or H200), nvidia-smi, torch with CUDA and the harness's own
# packages importable (pydantic, submitit, pynvml for the samples: the .whl folder carried in, as
# for bench/gpu_check.sh), and the call's limit: END (default 590 s) is when this
# script has ended; PACKED_LIMIT (default 300 s) bounds the packed run (~280 s on one H100 on
# 2026-12-07, 292 s for the GPU lane on 2026-12-08), the serial run gets the rest (414 s serial on
# one H100 on 2026-12-08: both do not fit one call; the serial run is then cut and compared as far
# as it went). PACK_K: a -k selection.
# Into $OUT (default ./gpu-logs): suite.log (everything printed), compare.md, packed.phases.json,
# serial.phases.json, suite.tgz (both sweeps without checkpoints, the NVML samples). Exit code:
# the packed run's gate's (0 pass, 1 a check failed, 2 errors).
cd "$(dirname "$0")/.."
END=${END:-590}
PACKED_LIMIT=${PACKED_LIMIT:-300}
TAIL_S=${TAIL_S:-45}  # compare, phases, utilisation and the archive after the serial run
LOG_NAME=suite
source bench/gpu_sweep_common.sh
sampled_run packed "$PACKED_LIMIT"
packed_gate=$(tail -1 "$LOG" | grep -o "gate exit [0-9]*" | grep -o "[0-9]*$")
left=$((END - TAIL_S - SECONDS))
if [ "$left" -ge 60 ]; then
  sampled_run serial "$left" --gpu-jobs 1
  grep -q "^gate" "$W/serial.txt" || say "serial: cut at its limit of ${left} s (not every case ran)"
  say "compare serial vs packed"
  $PY bench/pack_compare.py "$W/serial" "$W/packed" --md "$OUT/compare.md" 2>&1 | tee -a "$LOG"
else
  say "serial: not run, ${left} s left before the end less ${TAIL_S} s"
fi
for name in packed serial; do
  [ -d "$W/$name" ] && phases_and_busy "$name"
done
find "$W" -name checkpoint -type d -prune -exec rm -rf {} + 2>/dev/null
tar -czf "$OUT/suite.tgz" -C "$(dirname "$W")" pack 2>/dev/null
say "done"
exit "${packed_gate:-2}"
