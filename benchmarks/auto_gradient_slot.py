"""What auto's two slots decide on a slow link: the perf model's validation setting (val-d128,
2 ranks) with `--auto` at 0.1 Gbit/s, R runs, each run's step times and comm_stats()["auto"].

    sudo python benchmarks/auto_gradient_slot.py [RUNS]

Shows whether the gradient all-to-all's slot follows the forward one (since `auto.pair`) or
decides from its own, mixed, intervals (before it: plain and lossy medians alike).
"""
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import perfmodel_calibrate as pc  # noqa: E402


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tmp = pathlib.Path(tempfile.mkdtemp())
    with pc.nl.signals_raise(), pc.nl.Namespace("hvdl-auto") as ns:
        ns.set_rate(0.1)
        for k in range(runs):
            rec = pc.run_dlrm(ns, "val-d128", 2, "auto", str(tmp), f"a{k}")
            m = json.loads((tmp / f"val-d128_2_auto_a{k}.json").read_text())
            print(f"run {k}: iteration {1e3 * rec['measured_s']:.1f} ms, forward ratio "
                  f"{rec['fwd_ratio']:.2f}, backward ratio {rec['bwd_ratio']:.2f}, load {rec['loadavg'][0]:.1f}")
            print("  step ms:", [round(1e3 * t) for t in m["iter_seconds"]])
            for s in m["auto"]:
                print("  slot:", {k: v for k, v in s.items() if k not in ("compressor", "follows")},
                      "follows the forward one" if "follows" in s else "")


if __name__ == "__main__":
    main()
