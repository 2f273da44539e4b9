"""`python -m hvd_lossy.perfmodel`: the model's predictions as a table (and JSON) for a preset of
the calibration at the given ranks and link rates (see hvd_lossy/perfmodel/__init__.py)."""
import argparse
import json
import pathlib
import sys

from hvd_lossy.perfmodel import CALIBRATION, MODES, check_positive, load_calibration, sweep


def table(rows):
    """Rows of predictions as aligned text: one line per (ranks, bandwidth, mode)."""
    lines = [f"{'ranks':>6} {'Gbit/s':>7} {'rows':>6} {'mode':>9} {'ms/step':>9} {'speedup':>8} "
             f"{'ratio fwd/bwd':>13} {'dominant':>10}"]
    for r in rows:
        lines.append(f"{r['ranks']:>6} {r['bandwidth_gbit']:>7g} {r['rows_per_chunk']:>6} {r['mode']:>9} "
                     f"{1e3 * r['seconds']:>9.2f} {r['speedup']:>7.2f}x "
                     f"{r['ratio'][0]:>6.1f}/{r['ratio'][1]:<6.1f} {r['dominant']:>10}")
    return "\n".join(lines)


def _numbers(kind):
    def parse(text):
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected values > 0, got {text!r}")
        return values
    return parse


# The workload's factors a flag sets (each default 1: the feature off), with their help.
FACTORS = {
    "reuse_fewer": "lossy/adaptive with reuse=True: times fewer forward bytes (measured by "
                   "benchmarks/reuse_bytes.py, e.g. 3.3 with SGD, 1.9 with Adagrad; default 1: "
                   "no reuse)",
    "reuse_grad_fewer": "lossy with reuse=True: times fewer gradient bytes, summed by id "
                        "(benchmarks/reuse_bytes.py --grad-by-id, e.g. 2.9; default 1)",
    "reuse_codec": "lossy/adaptive with reuse=True: times the lookups' codec work (e.g. 3: a "
                   "reused row costs about 3x a coded row, benchmarks/RESULTS.md; default 1)",
    "dense_fewer": "lossy/adaptive with the dense gradients coded too (DistributedOptimizer "
                   "given the compressor): times fewer bytes their frames take (e.g. 22 in the "
                   "DLRM user script, benchmarks/RESULTS.md; default 1: Horovod's allreduce of "
                   "them)",
}


def parser():
    p = argparse.ArgumentParser(prog="python -m hvd_lossy.perfmodel", description="Predicts a DLRM training step for plain, fp16, lossy, adaptive and auto.")
    p.add_argument("--preset", default="cluster-kaggle",
                   help="a workload + network + codec of the calibration (default cluster-kaggle; "
                        "`--list` names them)")
    p.add_argument("--ranks", type=_numbers(int), default=[8, 64, 1024], help="rank counts (default 8,64,1024)")
    p.add_argument("--bandwidth", type=_numbers(float), default=[25, 100, 400],
                   help="link rates in Gbit/s (default 25,100,400)")
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--codec", default=None,
                   help="codec rates of the calibration (default: the preset's; e.g. gpu-h200-one-launch)")
    p.add_argument("--batch", type=int, default=None, help="global batch (default: the preset's)")
    p.add_argument("--compute-ms", type=float, default=None, help="compute a step in ms (default: the preset's)")
    for name, text in FACTORS.items():
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None, help=text)
    p.add_argument("--calibration", type=pathlib.Path, default=CALIBRATION)
    p.add_argument("--json", type=pathlib.Path, default=None, help="also write the predictions here")
    p.add_argument("--list", action="store_true", help="list the calibration's presets and exit")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    calibration = load_calibration(args.calibration)
    if args.list:
        for name, p in calibration["presets"].items():
            print(f"{name}: {p['about']}")
        return 0
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        parser().error(f"unknown modes {bad}; expected some of {list(MODES)}")
    overrides = {}
    if args.batch:
        overrides["batch"] = args.batch
    for name in FACTORS:
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.compute_ms is not None:
        overrides["compute_s"] = check_positive("--compute-ms", args.compute_ms) / 1e3
    try:
        rows = sweep(args.preset, calibration, args.ranks, args.bandwidth, args.modes, args.codec, **overrides)
    except ValueError as e:
        parser().error(str(e))
    print(f"preset {args.preset}: {calibration['presets'][args.preset]['about']}")
    print(table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"preset": args.preset, "predictions": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
