#!/usr/bin/env bash
# README test command: set up .venv (idempotent, cached) and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k codec`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
