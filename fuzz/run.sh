#!/usr/bin/env bash
# Builds and runs the hvd_lossy decoder fuzzers, one after the other (one job: a shared machine).
#
#   fuzz/run.sh [SECONDS] [HARNESS...]   build, write seeds, replay fuzz/crashes/, fuzz each
#                                        harness SECONDS (default 120)
#   fuzz/run.sh replay                   build, then only replay fuzz/crashes/ through every harness
#   fuzz/run.sh coverage                 line coverage of native/ reached by the saved corpora
#   fuzz/run.sh ci                       no clang needed: every native harness built with g++
#                                        -fsanitize=address,undefined and fuzz/replay_main.cc,
#                                        run once over fresh seeds, fuzz/crashes/ and
#                                        fuzz/regression/<harness>/ (the CI regression, seconds)
#
# Harnesses: decode_frame (libFuzzer, native, raw bytes), decode_frame_patched (native, the input
# being a frame's body, sealed with its total and CRC32C), decode_into / decode_into_patched (the
# transport's decompress_into_cpu on a receive buffer of frames), py (atheris through
# hvd_lossy's Python API), py_patched.
# A native harness is one line of NATIVE_HARNESSES below: name, source, extra flags.
# Environment: CXX (clang++ with libFuzzer; default clang++-14 or clang++), FUZZ_WORK (build
# outputs, corpora, logs; default fuzz/work), FUZZ_MAX_LEN (default 8192), PYTHON (default
# .venv/bin/python), FUZZ_SKIP_BUILD=1 (reuse the binaries already in $FUZZ_WORK).
# Exit status: non-zero when a harness found a crash (its input is saved under
# $FUZZ_WORK/artifacts/<harness>/) or a regression input in fuzz/crashes/ fails again.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WORK="${FUZZ_WORK:-$ROOT/fuzz/work}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
MAX_LEN="${FUZZ_MAX_LEN:-8192}"
# name|source|extra flags: everything else (build, replay, fuzzing, the CI replay) follows.
NATIVE_HARNESSES=(
  "decode_frame|fuzz/fuzz_decode_frame.cc|"
  "decode_frame_patched|fuzz/fuzz_decode_frame.cc|-DHL_FUZZ_PATCH=1"
  "decode_into|fuzz/fuzz_decode_into.cc|"
  "decode_into_patched|fuzz/fuzz_decode_into.cc|-DHL_FUZZ_PATCH=1"
)
native_names() { local h; for h in "${NATIVE_HARNESSES[@]}"; do echo "${h%%|*}"; done; }
if [ "${1:-}" != ci ]; then
  CXX="${CXX:-$(command -v clang++-14 || command -v clang++ || true)}"
  [ -n "$CXX" ] || { echo "no clang++ found: apt-get install -y clang-14 libclang-rt-14-dev" >&2; exit 2; }
fi

# The codec sources the Python extension links (CMakeLists.txt's hl_codec): native/common and
# native/cpu, globbed so that a new CPU source file is picked up.
CODEC_SRCS=(native/common/*.cc native/cpu/*.cc)
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
CXXFLAGS=(-std=c++17 -g -O1 -ffp-contract=off -Inative -Inative/common -Inative/cpu -Wno-unknown-pragmas)
ATHERIS_LIB="$("$PYTHON" -c 'import atheris; print(atheris.path())' 2>/dev/null || true)"
PY_EXT="$WORK/native/_C$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

build() {
  if [ "${FUZZ_SKIP_BUILD:-0}" = 1 ] && [ -x "$WORK/bin/fuzz_decode_frame" ]; then return 0; fi
  mkdir -p "$WORK/bin" "$WORK/native"
  echo "== building with $CXX"
  local h name src flags
  for h in "${NATIVE_HARNESSES[@]}"; do
    IFS='|' read -r name src flags <<< "$h"
    # shellcheck disable=SC2086  # flags are words
    "$CXX" "${CXXFLAGS[@]}" "${SAN[@]}" -fsanitize=fuzzer $flags "$src" "${CODEC_SRCS[@]}" \
      -o "$WORK/bin/fuzz_$name"
  done
  if [ -n "$ATHERIS_LIB" ]; then
    # The extension instrumented for libFuzzer's coverage feedback and ASan/UBSan; its sanitizer
    # runtime comes from atheris' asan_with_fuzzer.so, preloaded into python (see run_py).
    local pyinc pbinc
    pyinc="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    pbinc="$("$PYTHON" -c 'import pybind11; print(pybind11.get_include())')"
    "$CXX" "${CXXFLAGS[@]}" "${SAN[@]}" -fsanitize=fuzzer-no-link -fno-sanitize=vptr,function \
      -fPIC -shared -I"$pyinc" -I"$pbinc" native/bindings.cc "${CODEC_SRCS[@]}" -o "$PY_EXT"
  fi
}

seeds() {
  rm -rf "$WORK/seeds"
  "$PYTHON" fuzz/make_seeds.py "$WORK/seeds" --chunks --max-bytes "$MAX_LEN"
}

# run_py PATCH ARGS...: the atheris harness, with the instrumented extension when it was built.
run_py() {
  local patch="$1"; shift
  [ -n "$ATHERIS_LIB" ] || { echo "atheris is not installed: skipping the Python harness" >&2; return 0; }
  local ext=""
  [ -f "$PY_EXT" ] && ext="$PY_EXT"
  HL_FUZZ_PATCH="$patch" HL_FUZZ_C="$ext" LD_PRELOAD="$ATHERIS_LIB/asan_with_fuzzer.so" \
    "$PYTHON" fuzz/fuzz_decompress.py "$@"
}

harness_cmd() {
  case "$1" in
    py) echo "run_py 0" ;;
    py_patched) echo "run_py 1" ;;
    *)
      if native_names | grep -qx "$1"; then echo "$WORK/bin/fuzz_$1"; return; fi
      echo "unknown harness $1, expected one of: $(native_names | tr '\n' ' ')py py_patched" >&2
      exit 2 ;;
  esac
}

replay() {
  local status=0 inputs=(fuzz/crashes/*)
  [ -e "${inputs[0]}" ] || { echo "== no regression inputs in fuzz/crashes/"; return 0; }
  for h in $(native_names) py py_patched; do
    echo "== replaying ${#inputs[@]} regression inputs through $h"
    if ! $(harness_cmd "$h") -runs=1 "${inputs[@]}" > "$WORK/logs/replay_$h.log" 2>&1; then
      echo "!! $h fails on a regression input, see $WORK/logs/replay_$h.log"
      tail -20 "$WORK/logs/replay_$h.log"
      status=1
    fi
  done
  return $status
}

fuzz_one() {
  local h="$1" seconds="$2" status=0
  mkdir -p "$WORK/corpus/$h" "$WORK/artifacts/$h" "$WORK/logs"
  echo "== fuzzing $h for $seconds s"
  $(harness_cmd "$h") -max_total_time="$seconds" -max_len="$MAX_LEN" -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$WORK/artifacts/$h/" \
    "$WORK/corpus/$h" "$WORK/seeds" > "$WORK/logs/$h.log" 2>&1 || status=$?
  grep -E "DONE|^stat::(number_of_executed_units|average_exec_per_sec)" \
    "$WORK/logs/$h.log" || true
  if [ $status -ne 0 ]; then
    echo "!! $h stopped with status $status; log $WORK/logs/$h.log, input under $WORK/artifacts/$h/"
    grep -E "ERROR: |runtime error|SUMMARY|Test unit written" "$WORK/logs/$h.log" | head -5
  fi
  return $status
}

coverage() {
  # Replays the saved corpora through a coverage build of the patched native harness.
  local bin="$WORK/bin/fuzz_decode_cov" prof="$WORK/coverage"
  rm -rf "$prof" && mkdir -p "$prof"
  "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping \
    -DHL_FUZZ_PATCH=1 fuzz/fuzz_decode_frame.cc "${CODEC_SRCS[@]}" -o "$bin"
  local dirs=()
  for d in "$WORK/corpus/"*/ "$WORK/seeds"; do [ -d "$d" ] && dirs+=("$d"); done
  LLVM_PROFILE_FILE="$prof/%p.profraw" "$bin" -runs=0 "${dirs[@]}" > "$prof/run.log" 2>&1
  local profdata llvmcov
  profdata="$(command -v llvm-profdata-14 || command -v llvm-profdata)"
  llvmcov="$(command -v llvm-cov-14 || command -v llvm-cov)"
  "$profdata" merge -sparse "$prof"/*.profraw -o "$prof/merged.profdata"
  "$llvmcov" report "$bin" -instr-profile="$prof/merged.profdata" "${CODEC_SRCS[@]}"
  echo "== per-line: $llvmcov show $bin -instr-profile=$prof/merged.profdata native/cpu/decode.cc"
}

ci() {
  # The CI regression without clang: the codec once, then each harness linked with a main()
  # that replays files, all under ASan/UBSan; every input of every corpus, once.
  local cxx="${CXX_CI:-g++}" objs=() f h name src flags status=0
  mkdir -p "$WORK/ci"
  echo "== building the native harnesses with $cxx (ASan/UBSan, replay main)"
  for f in "${CODEC_SRCS[@]}"; do
    "$cxx" "${CXXFLAGS[@]}" "${SAN[@]}" -c "$f" -o "$WORK/ci/$(basename "$f" .cc).o" &
    objs+=("$WORK/ci/$(basename "$f" .cc).o")
  done
  wait
  "$PYTHON" fuzz/make_seeds.py "$WORK/ci/seeds" --chunks --max-bytes "$MAX_LEN" > /dev/null
  for h in "${NATIVE_HARNESSES[@]}"; do
    IFS='|' read -r name src flags <<< "$h"
    # shellcheck disable=SC2086
    "$cxx" "${CXXFLAGS[@]}" "${SAN[@]}" $flags "$src" fuzz/replay_main.cc "${objs[@]}" \
      -o "$WORK/ci/replay_$name"
    local dirs=("$WORK/ci/seeds" fuzz/crashes)
    [ -d "fuzz/regression/$name" ] && dirs+=("fuzz/regression/$name")
    local rc=0
    "$WORK/ci/replay_$name" "${dirs[@]}" > "$WORK/ci/$name.log" 2>&1 || rc=$?
    echo "== $name: $(tail -1 "$WORK/ci/$name.log")"
    if [ $rc != 0 ] || grep -qE "ERROR: AddressSanitizer|runtime error" "$WORK/ci/$name.log"; then
      echo "!! $name fails on a saved input (status $rc):"; tail -20 "$WORK/ci/$name.log"; status=1
    fi
  done
  return $status
}

mkdir -p "$WORK/logs"
case "${1:-}" in
  coverage) coverage; exit 0 ;;
  replay) build; replay; exit $? ;;
  ci) ci; exit $? ;;
esac
SECONDS_EACH="${1:-120}"
shift || true
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || mapfile -t HARNESSES < <(native_names; echo py; echo py_patched)
build
seeds
status=0
replay || status=1
for h in "${HARNESSES[@]}"; do
  fuzz_one "$h" "$SECONDS_EACH" || status=1
done
exit $status
