"""When does compression pay: a calibrated model of one hybrid-parallel DLRM training step.

    python -m hvd_lossy.perfmodel --preset cluster-terabyte --ranks 8,64,1024 --bandwidth 25,100,400
    python -m hvd_lossy.perfmodel --preset dev-val-d128 --ranks 8 --bandwidth 0.2 --json out.json

One iteration of the DLRM example (examples/dlrm/train.py) is a sum of terms, each a small
function:

  compute     dense forward/backward, lookups, optimizers (measured per step, or assumed)
  host        the iteration's work between two timed steps: the next batch, its checksum, the
              loss's allreduce (measured: the period between step starts less the timed step)
  ids         the allgather of the sparse ids (int64) that tells each owner what to look up
  fwd_a2a     forward all-to-all of the lookups: bytes / link rate + one call's fixed cost;
              with reuse (workload "reuse_fewer", --reuse-fewer: how many times fewer forward
              bytes hvd_lossy.reuse sends, benchmarks/reuse_bytes.py measures it) lossy and
              adaptive send that much less
  bwd_a2a     backward all-to-all of their gradients; with reuse they travel summed by id
              ("reuse_grad_fewer", --reuse-grad-fewer: how many times fewer gradient bytes,
              lossy only: adaptive's gradients stay one row a lookup)
  codec       compress + decompress of both all-to-alls (lossy/adaptive), or fp16's casts;
              with reuse the lookups' codec work costs "reuse_codec" (--reuse-codec) times as
              much (the reuse pass predicts, checks and reconstructs every row on both sides)
  allreduce   the dense gradients' allreduce (ring: 2 (P-1)/P of the dense bytes a rank); with
              them coded ("dense_fewer", --dense-fewer: how many times fewer bytes their frames
              take; lossy and adaptive, hvd_lossy.torch.DistributedOptimizer given the
              compressor) an allgather of one frame a rank, (P-1) frames a rank, whose coding
              (one compress, P decodes) goes to the codec term

The model predicts the iteration, the period from one step's start to the next (samples/s =
batch / period), not train.py's timed step, which leaves out the host work and whatever the
link carries for the other ranks meanwhile (up to 20% of the iteration at 8 ranks).

The terms follow each other: the example runs them one after the other (no --overlap). The one
exception is a token-bucket link, which lets bytes through during the idle phases (bucket.py).
Bytes of a compressed all-to-all are raw / ratio(rows a chunk): a chunk is one (table,
destination) piece of b = B/P rows, and the ratio falls as chunks shrink, so the curve is a
measured input (`calibration["ratio"]`), interpolated log-linearly in rows.

Links: "per_rank" is a cluster (each rank its own full-duplex NIC of the given rate, a
non-blocking fabric: a collective takes as long as its busiest rank's bytes); "shared" is the
emulation on one machine (every byte of every rank crosses one loopback of that rate, a token
bucket that refills while the link idles and lets its burst through at once: bucket.py).

CPU oversubscription (dev: 8 ranks on 2 cores): the dev presets' CPU terms (compute, host, the
in-situ codec_s) and a call's fixed cost are measured with the same P processes on the same
cores, so they hold what oversubscription costs at that P; the model does not scale them. A
codec term computed from one-thread throughputs is spread: P ranks' work on C cores takes
max(busiest rank, total / C). What this does not cover is other jobs' load: ranks that wait on
a slow link win a core whenever they wake, ranks over an unlimited link compete for it, so CPU
terms measured over the unlimited link under load overstate the CPU of link-bound runs
(benchmarks/RESULTS.md, "Performance model").

Modes: plain (horovod.torch.alltoall), fp16 (Compression.fp16), lossy (rel 0.03 lookups,
0.02 dithered gradients), adaptive (the recipe; its own measured ratio curve), auto (lossy with
auto=True: the faster of plain and lossy each call, plus its measured cost a call).

The calibration (hvd_lossy/perfmodel/calibration.json) says for every input where it was
measured, or that it is assumed; `benchmarks/perfmodel_validate.py` measures it and checks the
model against emulated-link runs. The command line is __main__.py.
"""
import json
import math
import pathlib

from hvd_lossy.perfmodel.bucket import IDLE, SEND, steady_state

MODES = ("plain", "fp16", "lossy", "adaptive", "auto")
TERMS = ("compute", "host", "ids", "fwd_a2a", "bwd_a2a", "codec", "allreduce")
LINKS = ("per_rank", "shared")
CALIBRATION = pathlib.Path(__file__).with_name("calibration.json")
FLOAT_BYTES, ID_BYTES = 4, 8
KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
          5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
TERABYTE = [45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10, 2209,
            11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35]
CARDINALITIES = {"kaggle": KAGGLE, "terabyte": TERABYTE}


# ---------------------------------------------------------------- inputs


def check_positive(name, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return value


def ratio_at(curve, rows):
    """Compression ratio of a chunk of `rows` rows from a measured curve {"rows": [...],
    "ratio": [...]} (rows ascending): log-linear interpolation between points, the end values
    outside them (no extrapolation beyond what was measured)."""
    xs, ys = curve["rows"], curve["ratio"]
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"a ratio curve needs as many ratios as rows (>= 1), got {len(xs)} rows, {len(ys)} ratios")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"a ratio curve's rows must be strictly ascending, got {xs}")
    check_positive("rows a chunk", rows)
    if rows <= xs[0]:
        return ys[0]
    if rows >= xs[-1]:
        return ys[-1]
    i = next(k for k in range(1, len(xs)) if rows <= xs[k])
    f = (math.log(rows) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + f * (ys[i] - ys[i - 1])


def place_tables(cardinalities, ranks):
    """Tables owned by each rank, as the example places them (examples/dlrm/sharding.py):
    largest first, each onto the least-loaded rank (ties: the lower rank)."""
    load, owned = [0] * ranks, [[] for _ in range(ranks)]
    for t in sorted(range(len(cardinalities)), key=lambda i: (-cardinalities[i], i)):
        r = min(range(ranks), key=lambda k: (load[k], k))
        owned[r].append(t)
        load[r] += cardinalities[t]
    return owned


# ---------------------------------------------------------------- bytes


def a2a_bytes(tables_owned, total_tables, rows, dim, ranks):
    """(sent, received) raw bytes of each rank in one embedding all-to-all (its own chunk stays
    local): an owner of k tables sends k chunks of `rows` rows to each of the P-1 others and
    receives its slice of the T-k tables it does not own."""
    chunk = rows * dim * FLOAT_BYTES
    sent = [len(k) * chunk * (ranks - 1) for k in tables_owned]
    received = [(total_tables - len(k)) * chunk for k in tables_owned]
    return sent, received


def link_seconds(sent, received, network):
    """Seconds to move one collective's bytes (lists, one entry a rank) over the link."""
    rate = network["bandwidth_gbit"] * 1e9 / 8 * network.get("efficiency", 1.0)
    if network["link"] == "shared":
        return sum(sent) / rate
    if network["link"] == "per_rank":
        return max(max(sent), max(received)) / rate
    raise ValueError(f"link must be one of {LINKS}, got {network['link']!r}")


def cpu_seconds(work, host_cores):
    """Wall time of per-rank CPU work (seconds a rank) run at once: the busiest rank, or on a
    host of `host_cores` cores shared by all ranks (None: each rank has its own) the total over
    the cores if that is longer."""
    return max(work) if host_cores is None else max(max(work), sum(work) / host_cores)


# ---------------------------------------------------------------- the step


def codec_work(mode, sent, received, pieces, codec, lookups_factor=1.0):
    """CPU (or GPU) seconds of each rank for both all-to-alls of `mode`. Lookups are compressed
    on the way out and decoded on arrival; gradients go back the other way (what a rank received
    it sends back as gradients). Rates in GB/s of raw bytes, plus a fixed cost a piece; the
    lookups' work times lookups_factor (reuse_codec)."""
    if mode == "plain":
        return [0.0] * len(sent)
    if mode == "fp16":
        c = codec["fp16"]
        return [(s + r) / (c["to_half_gbps"] * 1e9) + (s + r) / (c["to_float_gbps"] * 1e9)
                for s, r in zip(sent, received)]
    look, grad = codec["lookups"], codec["gradients"]
    out = []
    for s, r, n in zip(sent, received, pieces):
        fwd = lookups_factor * (s / (look["compress_gbps"] * 1e9)
                                + r / (look["decompress_gbps"] * 1e9))
        bwd = r / (grad["compress_gbps"] * 1e9) + s / (grad["decompress_gbps"] * 1e9)
        per_piece = 2 * n * (look["piece_s"] + grad["piece_s"])  # n out and n in, each direction
        out.append(fwd + bwd + per_piece)
    return out


def codec_term(mode, workload, sent, received, pieces, codec):
    """The codec's seconds a step: from throughputs (codec_work), unless the workload carries the
    codec's cost measured in situ (`codec_s`: {mode: seconds a step of that mode's extra CPU work
    over plain's, codec included, in the same runs' conditions}) for this mode."""
    measured = workload.get("codec_s") or {}
    if measured.get(mode) is not None:
        return measured[mode]
    factor = reuse_term(workload, "reuse_codec") if mode in ("lossy", "adaptive") else 1.0
    return cpu_seconds(codec_work(mode, sent, received, pieces, codec, factor),
                       workload.get("host_cores"))


def reuse_term(workload, name):
    """A reuse term of the workload (1: no reuse): "reuse_fewer", times fewer forward bytes;
    "reuse_grad_fewer", times fewer gradient bytes (summed by id); "reuse_codec", times the
    lookups' codec work."""
    return check_positive(name, workload.get(name, 1.0))


def dense_fewer(mode, workload):
    """Times fewer bytes the dense gradients take in `mode` (1: Horovod's allreduce of them)."""
    fewer = check_positive("dense_fewer", workload.get("dense_fewer", 1.0))
    return fewer if mode in ("lossy", "adaptive") else 1.0


def dense_codec_work(raw, ranks, codec):
    """CPU seconds a rank codes the dense gradients with: its own frame compressed, every
    rank's decoded (its own too: all ranks sum the same decoded values), at the gradient rates."""
    grad = codec["gradients"]
    return raw / (grad["compress_gbps"] * 1e9) + ranks * raw / (grad["decompress_gbps"] * 1e9)


def reuse_fewer(workload):
    """The reuse term: times fewer forward bytes of a reusing compressor (1: none)."""
    return reuse_term(workload, "reuse_fewer")


def step_terms(mode, workload, network, calibration):
    """Seconds of each term (TERMS) of one training step in `mode`.

    Arguments:
        mode: one of MODES ("auto" is predicted by predict(), from plain and lossy).
        workload: dict(ranks, batch (global), dim, cardinalities, dense_params, compute_s,
            host_cores (None: a processor a rank), ids ("allgather" as the example, or
            "alltoall": each owner receives only its tables' ids), sharding ("table" as the
            example, or "balanced": every rank an equal share of every table's lookups),
            optionally host_s (the host term, default 0), codec_s (see codec_term), the
            reuse terms (reuse_term; each default 1: no reuse): reuse_fewer divides
            lossy/adaptive's forward bytes, reuse_grad_fewer lossy's gradient bytes, and
            reuse_codec multiplies their lookups' codec work; and dense_fewer (default 1:
            Horovod's allreduce): lossy/adaptive's dense gradients coded, an allgather of
            frames that many times smaller).
        network: dict(bandwidth_gbit, link ("per_rank" | "shared"), latency_s (one
            collective call), efficiency (payload share of the line rate), and optionally
            allreduce_bytes_factor / allgather_bytes_factor (bytes moved over a ring's) and
            burst_bytes (a token bucket's burst, see bucket_terms)).
        calibration: dict with "ratio" (per mode, "fwd" and "bwd" curves) and "codec"
            (GB/s and seconds a piece, see codec_work).
    """
    if mode not in MODES or mode == "auto":
        raise ValueError(f"mode must be one of {[m for m in MODES if m != 'auto']}, got {mode!r}")
    P, B, D = workload["ranks"], workload["batch"], workload["dim"]
    cards = workload["cardinalities"]
    T = len(cards)
    if not isinstance(P, int) or P < 2:
        raise ValueError(f"ranks must be an int >= 2 (an all-to-all needs a peer), got {P!r}")
    check_positive("batch", B)
    if B % P:
        raise ValueError(f"the global batch must split evenly over the ranks, got batch {B} over {P} ranks")
    rows = B // P
    lat = network["latency_s"]

    if workload.get("sharding", "table") == "balanced":
        owned = [[None] * T] * P  # each rank a 1/P share of every table: as if it owned T/P
        sent = [T * rows * D * FLOAT_BYTES * (P - 1) / P] * P
        received = list(sent)
        pieces = [T * (P - 1)] * P
    else:
        owned = place_tables(cards, P)
        sent, received = a2a_bytes(owned, T, rows, D, P)
        pieces = [len(k) * (P - 1) for k in owned]

    if mode == "plain":
        fwd_ratio = bwd_ratio = 1.0
    elif mode == "fp16":
        fwd_ratio = bwd_ratio = 2.0
    else:
        curves = calibration["ratio"][mode]
        fwd_ratio, bwd_ratio = ratio_at(curves["fwd"], rows), ratio_at(curves["bwd"], rows)
        fwd_ratio *= reuse_fewer(workload)
        if mode == "lossy":  # adaptive's gradients stay one row a lookup (hvd_lossy.grad_ids)
            bwd_ratio *= reuse_term(workload, "reuse_grad_fewer")

    def shrink(xs, ratio):
        return [x / ratio for x in xs]

    # ids: allgather (the example) sends b rows x T ids to every other rank; an all-to-all sends
    # each owner only its tables' ids of every rank's rows.
    if workload.get("ids", "allgather") == "allgather":
        ids_sent = [rows * T * ID_BYTES * (P - 1)] * P
        ids_recv = list(ids_sent)
    else:
        ids_sent = [rows * T * ID_BYTES * (P - 1) / P] * P
        ids_recv = [len(k) * rows * ID_BYTES * (P - 1) for k in owned]
    # MPI picks its own allreduce/allgather algorithms: the factors (measured on the emulated
    # link, 1 elsewhere) are the bytes they really move over what a ring would.
    ids_sent = [x * network.get("allgather_bytes_factor", 1.0) for x in ids_sent]
    ids_recv = [x * network.get("allgather_bytes_factor", 1.0) for x in ids_recv]
    dense_raw = workload["dense_params"] * FLOAT_BYTES
    fewer = dense_fewer(mode, workload)
    if fewer == 1.0:
        ring = [2 * (P - 1) / P * dense_raw * network.get("allreduce_bytes_factor", 1.0)] * P
    else:  # an allgather of one frame a rank: each sends its own and passes on P - 2
        ring = [(P - 1) * dense_raw / fewer * network.get("allgather_bytes_factor", 1.0)] * P
    wire = {"ids": link_seconds(ids_sent, ids_recv, network),
            "fwd_a2a": link_seconds(shrink(sent, fwd_ratio), shrink(received, fwd_ratio), network),
            # gradients travel back: what a rank received it now sends
            "bwd_a2a": link_seconds(shrink(received, bwd_ratio), shrink(sent, bwd_ratio), network),
            "allreduce": link_seconds(ring, ring, network)}
    terms = {"compute": workload["compute_s"], "host": workload.get("host_s", 0.0), "ids": lat + wire["ids"],
             "fwd_a2a": lat + wire["fwd_a2a"], "bwd_a2a": lat + wire["bwd_a2a"],
             "codec": codec_term(mode, workload, sent, received, pieces, calibration["codec"])
             + (0.0 if fewer == 1.0 else cpu_seconds(
                 [dense_codec_work(dense_raw, P, calibration["codec"])] * P,
                 workload.get("host_cores"))),
             "allreduce": lat + wire["allreduce"]}
    if network.get("burst_bytes"):
        terms.update(bucket_terms(wire, terms, lat, network))
    return terms


def bucket_terms(wire, terms, lat, network):
    """The communication terms on a token-bucket link (tc tbf, `burst_bytes`): the iteration's
    phases in the example's order, run in steady state (bucket.steady_state), so every idle
    phase's refill (and whatever a send leaves in the bucket) goes to the sends after it.
    Where the compute falls between the collectives is not measured: a third before the ids
    (with the host work and the previous step's optimizers), a third before the lookups'
    all-to-all (the lookups), a third before the gradients' (the MLPs); the codec half before
    each all-to-all; each call's fixed cost before its bytes. The gradients' all-to-all and the
    dense allreduce leave together (Horovod queues both from the backward pass)."""
    rate = network["bandwidth_gbit"] * 1e9 / 8 * network.get("efficiency", 1.0)
    third, half = terms["compute"] / 3, terms["codec"] / 2
    order = [(IDLE, terms["host"] + third + lat), (SEND, wire["ids"] * rate),
             (IDLE, third + half + lat), (SEND, wire["fwd_a2a"] * rate),
             (IDLE, third + half + 2 * lat), (SEND, wire["bwd_a2a"] * rate), (SEND, wire["allreduce"] * rate)]
    seconds = steady_state(order, rate, network["burst_bytes"])
    return {"ids": lat + seconds[1], "fwd_a2a": lat + seconds[3], "bwd_a2a": lat + seconds[5],
            "allreduce": lat + seconds[6]}


def predict(mode, workload, network, calibration):
    """One step of `mode`: dict(mode, seconds, terms, dominant, speedup (plain's seconds /
    these), rows_per_chunk, ratio (fwd, bwd)). auto is the faster of plain and lossy plus its
    measured cost a call (two calls a step)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    plain = sum(step_terms("plain", workload, network, calibration).values())
    if mode == "auto":
        choice = min(("plain", "lossy"), key=lambda m: sum(step_terms(m, workload, network, calibration).values()))
        terms = dict(step_terms(choice, workload, network, calibration))
        terms["codec"] += 2 * calibration["codec"]["auto_call_s"]
    else:
        terms, choice = step_terms(mode, workload, network, calibration), mode
    seconds = sum(terms.values())
    rows = workload["batch"] // workload["ranks"]
    ratio = (1.0, 1.0) if choice == "plain" else (2.0, 2.0) if choice == "fp16" else (
        ratio_at(calibration["ratio"][choice]["fwd"], rows) * reuse_fewer(workload),
        ratio_at(calibration["ratio"][choice]["bwd"], rows)
        * (reuse_term(workload, "reuse_grad_fewer") if choice == "lossy" else 1.0))
    return {"mode": mode, "seconds": seconds, "terms": terms, "dominant": dominant(terms),
            "speedup": plain / seconds, "rows_per_chunk": rows, "ratio": ratio,
            **({"auto_picks": choice} if mode == "auto" else {})}


def dominant(terms):
    """The term that takes the longest (the all-to-alls counted together as "a2a")."""
    merged = {k: v for k, v in terms.items() if k not in ("fwd_a2a", "bwd_a2a")}
    merged["a2a"] = terms["fwd_a2a"] + terms["bwd_a2a"]
    return max(merged, key=merged.get)


# ---------------------------------------------------------------- calibration and presets


def load_calibration(path=CALIBRATION):
    """The calibration JSON: measured inputs with their provenance (see module docstring)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"calibration {path} not found; `python benchmarks/perfmodel_validate.py "
                                f"calibrate` writes it")
    return json.loads(path.read_text())


def at_ranks(value, ranks, batch, name):
    """A calibrated input at `ranks` ranks: a number; {"by_ranks": {"2": x, ...}} (measured at
    those rank counts only); or {"fixed_s": a, "per_row_s": c} = a + c * rows a rank."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, dict) and "by_ranks" in value:
        table = value["by_ranks"]
        if str(ranks) not in table:
            raise ValueError(f"{name} was calibrated at ranks {sorted(table, key=int)} only, got {ranks}")
        return table[str(ranks)]
    if isinstance(value, dict) and "fixed_s" in value:
        return value["fixed_s"] + value["per_row_s"] * batch / ranks
    raise ValueError(f"{name} must be a number, {{'by_ranks': ...}} or {{'fixed_s', 'per_row_s'}}, got {value!r}")


def scenario(name, calibration, ranks, bandwidth_gbit, codec=None, **overrides):
    """(workload, network, resolved calibration) of preset `name` at `ranks` and
    `bandwidth_gbit`, ready for predict(); `codec` names another codec set of the calibration,
    `overrides` replace workload or network fields."""
    presets = calibration["presets"]
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; the calibration has {sorted(presets)}")
    p = presets[name]
    workload = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in p["workload"].items()}
    network = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in p["network"].items()}
    for key, value in overrides.items():
        (network if key in network else workload)[key] = value
    if isinstance(workload["cardinalities"], str):
        workload["cardinalities"] = CARDINALITIES[workload["cardinalities"]]
    workload["ranks"], network["bandwidth_gbit"] = ranks, check_positive("bandwidth_gbit", bandwidth_gbit)
    workload["compute_s"] = at_ranks(workload["compute_s"], ranks, workload["batch"], "compute_s")
    workload["host_s"] = at_ranks(workload.get("host_s", 0.0), ranks, workload["batch"], "host_s")
    if workload.get("codec_s") is not None:
        workload["codec_s"] = {m: at_ranks(v, ranks, workload["batch"], f"codec_s[{m}]")
                               for m, v in workload["codec_s"].items()}
    network["latency_s"] = at_ranks(network["latency_s"], ranks, workload["batch"], "latency_s")
    resolved = {"ratio": calibration["ratio"][p["ratio"]], "codec": calibration["codec"][codec or p["codec"]]}
    return workload, network, resolved


def sweep(preset_name, calibration, ranks, bandwidths, modes, codec=None, **overrides):
    """predict() for every (ranks, bandwidth, mode), each row carrying its inputs."""
    if codec is not None and codec not in calibration["codec"]:
        raise ValueError(f"unknown codec {codec!r}; the calibration has {sorted(calibration['codec'])}")
    out = []
    for p in ranks:
        for g in bandwidths:
            workload, network, resolved = scenario(preset_name, calibration, p, g, codec, **overrides)
            for mode in modes:
                rec = predict(mode, workload, network, resolved)
                inputs = dict(workload, **network)
                inputs["cardinalities"] = calibration["presets"][preset_name]["workload"]["cardinalities"]["value"]
                inputs["codec"] = codec or calibration["presets"][preset_name]["codec"]
                inputs["ratio"] = calibration["presets"][preset_name]["ratio"]
                out.append(dict(rec, ranks=p, bandwidth_gbit=g, preset=preset_name, inputs=inputs))
    return out
