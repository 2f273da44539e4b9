"""Side-by-side summary of DLRM runs from their --metrics-out files.

    python examples/dlrm/compare.py none.json adaptive.json [--labels uncompressed,adaptive]
"""

import argparse
import json


ROWS = [
    ("AUC", "auc", "%.4f"),
    ("logloss", "logloss", "%.4f"),
    ("accuracy", "accuracy", "%.4f"),
    ("train steps", "steps", "%d"),
    ("all-to-all MB plain", "a2a_bytes_plain", "%.2f", 1e-6),
    ("all-to-all MB sent", "a2a_bytes_sent", "%.2f", 1e-6),
    ("  of which forward", "a2a_fwd_bytes_sent", "%.2f", 1e-6),
    ("  of which backward", "a2a_bwd_bytes_sent", "%.2f", 1e-6),
    ("  of which codec frames", "a2a_bytes_codec", "%.2f", 1e-6),
    ("compression ratio", "compression_ratio", "x%.1f"),
    ("train seconds", "train_seconds", "%.1f"),
    ("median step ms", "iter_seconds_median", "%.1f", 1e3),
    ("compress+decode s r0", "compress_total_s", "%.2f"),
    ("communicate s r0", "comm_total_s", "%.2f"),
]


def table(runs, labels):
    """The summary as text: one column per run, then deltas of the last run against the first."""
    for r in runs:
        r["compress_total_s"] = sum(s["compress_s"] for s in r.get("time_split", []))
        r["comm_total_s"] = sum(s["comm_s"] for s in r.get("time_split", []))
    width = max(12, *(len(x) + 2 for x in labels))
    lines = ["%-22s" % "" + "".join("%*s" % (width, x) for x in labels)]
    for row in ROWS:
        name, key, fmt = row[:3]
        scale = row[3] if len(row) > 3 else 1
        cells = [(fmt % (r[key] * scale)) if key in r else "-" for r in runs]
        lines.append("%-22s" % name + "".join("%*s" % (width, c) for c in cells))
    if len(runs) > 1:
        a, b = runs[0], runs[-1]
        lines.append("")
        same = "yes" if a["data_checksum"] == b["data_checksum"] else "NO"
        lines.append("%s vs %s: dAUC %+.4f  dlogloss %+.4f  bytes on the wire / %.1f  (same data: %s)" % (
            labels[-1], labels[0], b["auc"] - a["auc"], b["logloss"] - a["logloss"],
            a["a2a_bytes_sent"] / b["a2a_bytes_sent"], same))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("metrics", nargs="+", help="--metrics-out files")
    p.add_argument("--labels", default="", help="comma-separated column names (none: each run's label)")
    args = p.parse_args()
    runs = []
    for path in args.metrics:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except OSError as e:
            p.error("cannot read metrics file %s: %s (write one with train.py --metrics-out)"
                    % (path, e.strerror))
        except ValueError as e:
            p.error("metrics file %s is not JSON: %s" % (path, e))
        missing = [k for k in ("auc", "logloss", "a2a_bytes_sent") if k not in runs[-1]]
        if missing:
            p.error("%s is not a train.py --metrics-out file: no %s" % (path, ", ".join(missing)))
    labels = args.labels.split(",") if args.labels else [r.get("label", "?") for r in runs]
    if len(labels) != len(runs):
        p.error("--labels names %d runs, got %d metrics files" % (len(labels), len(runs)))
    print(table(runs, labels))


if __name__ == "__main__":
    main()
