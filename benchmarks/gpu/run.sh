#!/usr/bin/env bash
# Issue 25's device run, prepared to fit one short GPU lease (under 8 minutes on an H200, every
# stage under a hard timeout, the most wanted results first). From the repository root:
#
#     bash benchmarks/gpu/run.sh            # writes under $OUT (else benchmarks/out/gpu)
#
# It needs python (torch with CUDA), cmake, ninja, pybind11 and nvcc; no Horovod, no MPI, no
# network. Stages, each logged to $OUT/<stage>.log, its status in $OUT/stages.txt:
#   build     cmake + ninja for sm_90 into hvd_lossy/ (and build/cuda_selftest)          <= 150 s
#   measure   benchmarks/gpu/measure.py: the DLRM step's exchange (fp32, fp16, dithered: its
#             208 pieces coded in one batch, step_compress_us / step_decompress_us, the 8 frames
#             decoded by one batched call, and receive_us, the all-to-all's receive path into one
#             output; the launches and copies of each call), 1 MB and 64 MB tensors, copy
#             and fp16-cast bandwidth, every frame against the CPU codec's bytes and every
#             decode against the bound -> $OUT/gpu_issue25.json                          <= 80 s
#   dlrm      one training step of examples/dlrm on the GPU (--backend local --device cuda),
#             and again with --compression lossy (one rank codes nothing: the code path) <= 40 s
#   selftest  build/cuda_selftest 400: random frames (dither included) against the CPU    <= 35 s
#   tests     pytest tests/test_cuda.py tests/test_cuda_encoder.py tests/test_device_elements.py
#             tests/test_device_batch.py tests/test_device_decode_batch.py
#             tests/test_device_receive.py (the batched decoder's first run, alone and wired
#             into the receive path, against the CPU decoder)                           <= 90 s
#   sanitize  compute-sanitizer memcheck over a small selftest (20 cases, 20 tampered)   <= 60 s
# Worst case 455 s of stages if every one hits its timeout; expected about 4-5 minutes.
# Exit status 0 when every stage passed; the JSON is written whatever happens after measure.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-$REPO/benchmarks/out/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-$(command -v python || command -v python3)}
JOBS=$(nproc 2>/dev/null || echo 8)
STATUS=0
: > "$OUT/stages.txt"

# stage NAME SECONDS CMD...: runs CMD under a hard timeout, logs it, notes its verdict.
stage() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc
  echo "== $name (at most ${limit} s): $*"
  timeout --kill-after=5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local verdict=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict="TIMEOUT"; elif [ $rc -ne 0 ]; then verdict="FAILED ($rc)"; fi
  [ "$verdict" = ok ] || STATUS=1
  echo "$name $verdict $((SECONDS - t0)) s" | tee -a "$OUT/stages.txt"
  tail -n 4 "$OUT/$name.log" | sed 's/^/   | /'
  return $rc
}

{
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
  nvcc --version 2>&1 | tail -1
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  git rev-parse HEAD 2>/dev/null
} > "$OUT/environment.txt" 2>&1

PYBIND11_DIR=$($PY -c 'import pybind11; print(pybind11.get_cmake_dir())')
build() {
  cmake -S "$REPO" -B "$REPO/build/gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DHVD_LOSSY_WITH_CUDA=ON -DHVD_LOSSY_CUDA_ARCHS=90 \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$REPO/hvd_lossy" \
    -DPython_EXECUTABLE="$(command -v $PY)" -Dpybind11_DIR="$PYBIND11_DIR" &&
    cmake --build "$REPO/build/gpu" -j "$JOBS" &&
    $PY -c 'from hvd_lossy import _C; assert _C.WITH_CUDA, _C.__file__; print("built", _C.__file__)'
}
if ! stage build 150 build; then
  echo "the build failed: nothing else can run (see $OUT/build.log)"
  exit 1
fi

export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
stage measure 80 $PY benchmarks/gpu/measure.py --out "$OUT"
stage dlrm 40 bash -c "
  $PY examples/dlrm/train.py --backend local --device cuda --steps 2 --eval-points 0 \
      --max-eval-rows 256 --no-progress --metrics-out '$OUT/dlrm_step.json' &&
  $PY examples/dlrm/train.py --backend local --device cuda --steps 2 --eval-points 0 \
      --max-eval-rows 256 --no-progress --compression lossy --metrics-out '$OUT/dlrm_step_lossy.json'"
stage selftest 35 build/cuda_selftest 400
stage tests 90 $PY -m pytest -q -p no:cacheprovider --maxfail=10 --tb=short \
  tests/test_cuda.py tests/test_cuda_encoder.py tests/test_device_elements.py \
  tests/test_device_batch.py tests/test_device_decode_batch.py tests/test_device_receive.py
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
stage sanitize 60 "$SANITIZER" --tool memcheck --error-exitcode 9 build/cuda_selftest 20 2 10

echo "stages: $OUT/stages.txt; numbers: $OUT/gpu_issue25.json"
cat "$OUT/stages.txt"
exit $STATUS
