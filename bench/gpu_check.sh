#!/usr/bin/env bash
# GPU check: the CUDA-marked tests and the GPU benchmarks, logs under $OUT.
# Run on a GPU machine from the repository root:  bash bench/gpu_check.sh
#   OUT=dir        where logs go (default ./gpu-logs)
#   PYTEST_PATHS   test paths for `pytest -m cuda` (default: tests)
#   BENCHES        benchmark scripts, space separated (default below; add yours here)
#   WORKLOAD=0     skip the workload run (cases/gpu through `dcp-harness run`, those that fit the
#                  GPUs here: 2-GPU cases with >= 2 GPUs, the 4-GPU case with >= 4); its results
#                  folder is packed into $OUT/workload_results.tgz
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
DEFAULT_BENCHES="bench/graph_memory.py bench/graph_arms.py"
status=0
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
  2>&1 | tee "$OUT/env.log" || status=1
$PY -m pytest -m cuda ${PYTEST_PATHS:-tests} -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest_cuda.log" || status=1
for bench in ${BENCHES-$DEFAULT_BENCHES}; do
  name=$(basename "$bench" .py)
  $PY "$bench" 2>&1 | tee "$OUT/bench_$name.log" || status=1
done
ngpu=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${WORKLOAD:-1}" != 0 ] && [ "$ngpu" -ge 2 ]; then
  sel="gpu-dcp12-ep2 or gpu-pp2-vpp2 or gpu2-dcp12-ep2-graphs"
  [ "$ngpu" -ge 4 ] && sel="$sel or gpu-dcp12-pp2-vpp2-ep2 or gpu4-dcp12-pp2-vpp2-ep2-graphs"
  wl=$(mktemp -d)/workload
  $PY bench/workload_gpu.py cases/gpu cases/focused -k "$sel" --out "$wl" 2>&1 | tee "$OUT/bench_workload_gpu.log" || status=1
  tar -czf "$OUT/workload_results.tgz" -C "$(dirname "$wl")" workload 2>/dev/null || true
fi
echo "gpu_check: exit $status (logs in $OUT)"
exit $status
