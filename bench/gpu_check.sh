#!/usr/bin/env bash
# GPU check, from the repository root on a GPU machine:  bash bench/gpu_check.sh
# Everything it prints also goes to $OUT/gpu_check.log; the artifacts beside it:
#   noise.md             measured noise of the reference pairs (bench/noise.py) and noise x 10
#   mutations.md         the GPU mutation rows (bench/mutations.py --gpu): each must exit 1
#   mutation_verdicts.tgz  each row's verdict.json (the checks' values, to read against new bounds)
#   perf_mutations.md    the step-time and memory rows (bench/perf_mutations.py): a 10 % slowdown
#                        and a leak of one buffer per microbatch must each fail gpu1-qwen3-perf
#                        against golden values recorded (--repeats 3) in the same run (that file
#                        goes into golden.tgz too, --golden-out)
#   golden.tgz           golden/<case>/golden_values_<platform>.json, built once at the end: golden
#                        values recorded from the focused run, for the cases that run on one GPU,
#                        and gpu1-qwen3-perf's from the perf rows' repeats (unpack them into
#                        cases/focused/; one archive keeps the files that come back few)
#   focused.tgz          the focused sweep (summary.md, junit.xml, verdicts, step records, logs)
#   workload_results.tgz the multi-GPU workload run (2+ GPUs)
#   emulated.md          (EMULATED=1) TE #3353's validation table beside the emulated ranks'
#   emulated.tgz         (EMULATED=1) the emulated sweep (summary.md, verdicts, records, sites, logs)
# Sections, each on unless set to 0 (or, for the lists, empty):
#   PYTEST_PATHS   test paths of `pytest -m cuda` (default: tests); PYTEST=0 skips it
#   BENCHES        benchmark scripts, space separated (default below; add yours here)
#   FOCUSED=0      skip `python3 -m harness run cases/focused`, its gate, the golden record
#                  (GOLDEN_CASES, platform from the records: h200 on an H200) and bench/noise.py
#   FOCUSED_SWEEP  the focused sweep folder (ends in /focused; resumed when it exists), FOCUSED_FROM
#                  an earlier call's focused.tgz to unpack there first, FOCUSED_K a -k selection:
#                  one sweep over several 10-minute device calls, e.g. FOCUSED_SWEEP=/tmp/h/focused
#                  FOCUSED_K="gpu1" first, then FOCUSED_FROM=<that focused.tgz, carried> for the rest
#   MUTATIONS=0    skip the GPU mutation rows; MUTATION_JOBS rows at once (default 3), after the
#                  focused run (never beside it: its step times and whole-device memory become
#                  golden values, and a neighbour on the GPU would move both)
#   PERF=0         skip the step-time and memory rows (run alone on the GPU after the focused run
#                  and the mutation rows: their timing must not share the GPU; ~3 min on one H200)
#   WORKLOAD=0     skip the workload run (cases/gpu through `dcp-harness run`, those that fit the
#                  GPUs here: 2-GPU cases with >= 2 GPUs, the 4-GPU case with >= 4)
#   EMULATED=1     (off by default: minutes of one H200) emulated ranks through the CLI:
#                  `python3 -m harness run` of EMULATED_CASES (default: the focused emulated case,
#                  ranks 0 and 3 of 4, and the headline layout at 1 layer a chunk, ranks 0 and 7
#                  of 8, 8 steps: cases/emulated/gb200-qwen3-30b-a3b-dcp-graphs-emulated-16l.yaml;
#                  the -32l file has 2 layers a chunk), one sweep per case, its gate, bench/emulated.py's
#                  table (EMULATED_LIMIT_S: stop each case's run after that many seconds). Alone:
#                  PYTEST=0 BENCHES= FOCUSED=0 MUTATIONS=0 PERF=0 WORKLOAD=0 EMULATED=1 bash bench/gpu_check.sh
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
: > "$LOG"
DEFAULT_BENCHES="bench/graph_memory.py bench/graph_arms.py"
GOLDEN_CASES=${GOLDEN_CASES-"tiny-moe-eager tiny-moe-lognormal gpu1-qwen3-graphs.scope-attn gpu1-qwen3-graphs.scope-full"}
status=0
gdir=$(mktemp -d)/golden  # golden values recorded here (FOCUSED and PERF), into golden.tgz at the end
declare -A took
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
section() {  # section NAME CMD...: run CMD, its output into the log, its time into the table
  local name=$1 t0=$SECONDS rc
  shift
  say "$name: $*"
  "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  took[$name]="$((SECONDS - t0)) s, exit $rc"
  return "$rc"
}

section env $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" || status=1
if [ "${PYTEST:-1}" != 0 ]; then
  section pytest $PY -m pytest -m cuda ${PYTEST_PATHS:-tests} -q -rs -p no:cacheprovider || status=1
fi
for bench in ${BENCHES-$DEFAULT_BENCHES}; do
  section "$(basename "$bench" .py)" $PY "$bench" || status=1
done

if [ "${FOCUSED:-1}" != 0 ]; then
  # FOCUSED_SWEEP: the sweep folder (named focused; default a fresh temporary one); run resumes it
  # when it exists, so one sweep can span device calls: FOCUSED_FROM=a focused.tgz of an earlier
  # call is unpacked beside it first. FOCUSED_K: `-k` of the run (default every case).
  sweep=${FOCUSED_SWEEP:-$(mktemp -d)/focused}
  [ "$(basename "$sweep")" = focused ] || { say "FOCUSED_SWEEP must end in /focused"; exit 2; }
  mkdir -p "$(dirname "$sweep")"
  if [ -n "${FOCUSED_FROM:-}" ]; then
    tar -xzf "$FOCUSED_FROM" -C "$(dirname "$sweep")" || { say "cannot unpack $FOCUSED_FROM"; exit 2; }
    say "resuming the sweep of $FOCUSED_FROM in $sweep"
  fi
  sel=()
  [ -n "${FOCUSED_K:-}" ] && sel=(-k "$FOCUSED_K")
  # FOCUSED_LIMIT_S: stop the run after that many seconds (what finished is still gated and recorded)
  section run timeout "${FOCUSED_LIMIT_S:-0}" $PY -m harness run cases/focused "${sel[@]}" --out "$sweep"
  run_rc=$?
  section gate $PY -m harness gate "$sweep"
  gate_rc=$?
  [ "$gate_rc" = 0 ] || status=1
  golden_args=()
  for c in $GOLDEN_CASES; do  # those the run finished (FOCUSED_LIMIT_S may have cut it)
    if [ -f "$sweep/$c/verdict.json" ]; then golden_args+=(--case "$c"); else say "golden: $c not finished in the sweep, not recorded"; fi
  done
  if [ "${#golden_args[@]}" -gt 0 ]; then
    section golden $PY -m harness golden record "$sweep" --into "$gdir" "${golden_args[@]}" || status=1
  fi
  rm -f "$OUT/noise.md"  # a failed noise run leaves no stale table
  section noise $PY bench/noise.py "$sweep" --out "$OUT/noise.md"
  find "$sweep" -name checkpoint -type d -prune -exec rm -rf {} + 2>/dev/null
  tar -czf "$OUT/focused.tgz" -C "$(dirname "$sweep")" focused 2>/dev/null || true
  took[focused]="run exit $run_rc, gate exit $gate_rc"
fi
if [ "${MUTATIONS:-1}" != 0 ]; then  # after the focused run: its step times become golden values
  mut_t0=$SECONDS
  say "mutations: $PY bench/mutations.py --gpu --jobs ${MUTATION_JOBS:-3}"
  vdir=$(mktemp -d)/mutation_verdicts
  $PY bench/mutations.py --gpu --jobs "${MUTATION_JOBS:-3}" --verdicts "$vdir" > "$OUT/mutations.md" 2>&1
  mut_rc=$?
  took[mutations]="$((SECONDS - mut_t0)) s, exit $mut_rc"
  tar -czf "$OUT/mutation_verdicts.tgz" -C "$(dirname "$vdir")" mutation_verdicts 2>/dev/null || true
  [ "$mut_rc" = 0 ] || status=1
  say "mutations table ($OUT/mutations.md)"
  tee -a "$LOG" < "$OUT/mutations.md"
fi

if [ "${PERF:-1}" != 0 ]; then  # after the focused run and the mutation rows: timing rows need the GPU alone
  perf_t0=$SECONDS
  say "perf: $PY bench/perf_mutations.py --repeats ${PERF_REPEATS:-3} --golden-out $gdir (alone on the GPU)"
  $PY bench/perf_mutations.py --repeats "${PERF_REPEATS:-3}" --golden-out "$gdir" 2>&1 | tee "$OUT/perf_mutations.md" | tee -a "$LOG"
  perf_rc=${PIPESTATUS[0]}
  took[perf]="$((SECONDS - perf_t0)) s, exit $perf_rc"
  [ "$perf_rc" = 0 ] || status=1
fi
rm -f "$OUT/golden.tgz"
if [ -d "$gdir" ]; then  # once, after FOCUSED and PERF: the golden values both recorded
  tar -czf "$OUT/golden.tgz" -C "$(dirname "$gdir")" golden 2>/dev/null || true
fi

ngpu=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${WORKLOAD:-1}" != 0 ] && [ "$ngpu" -ge 2 ]; then
  sel="gpu-dcp12-ep2 or gpu-pp2-vpp2 or gpu2-dcp12-ep2-graphs"
  [ "$ngpu" -ge 4 ] && sel="$sel or gpu-dcp12-pp2-vpp2-ep2 or gpu4-dcp12-pp2-vpp2-ep2-graphs"
  wl=$(mktemp -d)/workload
  section workload $PY bench/workload_gpu.py cases/gpu cases/focused -k "$sel" --out "$wl" || status=1
  tar -czf "$OUT/workload_results.tgz" -C "$(dirname "$wl")" workload 2>/dev/null || true
fi

if [ "${EMULATED:-0}" != 0 ]; then
  ecases=${EMULATED_CASES:-"cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml cases/emulated/gb200-qwen3-30b-a3b-dcp-graphs-emulated-16l.yaml"}
  eroot=$(mktemp -d)/emulated
  : > "$OUT/emulated.md"
  for ecase in $ecases; do  # one sweep per case: what a case finished is kept if a later one is cut
    ename=$(basename "$ecase" .yaml)
    esweep="$eroot/$ename"
    # EMULATED_LIMIT_S: stop a case's run after that many seconds (its records so far still count)
    section "emulated_run_$ename" timeout "${EMULATED_LIMIT_S:-0}" $PY -m harness run "$ecase" --out "$esweep"
    section "emulated_gate_$ename" $PY -m harness gate "$esweep" || status=1
    $PY bench/emulated.py "$esweep" >> "$OUT/emulated.md" 2>&1 || status=1
    echo >> "$OUT/emulated.md"
    tar -czf "$OUT/emulated.tgz" -C "$(dirname "$eroot")" emulated 2>/dev/null || true
  done
  say "emulated ranks: TE #3353's validation beside ours ($OUT/emulated.md)"
  tee -a "$LOG" < "$OUT/emulated.md"
fi

{
  echo
  echo "| section | result |"
  echo "|---|---|"
  for name in "${!took[@]}"; do echo "| $name | ${took[$name]} |"; done | sort
  echo "gpu_check: exit $status (logs in $OUT)"
} | tee -a "$LOG"
exit $status
