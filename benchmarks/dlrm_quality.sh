#!/usr/bin/env bash
# Training quality and all-to-all bytes of the compressed embedding exchange (DLRM example):
# seeds x {none, lossy rel 0.03, variants below} with 2 ranks under mpirun, on planted-signal synthetic
# data at Criteo-Kaggle scale and on the bundled real Criteo rows. Each run writes its metrics
# JSON; quality.py pairs every compressed run with the uncompressed run of the same seed (same
# data, same init) and writes the summary with the targets (ratio >= 15, |dAUC| <= 0.001,
# |dlogloss| <= 0.002 on the synthetic set).
#
#   bash benchmarks/dlrm_quality.sh            # defaults below; ~1 h on 2 slow shared cores
#   CONFIGS="none lossy adaptive" bash benchmarks/dlrm_quality.sh
#   SYNTHETIC_ROWS=200000 SEEDS="0 1" bash benchmarks/dlrm_quality.sh
#
# Environment: SYNTHETIC_ROWS (1000000; 0 skips the synthetic set), SAMPLE (1; 0 skips the
# bundled rows), SEEDS ("0 1 2"), BATCH (2048, synthetic), EB (0.03), OPTIMIZER (adagrad, or
# sgd), LEVEL (2: the codec level of the -d/-g/-t configs; level 1 decodes to the same bits,
# faster), CONFIGS (names below),
# OUT (benchmarks/out/dlrm_quality; earlier *_s*.json there are summarised too). Summary:
# $OUT/summary.json.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
OUT="${OUT:-$ROOT/benchmarks/out/dlrm_quality}"
SYNTHETIC_ROWS="${SYNTHETIC_ROWS:-1000000}"
SAMPLE="${SAMPLE:-1}"
SEEDS="${SEEDS:-0 1 2}"
BATCH="${BATCH:-2048}"
EB="${EB:-0.03}"
OPTIMIZER="${OPTIMIZER:-adagrad}"
CONFIGS="${CONFIGS:-none adaptive-d02 lossy-d02 adaptive-g02}"
mkdir -p "$OUT"
CORES="$(nproc --all)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo -x OMP_NUM_THREADS)

# none:         uncompressed (Horovod's alltoall through hvd_lossy with Compression.none)
# lossy:        rel bound EB on lookups and gradients, one frame per (destination, table), level 1
# lossy-g0XX:   rel EB on lookups, 0.0XX on gradients (g01: 0.01, g015: 0.015), level 2 (entropy coder)
# adaptive:     the controller's defaults (paper policy, step schedule), base EB, gradients per table
# adaptive-dither: as adaptive, gradient frames dithered
# adaptive-g0XX: adaptive lookups (paper policy, step schedule), gradients at 0.0XX, level 2
# lossy-d0XX, adaptive-d0XX: as -g0XX with subtractive dither on the gradient frames
# CONFIG-reuse: CONFIG with --reuse (lookups coded against what the receiver holds)
# CONFIG-dense: CONFIG with --dense-compression same (the dense gradients coded as the all-to-all's)
# CONFIG-dense0XX: CONFIG with the dense gradients coded at 0.0XX (--dense-compression 0.0XX)
# adaptive-t0XX: adaptive per-table gradient bounds scaled to a gradient base 0.0XX, dithered, level 2
# lossy-fp16:   rel EB on lookups, gradients as float16 (Compression.fp16: the fast-link recipe)
config_args() {
  case "$1" in
    *-reuse) echo "$(config_args "${1%-reuse}") --reuse" ;;
    *-dense) echo "$(config_args "${1%-dense}") --dense-compression same" ;;
    *-dense0*) echo "$(config_args "${1%-dense0*}") --dense-compression 0.0${1##*-dense0}" ;;
    none) echo "--compression none" ;;
    lossy) echo "--compression lossy --error-bound $EB --eb-mode rel --backward-error-bound same --dither none" ;;
    lossy-fp16) echo "--compression lossy --error-bound $EB --eb-mode rel --backward-error-bound fp16 --level ${LEVEL:-2}" ;;
    lossy-d0*) echo "--compression lossy --error-bound $EB --eb-mode rel --backward-error-bound 0.0${1#*-d0} --level ${LEVEL:-2} --dither backward" ;;
    adaptive-d0*) echo "--compression adaptive --error-bound $EB --eb-mode rel --backward-error-bound 0.0${1#*-d0} --level ${LEVEL:-2} --dither backward" ;;
    lossy-g0*) echo "--compression lossy --error-bound $EB --eb-mode rel --backward-error-bound 0.0${1#*-g0} --level ${LEVEL:-2} --dither none" ;;
    adaptive) echo "--compression adaptive --error-bound $EB --eb-mode rel --backward-error-bound same --dither none" ;;
    adaptive-dither) echo "--compression adaptive --error-bound $EB --eb-mode rel --backward-error-bound same --dither backward" ;;
    adaptive-t0*) echo "--compression adaptive --error-bound $EB --eb-mode rel --backward-error-bound same --grad-base 0.0${1#*-t0} --level ${LEVEL:-2} --dither backward" ;;
    adaptive-g0*) echo "--compression adaptive --error-bound $EB --eb-mode rel --backward-error-bound 0.0${1#*-g0} --level ${LEVEL:-2} --dither none" ;;
    *) echo "unknown config $1 (expected none, lossy, lossy-fp16, lossy-g0XX, lossy-d0XX, adaptive, adaptive-dither, adaptive-g0XX, adaptive-d0XX, adaptive-t0XX, each also with -reuse or -dense)" >&2; exit 2 ;;
  esac
}

run() {  # run DATASET_NAME SEED CONFIG ARGS...
  local name="$1" seed="$2" config="$3"; shift 3
  local metrics="$OUT/${name}_${config}_s${seed}.json"
  echo "[$(date +%T)] $name seed $seed $config"
  # shellcheck disable=SC2046
  "${MPIRUN[@]}" "$PY" "$ROOT/examples/dlrm/train.py" --seed "$seed" --optimizer "$OPTIMIZER" --no-progress --label "$config" \
      $(config_args "$config") --metrics-out "$metrics" "$@" 2>&1 | tail -1
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "command: CONFIGS='$CONFIGS' bash benchmarks/dlrm_quality.sh"
  echo "host: $CORES cores, $(uname -srm), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "settings: SYNTHETIC_ROWS=$SYNTHETIC_ROWS SAMPLE=$SAMPLE SEEDS='$SEEDS' BATCH=$BATCH EB=$EB OPTIMIZER=$OPTIMIZER CONFIGS='$CONFIGS'"
} | tee -a "$OUT/environment.txt"

for seed in $SEEDS; do
  for config in $CONFIGS; do
    if [ "$SAMPLE" != 0 ]; then
      run sample "$seed" "$config" --data "$ROOT/data/criteo_kaggle_sample" --eval-points 0
    fi
    if [ "$SYNTHETIC_ROWS" != 0 ]; then
      run "synthetic$SYNTHETIC_ROWS" "$seed" "$config" --synthetic "$SYNTHETIC_ROWS" \
          --batch-size "$BATCH" --eval-points 4
    fi
  done
done

"$PY" "$ROOT/examples/dlrm/quality.py" "$OUT/summary.json" "$OUT"/*_s*.json
echo "summary: $OUT/summary.json"
