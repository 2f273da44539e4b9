"""benchmarks/reuse_bytes.py (issue 24, stage 1 with the real codec): a short run trains through
the reusing receiver, checks every decoded element against the bound and mirror against cache,
and writes the documented JSON, whose row kinds add up and whose reuse bytes are below today's
once hot ids come back."""
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_a_short_run_measures_the_bytes_of_today_and_of_reuse(tmp_path):
    out = tmp_path / "reuse.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "reuse_bytes.py"), "--rows",
                           "16384", "--batch", "1024", "--steps", "6", "--every", "3",
                           "--optimizer", "sgd", "--grad-by-id", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    t, s = r["totals"], r["summary"]
    assert t["rows"] == 6 * 1024 * 26
    assert t["references"] + t["residuals"] + t["fresh"] == t["rows"]
    assert t["references"] > 0 and 0 < t["reuse"] < t["today"] and t["grad"] > 0
    assert s["forward_fewer_x"] == t["today"] / t["reuse"]
    assert [p["step"] for p in r["curve"]] == [3, 6]
    # gradients summed by id: one row an id instead of one a lookup, so fewer bytes
    assert 0 < t["grad_by_id"] < t["grad"]
    assert s["grad_fewer_x_by_id"] == t["grad"] / t["grad_by_id"]


def test_it_measures_the_bundled_criteo_rows_epoch_after_epoch(tmp_path):
    """--data: the example's real rows, shuffled each epoch; a row seen in an earlier epoch
    comes back, so the second epoch already sends fewer bytes than today's codec."""
    out = tmp_path / "criteo.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "reuse_bytes.py"), "--data",
                           str(REPO / "data" / "criteo_kaggle_sample"), "--batch", "2048",
                           "--epochs", "2", "--every", "3", "--optimizer", "sgd",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    t = r["totals"]
    assert t["rows"] == 6 * 2048 * 26  # 7,200 rows: 3 full batches an epoch
    assert t["references"] + t["residuals"] + t["fresh"] == t["rows"]
    second_epoch = r["curve"][1]
    assert second_epoch["step"] == 6 and second_epoch["reuse"] < second_epoch["today"]
