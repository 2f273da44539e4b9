"""The prepared device run (benchmarks/gpu/run.sh, benchmarks/gpu/measure.py) works before a GPU
lease is spent on it: the script parses, names only files that exist, keeps its stage timeouts
under the lease's 8 minutes, and the measurement's CPU dry run writes every key issue 25 asks
for, with the byte identity and the bound checked."""
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "gpu" / "run.sh"
KEYS = ("gpu", "date", "compress_GBps_64MB", "decompress_GBps_64MB", "roundtrip_us_1MB",
        "step_compress_us", "step_decompress_us", "byte_identical_to_cpu", "bound_ok",
        "copy_GBps", "fp16_cast_GBps")


def test_run_script_parses_and_its_stage_timeouts_fit_the_lease():
    subprocess.run(["bash", "-n", str(RUN)], check=True)
    text = RUN.read_text()
    limits = [int(s) for s in re.findall(r"^\s*(?:if ! )?stage \w+ (\d+) ", text, re.M)]
    assert len(limits) == 6, limits
    assert sum(limits) < 8 * 60, limits


def test_run_script_names_only_files_that_exist():
    text = RUN.read_text()
    named = set(re.findall(r"\b((?:tests|benchmarks|examples)/[\w/]+\.(?:py|sh))", text))
    assert named, "the script names its tests and tools"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_measure_dry_run_writes_every_key_with_identity_and_bound_checked(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "measure.py"),
                           "--device", "cpu", "--quick", "--big-mb", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "gpu_issue25.json").read_text())
    assert [k for k in KEYS if k not in data] == []
    assert data["device"] == "cpu" and data["gpu"].startswith("none")  # never a GPU figure
    assert data["byte_identical_to_cpu"] is True and data["bound_ok"] is True
    items = data["items"]
    assert {"step float32", "step float16", "step float32 dithered", "1MB", "2MB",
            "yardsticks"} <= set(items)
    step = items["step float32"]
    assert (step["pieces"], step["frames"]) == (26 * 8, 8)
    assert step["raw_bytes"] == 26 * 8 * 256 * 128 * 4
    assert items["step float32 dithered"]["dither_seed"] is not None
    assert all(v["max_error_over_bound"] <= 1.0 for v in items.values()
               if "max_error_over_bound" in v)
