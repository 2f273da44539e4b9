"""benchmarks/reuse_share.py (issue 24's measurement): a short run writes the documented JSON, the
shares add up, and a receiver that knows the ids never needs more bytes than one that does not."""
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_a_short_run_measures_held_rows_and_bytes_of_both_senders(tmp_path):
    out = tmp_path / "reuse.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "reuse_share.py"), "--rows", "16384",
                           "--batch", "1024", "--steps", "6", "--every", "3", "--optimizer", "sgd",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    t, s = r["totals"], r["summary"]
    assert t["rows"] == 6 * 1024 * 26 and 0 < t["distinct"] <= t["rows"]
    assert t["held"] == t["reference"] + t["residual"] + t["recoded"]
    assert t["held"] + t["fresh"] == t["distinct"]
    assert t["held"] > 0  # hot ids come back from the second step on
    assert 0 < t["reuse_ids_known"] <= t["reuse"] and t["today"] > 0 and t["grad"] > 0
    assert s["forward_fewer_x_ids_known"] >= s["forward_fewer_x"] > 0
    assert [p["step"] for p in r["curve"]] == [3, 6]
