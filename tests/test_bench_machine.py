"""Every benchmark record says what it ran on: the CPU's SIMD flags and the kernel path the
codec chose (hvd_lossy.bench.machine), so figures from machines with and without AVX-512 can be
told apart."""
import os
import subprocess
import sys
from pathlib import Path

import hvd_lossy
from hvd_lossy.bench import machine

REPO = Path(__file__).resolve().parents[1]

AVX2_ONLY = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 sse4_1 sse4_2 avx bmi1 avx2 bmi2 fma

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 sse4_1 sse4_2 avx bmi1 avx2 bmi2 fma
"""


def test_describe_lists_the_codecs_simd_flags_and_the_model_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(AVX2_ONLY)
    info = machine.describe(str(path))
    assert info["cpu"] == "AMD EPYC 7B13"
    assert info["simd_flags"] == ["sse4_2", "avx", "avx2", "bmi2"]  # no fpu, sse, fma: not ours
    assert info["simd_level"] == hvd_lossy._C.simd_level()
    assert info["simd_path"] == machine.SIMD_LEVELS[info["simd_level"]]


def test_describe_without_cpuinfo_still_names_the_kernel_path(tmp_path):
    info = machine.describe(str(tmp_path / "missing"))
    assert info["simd_flags"] == [] and info["simd_level"] in machine.SIMD_LEVELS
    assert "none of" in machine.summary(info)


FORCING = ("HVD_LOSSY_NO_AVX512", "HVD_LOSSY_NO_AVX2")  # the README's names


def _describe_with(**forcing):
    env = {k: v for k, v in os.environ.items() if k not in FORCING}
    env.update(forcing, PYTHONPATH=str(REPO))
    code = ("import json; from hvd_lossy.bench import machine; "
            "print(json.dumps(machine.describe()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    import json
    return json.loads(out)


def test_a_forced_kernel_path_is_recorded_with_the_level_it_gives():
    info = _describe_with(HVD_LOSSY_NO_AVX512="1")
    assert info["simd_forced"] == {"HVD_LOSSY_NO_AVX512": "1"}
    assert info["simd_level"] <= 1  # AVX2 at most, whatever the CPU has
    assert "HVD_LOSSY_NO_AVX512=1" in machine.summary(info)


def test_the_record_says_what_the_codec_read_not_the_environment_later():
    # the kernels are chosen once, at the first call: a variable set afterwards changes neither
    code = ("import json, os; from hvd_lossy import _C; from hvd_lossy.bench import machine; "
            "_C.simd_level(); os.environ['HVD_LOSSY_NO_AVX2'] = '1'; "
            "print(json.dumps(machine.describe()))")
    env = {k: v for k, v in os.environ.items() if k not in FORCING}
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(REPO)),
                         cwd=REPO, check=True, capture_output=True, text=True).stdout
    import json
    info = json.loads(out)
    assert info["simd_forced"] == {} and info["simd_level"] == _describe_with()["simd_level"]


def test_a_forcing_variable_set_to_0_or_empty_forces_nothing():
    # HVD_LOSSY_NO_AVX512=0 means "do not force", in the codec as in the record
    free = _describe_with()["simd_level"]
    for value in ("0", ""):
        info = _describe_with(HVD_LOSSY_NO_AVX512=value, HVD_LOSSY_NO_AVX2=value)
        assert info["simd_level"] == free, value
        assert info["simd_forced"] == {}, value
    assert _describe_with(HVD_LOSSY_NO_AVX2="1")["simd_level"] == 0
