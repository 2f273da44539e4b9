"""Summary of a quality benchmark: compressed runs against uncompressed ones with the same seed.

    python examples/dlrm/quality.py OUT_JSON RUN.json [RUN.json ...]

Runs are grouped by data set (synthetic N or the files) and --compression label (the metrics'
"label" if present, else "compression"). For each group against "none": the mean over seeds of
AUC, logloss and bytes; the paired deltas (same seed, same data, same init); and the uncompressed
seed-to-seed spread, so a delta can be read against the noise of the data set.
"""

import json
import statistics
import sys

TARGETS = {"min_ratio": 15.0, "max_abs_dauc": 0.001, "max_abs_dlogloss": 0.002}


def _data_key(m):
    a = m["args"]
    if a["synthetic"]:
        return "synthetic_%d" % a["synthetic"]
    return "files:%s" % a["data"].rstrip("/").split("/")[-1]


def _label(m):
    return m.get("label") or m["compression"]


def summarise(runs):
    """dict data set -> label -> statistics (see the module docstring)."""
    groups = {}
    for m in runs:
        groups.setdefault(_data_key(m), {}).setdefault(_label(m), {})[m["args"]["seed"]] = m
    out = {}
    for data_key, by_label in sorted(groups.items()):
        base = by_label.get("none", {})
        res = {}
        for label, by_seed in sorted(by_label.items()):
            seeds = sorted(by_seed)
            aucs = [by_seed[s]["auc"] for s in seeds]
            lls = [by_seed[s]["logloss"] for s in seeds]
            row = {"seeds": seeds, "auc_mean": statistics.mean(aucs), "logloss_mean": statistics.mean(lls),
                   "auc_spread": max(aucs) - min(aucs), "logloss_spread": max(lls) - min(lls),
                   "auc_std": statistics.stdev(aucs) if len(aucs) > 1 else None,
                   "compression_ratio": statistics.mean(by_seed[s]["compression_ratio"] for s in seeds),
                   "a2a_bytes_sent_mean": statistics.mean(by_seed[s]["a2a_bytes_sent"] for s in seeds),
                   "a2a_bytes_plain_mean": statistics.mean(by_seed[s]["a2a_bytes_plain"] for s in seeds),
                   "train_seconds_mean": statistics.mean(by_seed[s]["train_seconds"] for s in seeds),
                   "compressor": by_seed[seeds[0]].get("compressor"),
                   "steps": by_seed[seeds[0]]["steps"]}
            paired = [s for s in seeds if s in base]
            if label != "none" and paired:
                dauc = [by_seed[s]["auc"] - base[s]["auc"] for s in paired]
                dll = [by_seed[s]["logloss"] - base[s]["logloss"] for s in paired]
                same = all(by_seed[s]["data_checksum"] == base[s]["data_checksum"] for s in paired)
                row.update(dauc=dauc, dlogloss=dll, dauc_mean=statistics.mean(dauc),
                           dlogloss_mean=statistics.mean(dll), max_abs_dauc=max(map(abs, dauc)),
                           max_abs_dlogloss=max(map(abs, dll)), same_data=same)
                row["meets_targets"] = {
                    "ratio>=%g" % TARGETS["min_ratio"]: row["compression_ratio"] >= TARGETS["min_ratio"],
                    "|dAUC|<=%g" % TARGETS["max_abs_dauc"]: abs(row["dauc_mean"]) <= TARGETS["max_abs_dauc"],
                    "|dlogloss|<=%g" % TARGETS["max_abs_dlogloss"]:
                        abs(row["dlogloss_mean"]) <= TARGETS["max_abs_dlogloss"]}
            res[label] = row
        out[data_key] = res
    return out


def text(summary):
    lines = []
    for data_key, res in summary.items():
        lines.append("== %s (AUC spread of 'none' over seeds: %.4f) ==" % (
            data_key, res["none"]["auc_spread"] if "none" in res else float("nan")))
        lines.append("%-16s %8s %8s %9s %9s %9s %8s %8s" % (
            "compression", "AUC", "logloss", "dAUC", "dlogloss", "max|dAUC|", "ratio", "train s"))
        for label, r in res.items():
            d = lambda k: ("%+9.4f" % r[k]) if k in r else "%9s" % "-"  # noqa: E731
            lines.append("%-16s %8.4f %8.4f %s %s %9s %8.1f %8.1f" % (
                label, r["auc_mean"], r["logloss_mean"], d("dauc_mean"), d("dlogloss_mean"),
                ("%.4f" % r["max_abs_dauc"]) if "max_abs_dauc" in r else "-", r["compression_ratio"],
                r["train_seconds_mean"]))
    return "\n".join(lines)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: quality.py OUT_JSON RUN.json [RUN.json ...]")
    runs = []
    for path in sys.argv[2:]:
        with open(path) as f:
            runs.append(json.load(f))
    summary = summarise(runs)
    with open(sys.argv[1], "w") as f:
        json.dump({"targets": TARGETS, "summary": summary}, f, indent=1)
    print(text(summary))


if __name__ == "__main__":
    main()
