#!/usr/bin/env bash
# The emulated-link benchmark with its full defaults (python -m hvd_lossy.bench netlink: rates
# 1,10,25,100 Gbit/s and unlimited, 2 and 3 ranks, 3 rounds), writing
# $OUT/netlink_<UTC date>.{json,png,log} (default OUT: benchmarks/out/). Run as root on a quiet
# machine: every mode takes turns within a rate, but a busy machine still widens the spread.
#
#   sudo bash benchmarks/netlink.sh                         # about an hour on 2 cores
#   sudo bash benchmarks/netlink.sh --rates 1,10 --repeat 5  # any netlink flag; `-- flags` go to train.py
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
OUT="${OUT:-$ROOT/benchmarks/out}"
STAMP="$(date -u +%Y-%m-%dT%H%MZ)"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m hvd_lossy.bench netlink --json "$OUT/netlink_$STAMP.json" --png "$OUT/netlink_$STAMP.png" "$@" \
    2>&1 | tee "$OUT/netlink_$STAMP.log"
