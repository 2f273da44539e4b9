"""Projects hvd_lossy.perfmodel to 8-1,024 GPUs: JSON, a markdown table and a PNG of speedup.

    python benchmarks/perfmodel_project.py --json benchmarks/results/perfmodel_projection.json \
        --png benchmarks/results/perfmodel_projection.png --markdown

Presets cluster-kaggle and cluster-terabyte of the committed calibration (their inputs and
where each comes from are in the JSON; `scenarios[]` holds each (preset, codec, ranks, rate)
once with its resolved inputs and every mode's prediction), at 25, 100, 200 and 400 Gbit/s. The PNG has a panel per
cardinality set and codec: predicted speedup of lossy over plain against ranks, a line a rate.
"""
import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvd_lossy import perfmodel  # noqa: E402

RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]
RATES = [25.0, 100.0, 200.0, 400.0]
CODECS = ["gpu-h200", "gpu-h200-one-launch"]


def project(calib):
    rows = []
    for data in ("kaggle", "terabyte"):
        for codec in CODECS:
            rows += perfmodel.sweep(f"cluster-{data}", calib, RANKS, RATES, perfmodel.MODES, codec)
    return rows


def markdown(rows, ranks=(8, 64, 1024)):
    """Speedup over plain of fp16 / lossy / auto, and plain's ms and dominant term, a line per
    (data, codec, rate, ranks)."""
    cell = {(r["preset"], r["inputs"]["codec"], r["bandwidth_gbit"], r["ranks"], r["mode"]): r for r in rows}
    lines = ["| data | codec | Gbit/s | GPUs | rows a chunk | plain ms (dominant) | fp16 | lossy (ratio fwd/bwd) "
             "| adaptive | auto | lossy's dominant |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for preset in ("cluster-kaggle", "cluster-terabyte"):
        for codec in CODECS:
            for g in RATES:
                for p in ranks:
                    c = {m: cell[(preset, codec, g, p, m)] for m in perfmodel.MODES}
                    lines.append(
                        f"| {preset[8:]} | {codec} | {g:g} | {p} | {c['plain']['rows_per_chunk']} | "
                        f"{1e3 * c['plain']['seconds']:.2f} ({c['plain']['dominant']}) | {c['fp16']['speedup']:.2f}x | "
                        f"{c['lossy']['speedup']:.2f}x ({c['lossy']['ratio'][0]:.1f}/{c['lossy']['ratio'][1]:.1f}) | "
                        f"{c['adaptive']['speedup']:.2f}x | {c['auto']['speedup']:.2f}x | {c['lossy']['dominant']} |")
    return "\n".join(lines)


def compact(rows, ranks=(8, 64, 1024), rates=(25.0, 100.0, 400.0)):
    """README's table: lossy's (and auto's) speedup over plain, a line per (data, codec, ranks)."""
    cell = {(r["preset"], r["inputs"]["codec"], r["bandwidth_gbit"], r["ranks"], r["mode"]): r for r in rows}
    lines = ["| data | GPU codec | GPUs | rows a chunk | " + " | ".join(f"{g:g} Gbit/s lossy (auto)" for g in rates) + " |",
             "|---|---|---|---|" + "---|" * len(rates)]
    for preset in ("cluster-kaggle", "cluster-terabyte"):
        for codec in CODECS:
            for p in ranks:
                cells = [f"{cell[(preset, codec, g, p, 'lossy')]['speedup']:.2f}x "
                         f"({cell[(preset, codec, g, p, 'auto')]['speedup']:.2f}x)" for g in rates]
                lines.append(f"| {preset[8:]} | {codec} | {p} | {cell[(preset, codec, rates[0], p, 'plain')]['rows_per_chunk']}"
                             f" | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scenarios(rows):
    """The rows grouped by scenario (preset, codec, ranks, rate): the five modes of one scenario
    share its inputs, which are written once."""
    out = {}
    for r in rows:
        key = (r["preset"], r["inputs"]["codec"], r["ranks"], r["bandwidth_gbit"])
        s = out.setdefault(key, {"preset": r["preset"], "ranks": r["ranks"], "bandwidth_gbit": r["bandwidth_gbit"],
                                 "inputs": r["inputs"], "modes": {}})
        s["modes"][r["mode"]] = {k: v for k, v in r.items()
                                 if k not in ("mode", "preset", "ranks", "bandwidth_gbit", "inputs")}
    return list(out.values())


def record(calib, rows):
    """The JSON: the presets, codecs and ratio curves with their sources, then one line a scenario
    (a line each keeps the file small and its diffs readable)."""
    head = {"presets": {k: v for k, v in calib["presets"].items() if k.startswith("cluster-")},
            "codecs": {c: calib["codec"][c] for c in CODECS},
            "ratio": {k: calib["ratio"][k] for k in ("kaggle-d128", "terabyte-d128")}}
    lines = ",\n".join(json.dumps(s) for s in scenarios(rows))
    return json.dumps(head, indent=1)[:-2] + ',\n "scenarios": [\n' + lines + "\n ]\n}\n"


def write_png(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(p, c) for p in ("cluster-kaggle", "cluster-terabyte") for c in CODECS]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), sharey=True)
    for ax, (preset, codec) in zip(axes, panels):
        for g in RATES:
            pts = sorted((r["ranks"], r["speedup"]) for r in rows if r["preset"] == preset and
                         r["inputs"]["codec"] == codec and r["bandwidth_gbit"] == g and r["mode"] == "lossy")
            ax.plot([p for p, _ in pts], [s for _, s in pts], marker="o", label=f"{g:g} Gbit/s")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (global batch 65,536)")
        ax.set_title(f"{preset[8:]}, {codec}", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("predicted speedup, lossy over plain")
    fig.suptitle("hvd_lossy.perfmodel projection (inputs: benchmarks/results/perfmodel_projection.json)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--png", type=pathlib.Path, default=None)
    p.add_argument("--markdown", action="store_true", help="print the RESULTS.md table")
    p.add_argument("--compact", action="store_true", help="print the README's table")
    args = p.parse_args(argv)
    calib = perfmodel.load_calibration()
    rows = project(calib)
    if args.json:
        args.json.write_text(record(calib, rows))
        print(f"wrote {args.json}")
    if args.png:
        write_png(rows, args.png)
        print(f"wrote {args.png}")
    if args.compact:
        print(compact(rows))
    if args.markdown or not (args.json or args.png or args.compact):
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
