"""2-rank smoke run of the DLRM example (run by tests/test_dlrm.py under mpirun).

One launch trains several short runs with the same seed: plain Horovod, hvd_lossy with
Compression.none, lossy and adaptive, plus a synthetic-data run, and asserts:
  - Compression.none reproduces the plain-Horovod loss curve exactly (bit for bit);
  - every run saw the same data (same checksum);
  - the metrics carry the documented fields, compression shrinks the bytes, and rank 0 writes
    the metrics JSON and the plots.
Usage: dlrm_smoke.py OUT_DIR
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "dlrm"))

import horovod.torch as hvd  # noqa: E402

import cli  # noqa: E402
import train  # noqa: E402

REQUIRED = ("auc", "logloss", "accuracy", "steps", "train_seconds", "iter_seconds_median",
            "a2a_bytes_plain", "a2a_bytes_sent", "compression_ratio", "tables", "data_checksum",
            "loss_curve", "eval_curve", "time_split")


def run(*extra):
    common = ["--steps", "8", "--batch-size", "128", "--eval-points", "0", "--no-progress", "--seed", "5"]
    return train.train(cli.parser().parse_args(common + list(extra)))


def main():
    out_dir = sys.argv[1]
    hvd.init()
    assert hvd.size() == 2, hvd.size()
    plain = run("--plain-horovod")
    none = run("--compression", "none")
    lossy = run("--compression", "lossy", "--error-bound", "0.03")
    adaptive = run("--compression", "adaptive", "--error-bound", "0.03", "--eval-points", "1")
    overlapped = run("--compression", "lossy", "--error-bound", "0.03", "--overlap")
    none_overlapped = run("--compression", "none", "--overlap")

    assert none["loss_curve"] == plain["loss_curve"], (none["loss_curve"], plain["loss_curve"])
    assert none["auc"] == plain["auc"]
    # --overlap only reorders the work (bottom MLP during the lookups' all-to-all): same numbers
    assert overlapped["loss_curve"] == lossy["loss_curve"] and overlapped["auc"] == lossy["auc"]
    assert overlapped["a2a_bytes_sent"] == lossy["a2a_bytes_sent"]
    assert none_overlapped["loss_curve"] == plain["loss_curve"]
    for r in (plain, none, lossy, adaptive):
        assert r["data_checksum"] == plain["data_checksum"]
        for key in REQUIRED:
            assert key in r, key
        assert r["steps"] == 8 and 0.0 <= r["auc"] <= 1.0 and r["logloss"] > 0
        assert r["eval_rows"] == 800
        assert len(r["tables"]) == 26
    assert none["a2a_bytes_sent"] == none["a2a_bytes_plain"] == plain["a2a_bytes_plain"]
    for r in (lossy, adaptive):
        # every mode counts the same uncompressed bytes: what leaves the ranks (not the own chunk)
        assert r["a2a_bytes_plain"] == plain["a2a_bytes_plain"], (r["a2a_bytes_plain"], plain)
        assert r["a2a_bytes_sent"] * 4 < r["a2a_bytes_plain"], r["compression_ratio"]
        assert r["loss_curve"] != none["loss_curve"]  # the compressed lookups did change training
    assert all(t["bound"] > 0 and t["ratio"] > 1 for t in adaptive["tables"].values())
    assert len(adaptive["eval_curve"]) == 1 and adaptive["table_history"]

    syn = run("--synthetic", "4096", "--synthetic-test", "512", "--batch-size", "256", "--steps", "4",
              "--compression", "lossy")
    assert syn["eval_rows"] == 512 and syn["steps"] == 4
    if hvd.rank() == 0:
        outputs = argparse.Namespace(metrics_out=os.path.join(out_dir, "m.json"),
                                     plots=os.path.join(out_dir, "plots"))
        train.write_outputs(outputs, syn)
        with open(os.path.join(out_dir, "m.json")) as f:
            assert json.load(f)["data_checksum"] == syn["data_checksum"]
        for png in ("loss.png", "auc.png", "tables.png", "time_split.png"):
            assert os.path.getsize(os.path.join(out_dir, "plots", png)) > 1000, png
    print("dlrm_smoke rank %d ok" % hvd.rank())


if __name__ == "__main__":
    main()
