"""The iteration against train.py's timed step: val-d128 runs over the emulated link, each
giving the median period between step starts, the median timed step and the host gap between
them (rank 0, after the setting's warm-up steps), with train.py's own split of the timed step.

    sudo python benchmarks/perfmodel_period_probe.py 2:lossy:0.1,2:plain:0.1,8:fp16:0.1,8:lossy:0.1 \
        --json out.json

Cases are ranks:mode:Gbit/s ("none": no qdisc), modes as benchmarks/perfmodel_validate.py's.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from perfmodel_calibrate import HOROVOD, MODES, SETTINGS, nl, provenance, train_args  # noqa: E402


def case(text):
    try:
        ranks, mode, gbit = text.split(":")
        rec = (int(ranks), mode, None if gbit == "none" else float(gbit))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a case is ranks:mode:gbit, got {text!r}") from None
    if rec[1] not in MODES:
        raise argparse.ArgumentTypeError(f"mode must be one of {list(MODES)}, got {rec[1]!r}")
    return rec


def probe(ns, ranks, mode, gbit, tmp):
    ns.set_rate(gbit)
    metrics = pathlib.Path(tmp) / "m.json"
    argv = [sys.executable, str(nl.TRAIN), *train_args("val-d128", ranks, mode), "--metrics-out", str(metrics)]
    run = nl.run_in(ns, ranks, argv, HOROVOD, 900)
    if run["rc"] != 0:
        raise RuntimeError(f"{ranks} ranks {mode} at {gbit} Gbit/s failed: {run['output'][-1500:]}")
    m = json.loads(metrics.read_text())
    w = SETTINGS["val-d128"]["warmup"]
    steps, starts, split = m["iter_seconds"][w:], m["step_starts"][w:], m["time_split"][w:]
    periods = [b - a for a, b in zip(starts, starts[1:])]
    return {"ranks": ranks, "mode": mode, "bandwidth_gbit": gbit, "iteration_s": statistics.median(periods),
            "timed_step_s": statistics.median(steps),
            "host_s": statistics.median(p - s for p, s in zip(periods, steps)),
            "outside_a2a_s": statistics.median(t["compute_s"] for t in split),
            "a2a_s": statistics.median(t["comm_s"] for t in split),
            "codec_s": statistics.median(t["compress_s"] for t in split),
            "wire_bytes": run["wire_bytes"], "loadavg": os.getloadavg()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cases", type=lambda s: [case(c) for c in s.split(",")])
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--namespace", default=f"hvdl-p13b-probe-{os.getpid()}")
    args = p.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory() as tmp, nl.signals_raise(), nl.Namespace(args.namespace) as ns:
        for ranks, mode, gbit in args.cases:
            rec = probe(ns, ranks, mode, gbit, tmp)
            out.append(rec)
            print(f"{ranks} ranks {mode} at {gbit} Gbit/s: iteration {1e3 * rec['iteration_s']:.1f} ms, timed step "
                  f"{1e3 * rec['timed_step_s']:.1f} ms, host {1e3 * rec['host_s']:.1f} ms "
                  f"(load {rec['loadavg'][0]:.1f})",
                  flush=True)
    if args.json:
        prov = dict(provenance("val-d128 runs: iteration against timed step"),
                    command="python benchmarks/perfmodel_period_probe.py " + " ".join(sys.argv[1:]))
        args.json.write_text(json.dumps({"provenance": prov, "runs": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
