"""Calibrates hvd_lossy.perfmodel on this machine and checks it against emulated-link DLRM runs.

    sudo python benchmarks/perfmodel_validate.py calibrate [--parts codec,ratio,link,compute]
    sudo python benchmarks/perfmodel_validate.py validate --rates 0.2,0.5 --ranks 2,4,8 --rounds 2

calibrate measures every input the model needs and writes hvd_lossy/perfmodel/calibration.json
(parts merge into it, so they can be rerun one at a time), each with where and when it was
measured, or marked assumed:
  codec    one thread, GB/s and seconds a piece of compress/decompress (lookups, dithered
           gradients) and of torch's fp16 casts, from pieces of 64 and 1,024 rows
  ratio    the DLRM example's own all-to-all bytes (plain / sent, forward and backward) at rows a
           chunk 16..4,096 (2 ranks, shared memory, a few steps), lossy and adaptive; and the
           codec's forward ratio on the real bundled Kaggle / Terabyte-sample rows
  link     a Horovod call's fixed cost at each rank count, and the payload rate of the emulated
           link (benchmarks/perfmodel_collectives.py inside the namespace)
  compute  the example's step without the link: plain runs over the namespace's unlimited
           loopback, less the model's communication terms there
validate runs the example over the limited link (hvd_lossy.bench.netlink's namespace and mpirun
machinery), modes taking turns within a round, and writes measured against predicted to
benchmarks/results/perfmodel_validation.json. The prediction uses only the calibration: no
validation run feeds it.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from perfmodel_calibrate import (CPU_MODES, MODES, RATIO_ROWS, REPO, SETTINGS, build_presets,  # noqa: E402,F401
                                 calibrate, compute_from_runs, nl, now, perfmodel, provenance, run_dlrm, unlimited_run)

VALIDATION = REPO / "benchmarks" / "results" / "perfmodel_validation.json"


# ---------------------------------------------------------------- validation


def predicted(setting, ranks, gbit, mode, calib):
    batch = nl.batch_for(SETTINGS[setting]["batch"], ranks)
    wl, net, res = perfmodel.scenario(f"dev-{setting}", calib, ranks, gbit, batch=batch)
    return perfmodel.predict(mode, wl, net, res)


def validate(opts):
    calib = perfmodel.load_calibration()
    calib["presets"] = build_presets(calib)  # the presets of this code, from the measured inputs
    runs, unlimited = [], {str(r): [] for r in opts.ranks}
    with tempfile.TemporaryDirectory() as tmp, nl.signals_raise(), nl.Namespace(opts.namespace) as ns:
        for k in range(opts.rounds):
            for ranks in opts.ranks:
                # the CPU calibration's runs of this round: no qdisc, each mode with CPU work of
                # its own (the machine is shared, so calibration and validation take turns
                # under the same load)
                for mode in CPU_MODES:
                    unlimited[str(ranks)].append(unlimited_run(ns, "val-d128", ranks, tmp, k, mode))
                for gbit in opts.rates:
                    ns.set_rate(gbit)
                    for mode in opts.modes:  # modes take turns: noise hits them alike
                        rec = run_dlrm(ns, "val-d128", ranks, mode, tmp, f"{gbit}_{k}")
                        rec.update(ranks=ranks, bandwidth_gbit=gbit, mode=mode, round=k, setting="val-d128")
                        runs.append(rec)
                        print(f"{gbit:g} Gbit/s, {ranks} ranks, {mode} #{k}: " + (
                            f"{1e3 * rec['measured_s']:.1f} ms an iteration (timed step "
                            f"{1e3 * rec['timed_step_s']:.1f} ms, load {rec['loadavg'][0]:.1f})"
                            if rec["status"] == "ok" else f"FAILED {rec['error']}"), flush=True)
            write_validation(calib, runs, unlimited, opts, k + 1)


def write_validation(calib, runs, unlimited, opts, rounds_done):
    """Calibration of this validation's compute and codec, then the record: after every round,
    so that a run cut short still leaves what it measured."""
    calib.setdefault("compute", {})["val-d128"] = compute_from_runs("val-d128", unlimited, calib)
    calib["provenance"]["compute"] = provenance(
        f"val-d128: runs with no qdisc ({', '.join(CPU_MODES)}), one each a rank count in each of the "
        f"{opts.rounds} validation rounds, before that round's limited runs ({rounds_done} done); "
        f"criteo-d128: see provenance.compute_criteo")
    calib["presets"] = build_presets(calib)
    perfmodel.CALIBRATION.write_text(json.dumps(calib, indent=1))
    out = summarise(runs, calib)
    out["held_against_results"] = hold_against_results(calib)
    VALIDATION.write_text(json.dumps(out, indent=1))
    print(report(out))
    print(f"wrote {VALIDATION}")


def summarise(runs, calib):
    """One record per (rate, ranks, mode): median over rounds against the prediction."""
    groups = {}
    for r in runs:
        if r["status"] == "ok":
            groups.setdefault((r["bandwidth_gbit"], r["ranks"], r["mode"]), []).append(r)
    out = []
    for (gbit, ranks, mode), rs in groups.items():
        pred = predicted("val-d128", ranks, gbit, mode, calib)
        measured = statistics.median(r["measured_s"] for r in rs)
        timed = statistics.median(r["timed_step_s"] for r in rs) if all("timed_step_s" in r for r in rs) else None
        out.append({"ranks": ranks, "bandwidth_gbit": gbit, "mode": mode, "setting": "val-d128",
                    "measured_s": measured, "predicted_s": pred["seconds"],
                    "error": pred["seconds"] / measured - 1, "dominant": pred["dominant"],
                    "timed_step_s": timed, "error_vs_timed_step": timed and pred["seconds"] / timed - 1,
                    "terms_s": pred["terms"], "predicted_ratio": pred["ratio"],
                    "measured_ratio": [statistics.median(r["fwd_ratio"] for r in rs),
                                       statistics.median(r["bwd_ratio"] for r in rs)],
                    "measured_s_rounds": [r["measured_s"] for r in rs],
                    "loadavg": [r["loadavg"][0] for r in rs]})
    return {"date": now(), "machine": "dev (2 cores, shared with other engineers' jobs)",
            "command": "python benchmarks/perfmodel_validate.py " + " ".join(sys.argv[1:]),
            "calibration": str(perfmodel.CALIBRATION.relative_to(REPO)),
            "calibration_provenance": calib.get("provenance"),
            "fields": {"measured_s": "median over rounds of each run's median iteration: the period between "
                                     "step starts (rank 0, after the setting's warm-up steps)",
                       "timed_step_s": "the same of train.py's timed step (iter_seconds), which leaves out "
                                       "the host work between steps and what the link carries meanwhile",
                       "predicted_s": "hvd_lossy.perfmodel from the calibration alone",
                       "error": "predicted / measured - 1"},
            "runs": out, "all_runs": runs}


RESULTS_RUNS = [("netlink_dev_2026-12-01_dlrm.json", (1.0, 10.0)),
                ("netlink_dev_2026-12-01_dlrm_3ranks.json", (1.0, 10.0))]
NETLINK_MODES = {"uncompressed": "plain", "fp16": "fp16", "lossy": "lossy", "adaptive": "adaptive", "auto": "auto"}


A2A_UNLIMITED = "netlink_dev_2026-12-01_alltoall_run2.json"  # the all-to-all alone, same day, quiet machine


def same_session_compute(records, ranks, calib):
    """criteo-d128's compute from the RESULTS run's own plain step over the unlimited loopback
    (same session, same load as its 1 and 10 Gbit/s runs), less the model's communication there
    at the loopback rate of the all-to-all alone that day (16 MiB a rank, less its 64 KiB call).
    None where the file has no such step."""
    base = [r for r in records if r["setting"] == "criteo-d128" and r["bandwidth_gbit"] is None
            and r["ranks"] == ranks and r["mode"] == "uncompressed" and r["status"] == "ok"]
    a2a = json.loads((REPO / "benchmarks" / "results" / A2A_UNLIMITED).read_text())["alltoall"]
    plain = {r["bytes"]: r["ms_per_call"] / 1e3 for r in a2a if r["bandwidth_gbit"] is None and
             r["mode"] == "plain" and r["ranks"] == 2}
    if not base or not plain:
        return None
    big, small = max(b for b in plain if b <= 16 << 20), min(plain)
    lo_gbit = 2 * big / 2 / (plain[big] - plain[small]) * 8 / 1e9  # 2 ranks, half of each message remote
    wl, net, res = perfmodel.scenario("dev-criteo-d128", calib, ranks, lo_gbit, compute_s=0.0, efficiency=1.0,
                                      burst_bytes=0, batch=nl.batch_for(1024, ranks))
    comm = perfmodel.predict("plain", wl, net, res)["seconds"]
    return {"compute_s": base[0]["iter_seconds_median"] - comm, "plain_unlimited_s": base[0]["iter_seconds_median"],
            "model_comm_unlimited_s": comm, "loopback_gbit": lo_gbit}


def hold_against_results(calib):
    """The model against the criteo-d128 runs of RESULTS.md at 1 and 10 Gbit/s (2 and 3 ranks):
    with this calibration, and (2 ranks) with compute from that session's own unlimited run."""
    out = []
    for name, rates in RESULTS_RUNS:
        path = REPO / "benchmarks" / "results" / name
        records = json.loads(path.read_text())["dlrm"]
        for r in records:
            if r["setting"] != "criteo-d128" or r["bandwidth_gbit"] not in rates or r["status"] != "ok":
                continue
            mode = NETLINK_MODES[r["mode"]]
            pred = predicted("criteo-d128", r["ranks"], r["bandwidth_gbit"], mode, calib)
            same = same_session_compute(records, r["ranks"], calib)
            if same:
                wl, net, res = perfmodel.scenario("dev-criteo-d128", calib, r["ranks"], r["bandwidth_gbit"],
                                                  compute_s=same["compute_s"], batch=nl.batch_for(1024, r["ranks"]))
                same["predicted_s"] = perfmodel.predict(mode, wl, net, res)["seconds"]
                same["error"] = same["predicted_s"] / r["iter_seconds_median"] - 1
            out.append({"same_session_compute": same, "source": f"benchmarks/results/{name}", "ranks": r["ranks"],
                        "bandwidth_gbit": r["bandwidth_gbit"], "mode": mode, "setting": "criteo-d128",
                        "measured_s": r["iter_seconds_median"], "predicted_s": pred["seconds"],
                        "error": pred["seconds"] / r["iter_seconds_median"] - 1, "dominant": pred["dominant"],
                        "terms_s": pred["terms"]})
    return out


def report(out):
    lines = [f"{'setting':>12} {'Gbit/s':>7} {'ranks':>5} {'mode':>9} {'measured ms':>12} {'predicted ms':>13} "
             f"{'error':>7} {'dominant':>10}"]
    for r in out["runs"] + out.get("held_against_results", []):
        same = r.get("same_session_compute")
        lines.append(f"{r['setting']:>12} {r['bandwidth_gbit']:>7g} {r['ranks']:>5} {r['mode']:>9} "
                     f"{1e3 * r['measured_s']:>12.1f} {1e3 * r['predicted_s']:>13.1f} {100 * r['error']:>+6.1f}% "
                     f"{r['dominant']:>10}" + (f"   same-session compute: {1e3 * same['predicted_s']:.1f} ms "
                                               f"({100 * same['error']:+.1f}%)" if same else ""))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["calibrate", "validate", "report"],
                   help="report: re-predict the recorded runs (after a model change) and rewrite the record")
    p.add_argument("--parts", type=lambda s: s.split(","), default=["codec", "ratio", "link", "compute"])
    p.add_argument("--ratio-rows", type=lambda s: [int(v) for v in s.split(",")], default=RATIO_ROWS)
    p.add_argument("--rates", type=lambda s: [float(v) for v in s.split(",")], default=[0.2])
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4, 8])
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--namespace", default=f"hvdl-p13-{os.getpid()}")
    opts = p.parse_args(argv)
    if opts.what == "calibrate":
        calibrate(opts)
    elif opts.what == "validate":
        validate(opts)
    else:  # re-predict the recorded validation runs with the current model and calibration
        out = json.loads(VALIDATION.read_text())
        calib = perfmodel.load_calibration()
        calib["presets"] = build_presets(calib)
        # the CPU terms again from the recorded unlimited runs, with this code's calibration
        runs = {r: c["runs"] for r, c in calib["compute"]["val-d128"].items()}
        if all("timed_step_s" in x for rs in runs.values() for x in rs):
            calib["compute"]["val-d128"] = compute_from_runs("val-d128", runs, calib)
            calib["presets"] = build_presets(calib)
        perfmodel.CALIBRATION.write_text(json.dumps(calib, indent=1))
        out["runs"] = summarise(out["all_runs"], calib)["runs"]
        out["held_against_results"] = hold_against_results(calib)
        VALIDATION.write_text(json.dumps(out, indent=1))
        print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
