#!/usr/bin/env bash
# Training quality and all-to-all bytes of the compressed embedding exchange (DLRM example):
# seeds x {none, lossy rel 0.03, adaptive} with 2 ranks under mpirun, on planted-signal synthetic
# data at Criteo-Kaggle scale and on the bundled real Criteo rows. Each run writes its metrics
# JSON; quality.py pairs every compressed run with the uncompressed run of the same seed (same
# data, same init) and writes the summary with the targets (ratio >= 15, |dAUC| <= 0.001,
# |dlogloss| <= 0.002 on the synthetic set).
#
#   bash benchmarks/dlrm_quality.sh            # defaults below; ~1 h on 2 slow shared cores
#   SYNTHETIC_ROWS=200000 SEEDS="0 1" bash benchmarks/dlrm_quality.sh
#
# Environment: SYNTHETIC_ROWS (1000000; 0 skips the synthetic set), SAMPLE (1; 0 skips the
# bundled rows), SEEDS ("0 1 2"), BATCH (2048, synthetic), EB (0.03), CONFIGS (names below),
# OUT (benchmarks/out/dlrm_quality). Summary: $OUT/summary.json.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
OUT="${OUT:-$ROOT/benchmarks/out/dlrm_quality}"
SYNTHETIC_ROWS="${SYNTHETIC_ROWS:-1000000}"
SAMPLE="${SAMPLE:-1}"
SEEDS="${SEEDS:-0 1 2}"
BATCH="${BATCH:-2048}"
EB="${EB:-0.03}"
CONFIGS="${CONFIGS:-none lossy adaptive}"
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo -x OMP_NUM_THREADS)

config_args() {
  case "$1" in
    none) echo "--compression none" ;;
    lossy) echo "--compression lossy --error-bound $EB --eb-mode rel" ;;
    adaptive) echo "--compression adaptive --error-bound $EB --eb-mode rel" ;;
    *) echo "unknown config $1 (expected none, lossy, adaptive)" >&2; exit 2 ;;
  esac
}

run() {  # run DATASET_NAME SEED CONFIG ARGS...
  local name="$1" seed="$2" config="$3"; shift 3
  local metrics="$OUT/${name}_${config}_s${seed}.json"
  echo "[$(date +%T)] $name seed $seed $config"
  # shellcheck disable=SC2046
  "${MPIRUN[@]}" "$PY" "$ROOT/examples/dlrm/train.py" --seed "$seed" --no-progress --label "$config" \
      $(config_args "$config") --metrics-out "$metrics" "$@" 2>&1 | tail -1
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "host: $(nproc) cores, $(uname -srm)"
  echo "settings: SYNTHETIC_ROWS=$SYNTHETIC_ROWS SAMPLE=$SAMPLE SEEDS='$SEEDS' BATCH=$BATCH EB=$EB CONFIGS='$CONFIGS'"
} | tee "$OUT/environment.txt"

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
