"""What a benchmark ran on, recorded with every figure: machines of one kind differ (AVX-512 or
only AVX2, memory bandwidth 2-3x apart), so a speed means something only beside the CPU's SIMD
flags, the kernel path the codec chose and the memory-bound cast timed in the same process."""
import os
import platform

from hvd_lossy import _C

# The flags the codec's kernels and the CRC depend on (native/cpu: kernels_avx2.cc,
# kernels_avx512.cc, pack.cc, crc32c.cc); the rest of /proc/cpuinfo's list says nothing about its speed.
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "bmi2", "avx512f", "avx512dq", "avx512cd", "avx512bw",
              "avx512vl", "avx512vbmi", "avx512_vbmi2", "avx512ifma",
              "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16")
SIMD_LEVELS = {0: "portable", 1: "AVX2", 2: "AVX-512"}


def _cpuinfo(path="/proc/cpuinfo"):
    """(model name, flags) of the first CPU in /proc/cpuinfo; (None, []) where there is none."""
    model, flags = None, []
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = value.split()
                if model is not None and flags:
                    break
    except OSError:
        pass
    return model, flags


def describe(path="/proc/cpuinfo"):
    """A JSON-ready record of this machine's CPU as the codec sees it: `simd_level` (0 portable,
    1 AVX2, 2 AVX-512: the kernels chosen at load time, after HVD_LOSSY_NO_AVX512/NO_AVX2),
    the SIMD flags the CPU reports, which forcing variables are set, cores and model."""
    model, flags = _cpuinfo(path)
    have = set(flags)
    level = int(_C.simd_level())
    return {"arch": platform.machine(), "cpu": model or platform.processor() or None,
            "cores": os.cpu_count(), "simd_level": level, "simd_path": SIMD_LEVELS.get(level),
            "simd_flags": [f for f in SIMD_FLAGS if f in have],
            # the codec's own reading of the forcing variables, their values as the run had them
            "simd_forced": {k: os.environ.get(k) for k in _C.simd_forced()}}


def summary(info):
    """One line of describe()'s record for a benchmark's console output."""
    forced = ", ".join(f"{k}={v}" for k, v in info["simd_forced"].items())
    return (f"cpu: {info['cpu'] or info['arch']}, {info['cores']} cores; kernels "
            f"{info['simd_path']} (simd_level {info['simd_level']}{'; ' + forced if forced else ''}); "
            f"flags {' '.join(info['simd_flags']) or 'none of ' + '/'.join(SIMD_FLAGS[:3])}")
