"""Measures the inputs of hvd_lossy.perfmodel on this machine: the `calibrate` half of
benchmarks/perfmodel_validate.py (which runs it, and holds the commands).

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
  compute  criteo-d128's step without the link: plain runs over the namespace's unlimited
           loopback, outside their all-to-all calls, less the model's ids and allreduce there
           (val-d128's is measured by `validate` itself, in turns with its runs)
"""
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvd_lossy import perfmodel  # noqa: E402
from hvd_lossy.bench import netlink as nl  # noqa: E402

RATIO_ROWS = [16, 64, 256, 1024, 4096]
# The validation workload: dim 128 at a small batch, so that at 0.1-0.5 Gbit/s the link, not the
# two cores, sets the step time. criteo-d128 is hvd_lossy.bench.netlink's setting (RESULTS.md).
SETTINGS = {
    "val-d128": dict(dim=128, batch=512, synthetic=20000, steps=30, warmup=10),
    "criteo-d128": dict(dim=128, batch=1024, synthetic=100000, steps=40, warmup=5),
}
MODES = {"plain": nl.DLRM_MODES["uncompressed"], "fp16": nl.DLRM_MODES["fp16"], "lossy": nl.DLRM_MODES["lossy"],
         "adaptive": nl.DLRM_MODES["adaptive"], "auto": nl.DLRM_MODES["auto"]}
HOROVOD = types.SimpleNamespace(cycle_time=None, fusion_mb=None, mpi_yield="off")  # as calibrated


def median_s(f, n=15):
    """Median seconds of n calls of f(), after one untimed call (caches, allocations)."""
    f()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)

def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def provenance(what):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return {"measured": what, "machine": "dev", "date": now(), "commit": commit,
            "loadavg": os.getloadavg(), "command": "python benchmarks/perfmodel_validate.py " + " ".join(sys.argv[1:])}


def train_args(setting, ranks, mode, steps=None, batch=None):
    s = SETTINGS[setting]
    b = nl.batch_for(batch or s["batch"], ranks)
    return ["--synthetic", str(s["synthetic"]), "--synthetic-test", "512", "--embedding-dim", str(s["dim"]),
            "--batch-size", str(b), "--steps", str(steps or s["steps"]), *MODES[mode], *nl.COMMON_TRAIN]


def read_step(metrics, warmup):
    """(the iteration: median period between step starts, the timed step: median of train.py's
    iter_seconds, the host work: median of period less timed step, the metrics), all after
    `warmup` steps (rank 0)."""
    m = json.loads(pathlib.Path(metrics).read_text())
    steps, starts = m["iter_seconds"], m["step_starts"]
    w = min(warmup, len(starts) - 2)
    periods = [b - a for a, b in zip(starts[w:], starts[w + 1:])]
    host = [p - s for p, s in zip(periods, steps[w:])]
    return statistics.median(periods), statistics.median(steps[w:]), statistics.median(host), m


# ---------------------------------------------------------------- codec (one process, one thread)


def measure_codec(dim=128, tables=13):
    """GB/s and seconds a piece, fitted to pieces of 64 and 1,024 rows: t/piece = piece_s +
    bytes/rate. Lookups: Zipf-skewed ids (as the example's synthetic data) into 100k-row tables
    with DLRM's init, rel 0.03; gradients Gaussian, rel 0.02, dithered (the example's backward)."""
    import numpy as np
    import torch
    import hvd_lossy
    torch.set_num_threads(1)
    hvd_lossy.set_num_threads(1)
    rng = np.random.default_rng(0)
    header = 152
    fits = {}
    for name, bound, dither in (("lookups", 0.03, None), ("gradients", 0.02, 7)):
        per_piece = {}
        for rows in (64, 1024):
            n = rows * tables
            if name == "lookups":
                ids = torch.from_numpy(np.minimum(rng.zipf(1.1, n) - 1, 99_999))
                x = ((torch.rand(100_000, dim) * 2 - 1) * 100_000 ** -0.5)[ids]
            else:
                x = torch.randn(n, dim) * 1e-3
            sizes = [rows] * tables
            out = torch.empty(hvd_lossy.max_grouped_bytes(sizes, [dim], [tables], header), dtype=torch.uint8)
            got = hvd_lossy.compress_grouped(x, sizes, [bound] * tables, [tables], header, out, 0, dither=dither)
            y = torch.empty_like(x)
            c = median_s(lambda: hvd_lossy.compress_grouped(x, sizes, [bound] * tables, [tables], header, out, 0,
                                                             dither=dither))
            d = median_s(lambda: hvd_lossy.decompress_into(out, [(header, sum(got), n)], y))
            per_piece[rows] = (c / tables, d / tables)
        piece_bytes = {r: r * dim * 4 for r in per_piece}
        fit = {}
        for k, key in enumerate(("compress", "decompress")):
            a64, a1k = per_piece[64][k], per_piece[1024][k]
            inv_rate = (a1k - a64) / (piece_bytes[1024] - piece_bytes[64])
            fit[f"{key}_gbps"] = 1 / inv_rate / 1e9
            fit[f"{key}_piece_s"] = max(a64 - piece_bytes[64] * inv_rate, 0.0)
        fits[name] = {"compress_gbps": fit["compress_gbps"], "decompress_gbps": fit["decompress_gbps"],
                      # the model has one fixed cost a piece per codec call; the two directions' mean
                      "piece_s": (fit["compress_piece_s"] + fit["decompress_piece_s"]) / 2,
                      "seconds_per_piece": {str(r): v for r, v in per_piece.items()}}
    x = torch.randn(tables * 1024, dim)
    h = x.half()
    fits["fp16"] = {"to_half_gbps": x.numel() * 4 / median_s(lambda: x.half()) / 1e9,
                    "to_float_gbps": x.numel() * 4 / median_s(lambda: h.float()) / 1e9}
    return fits


# ---------------------------------------------------------------- ratio curves


def measure_ratio_example(rows_list, modes=("lossy", "adaptive"), dim=128):
    """plain / sent bytes of the example's all-to-alls (forward, backward), 2 ranks over shared
    memory, 4 steps at each rows a chunk (global batch 2 x rows)."""
    curves = {m: {"fwd": {"rows": [], "ratio": []}, "bwd": {"rows": [], "ratio": []}} for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for rows in rows_list:
                metrics = pathlib.Path(tmp) / f"{mode}_{rows}.json"
                args = ["--synthetic", str(max(4096, 8 * rows)), "--synthetic-test", "256", "--embedding-dim",
                        str(dim), "--batch-size", str(2 * rows), "--steps", "4", *MODES[mode], *nl.COMMON_TRAIN,
                        "--metrics-out", str(metrics)]
                env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                           OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
                subprocess.run(["mpirun", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
                                sys.executable, str(nl.TRAIN), *args], env=env, check=True, capture_output=True)
                m = json.loads(metrics.read_text())
                for d in ("fwd", "bwd"):
                    curves[mode][d]["rows"].append(rows)
                    curves[mode][d]["ratio"].append(m[f"a2a_{d}_bytes_plain"] / m[f"a2a_{d}_bytes_sent"])
                print(f"ratio {mode} rows {rows}: fwd {curves[mode]['fwd']['ratio'][-1]:.2f} "
                      f"bwd {curves[mode]['bwd']['ratio'][-1]:.2f}", flush=True)
    return curves


def measure_ratio_real(path, rows_list, dim=128, bound=0.03, max_chunks=8):
    """Forward ratio of the codec (rel `bound`, level 1, frames without the protocol's headers)
    on chunks of consecutive real rows: each table's ids looked up in a table with DLRM's init
    (its published size only sets the init's scale, so every table is drawn at its sample size)."""
    import torch
    import hvd_lossy
    from hvd_lossy.bench.criteo import load_sparse_ids, uniform_tables
    ids, cards = load_sparse_ids(path)
    tables = uniform_tables(cards, dim)
    ids = torch.from_numpy(ids)
    curve = {"rows": [], "ratio": []}
    for rows in rows_list:
        if rows > len(ids):
            break
        raw = sent = 0
        for start in range(0, min(len(ids) - rows + 1, max_chunks * rows), rows):
            for t, table in enumerate(tables):
                x = table[ids[start:start + rows, t]]
                raw += x.numel() * 4
                sent += len(hvd_lossy.compress(x, bound))
        curve["rows"].append(rows)
        curve["ratio"].append(raw / sent)
    return curve


# ---------------------------------------------------------------- the link and compute (namespace)


def measure_link(ns, ranks_list, limited_gbit=0.2, big_mib=8.0, dense=None, id_rows=512):
    """Per rank count: a call's fixed cost and the unlimited loopback's payload rate; the bytes
    MPI's allreduce (of the val-d128 dense part) and allgather (of its ids) move over a ring's;
    and the payload share of the limited link's rate (efficiency), at the extreme rank counts."""
    dense = dense or dense_params(SETTINGS["val-d128"]["dim"])
    out = {"latency_s": {}, "unlimited_payload_gbit": {}, "raw": []}
    with tempfile.TemporaryDirectory() as tmp:
        def worker(ranks, big):
            path = pathlib.Path(tmp) / f"c{ranks}.json"
            argv = [sys.executable, str(REPO / "benchmarks" / "perfmodel_collectives.py"), "--big-mib", str(big),
                    "--dense-params", str(dense), "--id-rows", str(id_rows // ranks), "--json", str(path)]
            run = nl.run_in(ns, ranks, argv, HOROVOD, 600)
            if run["rc"] != 0:
                raise RuntimeError(f"collectives worker failed at {ranks} ranks: {run['output'][-1500:]}")
            rec = json.loads(path.read_text())
            rec["rate_gbit"] = ns.rate
            out["raw"].append(rec)
            return rec
        ns.set_rate(None)
        factors = {"allreduce": [], "allgather": []}
        for ranks in ranks_list:
            rec = worker(ranks, 16.0)
            out["latency_s"][str(ranks)] = rec["latency_s"]
            out["unlimited_payload_gbit"][str(ranks)] = rec["payload_rate_bytes_s"] * 8 / 1e9
            # link bytes over a ring's payload, over the big all-to-all's link bytes a payload byte
            overhead = rec["link_bytes_per_call"] / rec["remote_bytes_per_call"]
            counted = rec["counted_link_bytes_per_call"]
            factors["allreduce"].append(counted["allreduce"] / overhead / (2 * (ranks - 1) * dense * 4))
            factors["allgather"].append(counted["allgather"] / overhead /
                                        (ranks * (ranks - 1) * (id_rows // ranks) * 26 * 8))
        out["allreduce_bytes_factor"] = statistics.median(factors["allreduce"])
        out["allgather_bytes_factor"] = statistics.median(factors["allgather"])
        out["factor_runs"] = factors
        ns.set_rate(limited_gbit)
        effs = []
        for ranks in (min(ranks_list), max(ranks_list)):
            rec = worker(ranks, big_mib)
            # the call's fixed cost is the latency term's: only the rest is the bytes' time
            seconds = rec["big_seconds"] - out["latency_s"][str(ranks)]
            effs.append(rec["remote_bytes_per_call"] / seconds * 8 / 1e9 / limited_gbit)
        out["efficiency"] = statistics.mean(effs)
        out["efficiency_runs"] = effs
    return out


def run_dlrm(ns, setting, ranks, mode, tmp, tag):
    metrics = pathlib.Path(tmp) / f"{setting}_{ranks}_{mode}_{tag}.json"
    argv = [sys.executable, str(nl.TRAIN), *train_args(setting, ranks, mode), "--metrics-out", str(metrics)]
    run = nl.run_in(ns, ranks, argv, HOROVOD, 900)
    if run["rc"] != 0 or not metrics.exists():
        return {"status": "failed", "error": nl.error_of(run["output"], run["rc"])}
    period, step, host, m = read_step(metrics, SETTINGS[setting]["warmup"])
    split = m["time_split"][min(SETTINGS[setting]["warmup"], len(m["time_split"]) - 1):]
    # measured_s: the iteration (what the model predicts); timed_step_s: train.py's own step,
    # which leaves out the host work and whatever the link still carries for other ranks then
    return {"status": "ok", "measured_s": period, "timed_step_s": step, "host_s": host,
            # the step outside the all-to-all calls and the codec (train.py's own split, rank 0)
            "outside_a2a_s": statistics.median(t["compute_s"] for t in split),
            "codec_s": statistics.median(t["compress_s"] for t in split), "compression_ratio": m["compression_ratio"],
            "fwd_ratio": m["a2a_fwd_bytes_plain"] / m["a2a_fwd_bytes_sent"],
            "bwd_ratio": m["a2a_bwd_bytes_plain"] / m["a2a_bwd_bytes_sent"],
            "wire_bytes": run["wire_bytes"], "wall_s": run["seconds"], "loadavg": os.getloadavg()}


# The modes whose CPU work a step is measured in situ (codec_s); auto's is lossy's plus its calls.
CPU_MODES = ("plain", "fp16", "lossy", "adaptive")


def measure_compute(ns, setting, ranks_list, rounds, calibration):
    """Runs of `setting` in CPU_MODES over the unlimited loopback: compute_from_runs of them."""
    ns.set_rate(None)
    runs = {str(r): [] for r in ranks_list}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(rounds):
            for ranks in ranks_list:
                for mode in CPU_MODES:
                    runs[str(ranks)].append(unlimited_run(ns, setting, ranks, tmp, k, mode))
    return compute_from_runs(setting, runs, calibration)


def unlimited_run(ns, setting, ranks, tmp, tag, mode="plain"):
    rate = ns.rate
    ns.set_rate(None)
    rec = run_dlrm(ns, setting, ranks, mode, tmp, f"u{tag}")
    ns.set_rate(rate)
    if rec["status"] != "ok":
        raise RuntimeError(f"{mode} {setting} at {ranks} ranks, unlimited, failed: {rec['error']}")
    rec["mode"] = mode
    print(f"calibration {setting} {mode} {ranks} ranks #{tag}: iteration {1e3 * rec['measured_s']:.1f} ms (timed "
          f"step {1e3 * rec['timed_step_s']:.1f}, host {1e3 * rec['host_s']:.1f}), outside the all-to-alls "
          f"{1e3 * rec['outside_a2a_s']:.1f} ms, codec {1e3 * rec['codec_s']:.1f} ms (load {rec['loadavg'][0]:.1f})",
          flush=True)
    return rec


def compute_from_runs(setting, runs, calibration):
    """The CPU terms a step, per rank count, from runs over the unlimited loopback ({ranks: [run
    records]}, each with its mode; medians over a mode's runs):
      compute_s  plain's step outside its all-to-all calls (train.py's split; the all-to-alls'
                 own time is measured, so the loopback's rate hardly matters), less the model's
                 ids allgather and dense allreduce over the unlimited loopback;
      host_s     plain's period between step starts less its timed step;
      codec_s    per mode (fp16, lossy, adaptive): its codec + outside the all-to-alls, less
                 plain's outside: the mode's extra CPU work a step, in situ."""
    link = calibration["link"]
    out = {}
    for ranks, recs in runs.items():
        by_mode = {}
        for r in recs:
            by_mode.setdefault(r.get("mode", "plain"), []).append(r)
        outside = statistics.median(r["outside_a2a_s"] for r in by_mode["plain"])
        wl, net, res = perfmodel.scenario(f"dev-{setting}", calibration, int(ranks),
                                          link["unlimited_payload_gbit"][ranks], compute_s=0.0, efficiency=1.0,
                                          burst_bytes=0, batch=nl.batch_for(SETTINGS[setting]["batch"], int(ranks)))
        terms = perfmodel.step_terms("plain", wl, net, res)
        other = terms["ids"] + terms["allreduce"]
        out[ranks] = {"compute_s": max(outside - other, 0.0), "outside_a2a_s": outside,
                      "host_s": statistics.median(r["host_s"] for r in by_mode["plain"]),
                      "model_ids_allreduce_unlimited_s": other,
                      "plain_iteration_unlimited_s": statistics.median(r["measured_s"] for r in by_mode["plain"]),
                      "codec_s": {m: max(statistics.median(r["outside_a2a_s"] + r["codec_s"] for r in rs) - outside,
                                         0.0)
                                  for m, rs in by_mode.items() if m != "plain"},
                      "runs": [{k: r.get(k) for k in ("mode", "measured_s", "timed_step_s", "host_s", "outside_a2a_s",
                                                      "codec_s", "loadavg")} for r in recs]}
    return out


# ---------------------------------------------------------------- the calibration file


def dense_params(dim, bottom=(64,), top=(64, 32)):
    """Parameters of the example's dense part (examples/dlrm/model.py) at its default MLPs."""
    sys.path.insert(0, str(REPO / "examples" / "dlrm"))
    from model import DenseArch
    return sum(p.numel() for p in DenseArch(13, 26, dim, list(bottom), list(top)).parameters())


def _v(value, source):
    return {"value": value, "source": source}


# GPU codec: benchmarks/RESULTS.md "GPU codec (h200, 2026-11-29 21:55 UTC)", level 1, rel 0.03.
# Per piece: 52 chunks of 1,024 x 32 (6.8 MB) took 6.61 / 6.36 ms, less their bytes at the 64 MB rates.
_H200 = "measured: h200, RESULTS.md 'GPU codec (h200, 2026-11-29 21:55 UTC)', level 1"
GPU_CODECS = {
    "gpu-h200": {
        "lookups": {"compress_gbps": 147.0, "decompress_gbps": 357.0,
                    "piece_s": ((6.61e-3 - 6.8e6 / 147e9) + (6.36e-3 - 6.8e6 / 357e9)) / 2 / 52},
        "gradients": {"compress_gbps": 147.0, "decompress_gbps": 357.0,
                      "piece_s": ((6.61e-3 - 6.8e6 / 147e9) + (6.36e-3 - 6.8e6 / 357e9)) / 2 / 52},
        "fp16": {"to_half_gbps": 1500.0, "to_float_gbps": 1500.0},
        "auto_call_s": 65e-6,
        "source": {"lookups": _H200 + " (64 MB rates; seconds a piece from the 52-chunk run)",
                   "gradients": "assumed: as the lookups (dithered frames not timed on the GPU)",
                   "fp16": "assumed: ~1.5 TB/s, the 64 MB device copy of the same run (0.043 ms) as the cast's speed",
                   "auto_call_s": "measured on dev (RESULTS.md, auto deciding plain, ~65 us a call); assumed on GPU"}},
    "gpu-h200-one-launch": {
        "lookups": {"compress_gbps": 6.8e6 / 0.218e-3 / 1e9, "decompress_gbps": 6.8e6 / 0.130e-3 / 1e9, "piece_s": 0.0},
        "gradients": {"compress_gbps": 6.8e6 / 0.218e-3 / 1e9, "decompress_gbps": 6.8e6 / 0.130e-3 / 1e9,
                      "piece_s": 0.0},
        "fp16": {"to_half_gbps": 1500.0, "to_float_gbps": 1500.0},
        "auto_call_s": 65e-6,
        "source": {"lookups": "assumed: every piece of a call coded as fast as one 6.8 MB tensor was "
                              "(0.218 / 0.130 ms, " + _H200 + "), i.e. one batched launch a call, not built",
                   "gradients": "assumed: as the lookups", "fp16": "assumed, as gpu-h200",
                   "auto_call_s": "as gpu-h200"}},
}
MLPERF_DENSE = 13 * 512 + 512 * 256 + 256 * 128 + 479 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256


def in_situ_codec(by_ranks):
    """{mode: {"by_ranks": ...}} of the modes measured at every rank count (compute_from_runs)."""
    if not by_ranks:
        return None
    modes = set.intersection(*(set(c["codec_s"]) if isinstance(c.get("codec_s"), dict) else set()
                               for c in by_ranks.values()))
    return {m: {"by_ranks": {r: c["codec_s"][m] for r, c in by_ranks.items()}} for m in sorted(modes)} or None


def build_presets(calib):
    """The named scenarios: the two dev settings (emulated link, measured inputs) and the
    projected cluster (GPU rates from RESULTS.md; what was not measured is marked assumed)."""
    link, compute = calib.get("link", {}), calib.get("compute", {})
    capped = [min(c, 100_000) for c in perfmodel.KAGGLE]
    presets = {}
    for setting, s in SETTINGS.items():
        presets[f"dev-{setting}"] = {
            "about": f"the DLRM example on dev, {setting} (dim {s['dim']}, global batch {s['batch']}), "
                     f"every rank on 2 shared cores, one emulated link carrying all ranks' bytes",
            "workload": {
                "batch": _v(s["batch"], "the setting (train.py --batch-size)"),
                "dim": _v(s["dim"], "the setting"),
                "cardinalities": _v(capped, "the example's synthetic tables: Kaggle's, capped at 100,000 rows"),
                "dense_params": _v(dense_params(s["dim"]), "counted: the example's DenseArch"),
                "compute_s": _v({"by_ranks": {r: c["compute_s"] for r, c in compute.get(setting, {}).items()}},
                                "measured: plain steps over the unlimited loopback less the model's "
                                "communication there (calibration 'compute')"),
                "host_s": _v({"by_ranks": {r: c.get("host_s", 0.0) for r, c in compute.get(setting, {}).items()}},
                             "measured: plain runs over the unlimited loopback, the period between step "
                             "starts less the timed step (calibration 'compute')"),
                "codec_s": _v(in_situ_codec(compute.get(setting, {})),
                              "measured in situ: each mode's runs over the unlimited loopback, codec + outside "
                              "the all-to-alls, less plain's outside (calibration 'compute'); a mode without "
                              "one: from the codec throughputs"),
                "host_cores": _v(2, "dev has 2 cores"), "ids": _v("allgather", "the example"),
                "sharding": _v("table", "the example (examples/dlrm/sharding.py)")},
            "network": {
                "link": _v("shared", "the emulation: one loopback for all ranks"),
                "latency_s": _v({"by_ranks": link.get("latency_s", {})}, "measured (calibration 'link')"),
                "efficiency": _v(link.get("efficiency", 1.0), "measured: payload rate / tbf rate (calibration 'link')"),
                "allreduce_bytes_factor": _v(link.get("allreduce_bytes_factor", 1.0),
                                             "measured: MPI's allreduce bytes over a ring's (calibration 'link')"),
                "allgather_bytes_factor": _v(link.get("allgather_bytes_factor", 1.0),
                                             "measured: MPI's allgather bytes over a ring's (calibration 'link')"),
                "burst_bytes": _v(512 * 1024, "the emulation's tbf burst (hvd_lossy.bench.netlink.TBF: 512kb)"),
                "bandwidth_gbit": _v(None, "the run's tbf rate")},
            "codec": "cpu-dev", "ratio": "dev-d128"}
    for data in ("kaggle", "terabyte"):
        presets[f"cluster-{data}"] = {
            "about": f"projection: one GPU a rank, {data} cardinalities, dim 128, global batch 65,536, MLPerf "
                     f"DLRM's MLPs, H200 codec rates, non-blocking fabric",
            "workload": {
                "batch": _v(65536, "assumed: MLPerf DLRM's global batch"),
                "dim": _v(128, "assumed: MLPerf DLRM"),
                "cardinalities": _v(data, "published (/work/shared/data/README.md)"),
                "dense_params": _v(MLPERF_DENSE, "assumed: MLPerf DLRM MLPs 512-256-128 / 1024-1024-512-256-1"),
                "compute_s": _v({"fixed_s": 2e-3, "per_row_s": 0.5e-6},
                                "assumed: 2 ms + 0.5 us a row a GPU (no GPU DLRM step was measured)"),
                "host_s": _v(0.0, "assumed: the next batch is loaded while the step runs (a data loader)"),
                "host_cores": _v(None, "a GPU a rank"),
                "ids": _v("alltoall", "assumed: ids by all-to-all (TorchRec-style), not the example's allgather"),
                "sharding": _v("balanced", "assumed: every rank an equal share of every table (row/column-wise)")},
            "network": {
                "link": _v("per_rank", "a NIC of the given rate a GPU, non-blocking fabric (assumed)"),
                "latency_s": _v(100e-6, "assumed: 100 us a collective call"),
                "efficiency": _v(0.9, "assumed: 90% of line rate as payload"),
                "bandwidth_gbit": _v(None, "the projection's rate")},
            "codec": "gpu-h200", "ratio": f"{data}-d128"}
    return presets


def assemble_ratios(calib):
    """Curves at real cardinalities: forward from the codec on real rows, backward from the
    example (gradients do not dedupe, so table size barely matters: assumed)."""
    dev = calib["ratio"].get("dev-d128")
    real = calib.get("ratio_real", {})
    for data in ("kaggle", "terabyte"):
        if dev and data in real:
            calib["ratio"][f"{data}-d128"] = {
                m: {"fwd": real[data], "bwd": dev["lossy"]["bwd"]} for m in ("lossy", "adaptive")}
            calib["ratio"][f"{data}-d128"]["source"] = (
                f"fwd: measured, the codec on the bundled real {data} rows (calibration 'ratio_real'); bwd: the "
                f"example's lossy backward curve (dev-d128); adaptive: assumed equal to lossy")


def calibrate(opts):
    path = perfmodel.CALIBRATION
    calib = json.loads(path.read_text()) if path.exists() else {}
    calib.setdefault("ratio", {})
    calib.setdefault("codec", {})
    calib.setdefault("provenance", {})
    if "codec" in opts.parts:
        fits = measure_codec()
        fits["auto_call_s"] = 65e-6
        fits["source"] = {"lookups, gradients, fp16": "measured here (see provenance.codec)",
                          "auto_call_s": "measured: RESULTS.md (readme setting, auto deciding plain, "
                                         "~65 us a call, 2026-12-01 11:16 UTC, commit 59614cb)"}
        calib["codec"]["cpu-dev"] = fits
        calib["provenance"]["codec"] = provenance("one thread; lookups and dithered gradients, 13 pieces of "
                                                  "64 and 1,024 rows x 128; fp16 casts of 13,312 x 128")
        print(json.dumps(fits, indent=1), flush=True)
    if "ratio" in opts.parts:
        calib["ratio"]["dev-d128"] = measure_ratio_example(opts.ratio_rows)
        calib["ratio"]["dev-d128"]["source"] = "measured: the example's own a2a bytes (provenance.ratio)"
        calib["ratio_real"] = {
            "kaggle": measure_ratio_real(REPO / "data" / "criteo_kaggle_sample" / "train.txt", opts.ratio_rows),
            "terabyte": measure_ratio_real(pathlib.Path("/work/shared/data/criteo_1tb_sample/sample.txt"),
                                           opts.ratio_rows)}
        calib["provenance"]["ratio"] = provenance("2 ranks, shared memory, dim 128, 4 steps a point; real rows: "
                                                  "the codec on chunks of consecutive bundled rows, dim 128")
        print(json.dumps(calib["ratio_real"]), flush=True)
    assemble_ratios(calib)
    calib["codec"].update(GPU_CODECS)
    ranks = sorted(set(opts.ranks) | {2, 3})
    if "link" in opts.parts or "compute" in opts.parts:
        with nl.signals_raise(), nl.Namespace(opts.namespace) as ns:
            if "link" in opts.parts:
                calib["link"] = measure_link(ns, ranks)
                calib["provenance"]["link"] = provenance("benchmarks/perfmodel_collectives.py inside the namespace")
                print(json.dumps({k: v for k, v in calib["link"].items() if k != "raw"}), flush=True)
            calib["presets"] = build_presets(calib)
            if "compute" in opts.parts:
                calib.setdefault("compute", {})
                # val-d128's compute is measured by `validate`, in turns with its limited runs
                calib["compute"]["criteo-d128"] = measure_compute(ns, "criteo-d128", [2, 3], opts.rounds, calib)
                calib["provenance"]["compute_criteo"] = provenance(f"criteo-d128: plain runs, {opts.rounds} "
                                                                   f"rounds, no qdisc")
    calib["presets"] = build_presets(calib)
    calib["about"] = ("Inputs of hvd_lossy.perfmodel; every value says where it was measured or that it is "
                      "assumed (presets.*.*.source, codec.*.source, provenance)")
    path.write_text(json.dumps(calib, indent=1))
    print(f"wrote {path}")
