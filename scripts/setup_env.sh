#!/usr/bin/env bash
# One-shot, idempotent set-up of .venv/ at the repo root: OpenMPI (Debian), torch 2.13.0 (CPU),
# Horovod 0.28.1 (built once, wheel cached), and this package (editable, native codec built).
# A second run only re-checks and rebuilds what changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
CACHE="${HVD_LOSSY_CACHE:-$HOME/.cache/hvd_lossy}"
WHEELS="$CACHE/wheels"
HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
mkdir -p "$WHEELS"
log() { echo "[setup] $*"; }

if ! command -v mpirun >/dev/null 2>&1 || ! [ -e /usr/include/x86_64-linux-gnu/mpi.h -o -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]; then
  log "installing OpenMPI from Debian"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

# One interpreter start answers every "is it there already" question (importing torch is slow),
# so a second run of this script takes seconds.
state=$("$PY" - <<PYEOF 2>/dev/null || true
import importlib.util
def have(m):
    try:
        return importlib.util.find_spec(m) is not None
    except Exception:
        return False
out = []
try:
    import torch
    out.append("torch" if torch.__version__.split("+")[0] == "$TORCH_VERSION" else "")
except Exception:
    pass
mods = ["numpy", "mpi4py", "pybind11", "pytest", "hypothesis", "tqdm", "matplotlib", "ninja", "cmake"]
out.append("deps" if all(have(m) for m in mods) else "")
try:
    import horovod.torch  # noqa: F401
    out.append("horovod")
except Exception:
    pass
try:
    import hvd_lossy._C  # noqa: F401
    out.append("codec")
except Exception:
    pass
print(" ".join(out))
PYEOF
)
has() { [[ " $state " == *" $1 "* ]]; }

if ! has torch; then
  log "installing torch==$TORCH_VERSION (CPU)"
  "${PIP[@]}" install "torch==$TORCH_VERSION"
fi
has deps || "${PIP[@]}" install -r "$ROOT/requirements-dev.txt"

if ! has horovod; then
  whl=$(ls "$WHEELS"/horovod-$HOROVOD_VERSION-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then
    log "building Horovod $HOROVOD_VERSION wheel (once, ~3 min; cached in $WHEELS)"
    # Horovod's CMake forces C++14 but torch headers need C++17; pip's cmake 4 rejects gloo's
    # old cmake_minimum_required, hence the policy floor.
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    CMAKE_CXX_COMPILER_LAUNCHER='sh;-c;exec "$0" "$@" -std=c++17' \
      "$PY" -m pip wheel --no-build-isolation --no-cache-dir --no-deps -q \
      "horovod==$HOROVOD_VERSION" -w "$WHEELS"
    whl=$(ls "$WHEELS"/horovod-$HOROVOD_VERSION-*.whl | head -1)
  fi
  log "installing $whl"
  "${PIP[@]}" install --no-build-isolation "$whl"
fi

# The CUDA codec builds where a GPU is visible (override with HVD_LOSSY_WITH_CUDA=ON/OFF); CI
# compiles it separately, compile-only, whenever nvcc is present (.ci/run).
if [ -z "${HVD_LOSSY_WITH_CUDA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    export HVD_LOSSY_WITH_CUDA=AUTO
  else
    export HVD_LOSSY_WITH_CUDA=OFF
  fi
fi
# Rebuild the native module only when its sources or build files changed.
stamp="$VENV/.hvd_lossy_build_stamp"
want=$( (cd "$ROOT" && find native -type f | sort | xargs cat; cat setup.py CMakeLists.txt pyproject.toml
        echo "$HVD_LOSSY_WITH_CUDA") | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! has codec; then
  log "building hvd_lossy (editable, CUDA=$HVD_LOSSY_WITH_CUDA)"
  "${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"
  echo "$want" > "$stamp"
fi
log "ready: $VENV"
