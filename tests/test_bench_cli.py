"""The benchmark commands' front ends: --help with defaults, and bad flags or values refused in
one line with exit status 2, printed once however many ranks run them."""
import os
import json
import pathlib
import subprocess
import sys

import pytest

from tests._launch import REPO, _mpirun


def bench(*args, env=None):
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "hvd_lossy.bench", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_bench_help_lists_every_benchmark_and_exits_0():
    proc = bench("--help")
    assert proc.returncode == 0, proc.stderr
    assert all(name in proc.stdout for name in ("codec", "alltoall", "netlink"))


def test_bench_without_a_name_is_one_usage_error():
    proc = bench("codecs")
    assert proc.returncode == 2 and "expected a benchmark name, got 'codecs'" in proc.stderr


@pytest.mark.parametrize("name", ["codec", "alltoall"])
def test_benchmark_help_shows_defaults(name):
    proc = bench(name, "--help")
    assert proc.returncode == 0 and "(default: " in proc.stdout, proc.stdout


@pytest.mark.parametrize("args, message", [
    (["codec", "--levels", "3"], "argument --levels: invalid choice: 3 (choose from 1, 2)"),
    (["codec", "--error-bound", "-1"], "argument --error-bound: must be >= 0, got -1"),
    (["alltoall", "--level", "3"], "argument --level: invalid choice: 3 (choose from 1, 2)"),
    (["alltoall", "--sizes", "0"], "argument --sizes: must be > 0, got 0"),
    (["netlink", "--repeat", "x"], "argument --repeat: invalid int value: 'x'"),
])
def test_bad_values_are_one_line_with_status_2(args, message):
    proc = bench(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_other_ranks_print_nothing_for_a_bad_value():
    proc = bench("codec", "--levels", "3", env={"OMPI_COMM_WORLD_RANK": "1"})
    assert proc.returncode == 2 and proc.stderr == "" and proc.stdout == ""


@pytest.mark.mpi
def test_alltoall_level_3_under_mpirun_is_refused_once_by_every_rank():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(_mpirun(2) + [sys.executable, "-m", "hvd_lossy.bench", "alltoall",
                                        "--level", "3"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("invalid choice: 3") == 1, proc.stdout + proc.stderr


def test_codec_reuse_reports_the_reuse_share_and_bytes_and_times_a_row_each_way(tmp_path):
    out = tmp_path / "reuse.json"
    proc = bench("codec", "--reuse", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "references / residuals / fresh" in proc.stdout
    got = json.loads(out.read_text())
    total = got["reuse"]["total"]
    assert total["references"] + total["residuals"] + total["fresh"] == total["rows"] > 0
    assert total["references"] + total["residuals"] > 0  # hot ids come back held
    assert 0 < total["reuse_bytes"] < total["today_bytes"]
    timed = got["reuse_time"]
    assert "a reused row takes" in proc.stdout and got["cpu"]["simd_level"] in (0, 1, 2)
    assert set(timed["seconds_per_row"]) == {"coded", "fresh", "reused"}
    assert all(t > 0 for t in timed["seconds_per_row"].values())
    # the unchanged call is references but for ids that lost their slot to another
    assert timed["reused_call"]["references"] > 0.9 * timed["rows"]
    assert timed["reused_call"]["residuals"] == 0


def test_codec_step_times_each_part_of_a_training_step_beside_the_cast_of_the_same_tensor(tmp_path):
    out = tmp_path / "step.json"
    proc = bench("codec", "--step", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    step = got["step"]
    parts = ("lookups", "gradients", "dense")
    kinds = ("compress", "decode", "cast", "cast back")
    assert set(step["seconds"]) == {f"{p} {k}" for p in parts for k in kinds}
    assert all(t > 0 for t in step["seconds"].values())
    # the user script's rank 0: 11 tables x 512 rows x d128 to the other rank, 490,000 dense
    assert step["bytes"]["lookups"]["raw"] == step["bytes"]["gradients"]["raw"] == 11 * 512 * 128 * 4
    assert step["bytes"]["dense"]["raw"] == 490_000 * 4
    # lookups repeat (Zipf ids): dedup takes them well below the gradients' bytes
    assert 0 < step["bytes"]["lookups"]["wire"] < step["bytes"]["gradients"]["wire"] < 11 * 512 * 128 * 4
    assert "x of the cast" in proc.stdout and got["cpu"]["simd_level"] in (0, 1, 2)


def test_codec_step_against_another_build_times_both_in_turn_and_compares_their_frames(tmp_path):
    import hvd_lossy
    built = pathlib.Path(hvd_lossy._C.__file__).parent.parent  # this build, loaded a second time
    out = tmp_path / "step.json"
    proc = bench("codec", "--step", "--quick", "--against", str(built), "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    step = json.loads(out.read_text())["step"]
    assert step["same_frames"] is True
    assert set(step["against_over_this"]) == set(step["seconds"]) == set(step["against_seconds"])
    assert all(r > 0 for r in step["against_over_this"].values())
    assert "the same frames: yes" in proc.stdout
    missing = bench("codec", "--step", "--quick", "--against", str(tmp_path))
    assert missing.returncode == 2 and "no hvd_lossy/_C*.so under" in missing.stderr
    assert "Traceback" not in missing.stderr
    alone = bench("codec", "--against", str(built))
    assert alone.returncode == 2 and "--step only" in alone.stderr


def test_codec_modes_time_each_configuration_at_the_same_bound_with_and_without_the_range(tmp_path):
    out = tmp_path / "codec.json"
    proc = bench("codec", "--quick", "--workloads", "realistic", "--modes", "rel", "abs",
                 "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {r["method"]: r for r in json.loads(out.read_text())["runs"]}
    pairs = [(m, m + " abs") for m in runs if not m.endswith(" abs")]
    assert pairs and all(a in runs for _, a in pairs), sorted(runs)
    for rel, abs_ in pairs:
        # the relative bound given as the absolute one it comes to: the same codes, same bytes
        assert runs[abs_]["bytes"] == runs[rel]["bytes"], (rel, runs[rel], runs[abs_])
        assert runs[abs_]["max_error_over_bound"] <= 1.0
