# Sourced by the GPU sweep scripts (bench/pack_gpu.sh, bench/gpu_suite.sh, bench/gpu_busy.sh), from the repository
# root: their shared start. Sets OUT (default ./gpu-logs), PY, LOG ($OUT/<LOG_NAME>.log), W (a
# fresh folder <tmp>/<W_NAME> for the sweeps), PYTHONPATH / PYTHONUNBUFFERED; prints the GPU and
# torch; gives
#   say TEXT...                 one line, with the UTC time and the script's seconds, into $LOG
#   sampled_run NAME LIMIT ARGS `run cases/focused ARGS` into $W/NAME (NVML sampled into
#                               $W/NAME.csv, output in $W/NAME.txt, at most LIMIT s), then its
#                               gate into $W/NAME.gate.txt; PACK_K: a -k selection of every run
#   phases_and_busy NAME        bench/arm_phases.py (phases per arm) and bench/gpu_busy.py arms
#                               (utilisation per arm) of $W/NAME, into $LOG
set -o pipefail
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
LOG="$OUT/${LOG_NAME:-pack}.log"
W=$(mktemp -d)/${W_NAME:-pack}
mkdir -p "$W"
say() { echo "== $* ($(date -u +%H:%M:%S), ${SECONDS} s)" | tee -a "$LOG"; }
sampled_run() {
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
phases_and_busy() {
  say "$1: utilisation per arm"
  $PY bench/gpu_busy.py arms "$W/$1" "$W/$1.csv" 2>&1 | tee -a "$LOG"
  say "$1: phases"
  $PY bench/arm_phases.py "$W/$1" --json "$OUT/$1.phases.json" 2>&1 | tail -16 | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee -a "$LOG"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$LOG"
