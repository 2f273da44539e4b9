#!/usr/bin/env bash
# README main job: set up .venv (idempotent, cached), then train the hybrid-parallel DLRM on the
# bundled Criteo rows with 2 ranks, uncompressed and compressed, and print both side by side
# (over an emulated 1 Gbit/s link when run as root with ip and tc, then over shared memory).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
exec bash "$ROOT/scripts/run_main.sh" "$@"
