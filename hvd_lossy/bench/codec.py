"""`python -m hvd_lossy.bench codec`: compression ratio, speed and max error of the codec.

Two workloads:
  criteo     the bundled Criteo Kaggle rows as a 2-rank all-to-all sends them: 26 tables, dim 32,
             DLRM uniform init, batch 2,048; each table's lookups split into 2 chunks of 1,024
             rows, each chunk compressed alone (bound over the chunk), all 52 in one native call.
  synthetic  a 64 MB float32 batch of Criteo-scale lookups (published cardinalities, capped;
             Zipf ids), one tensor.
Each is measured per level with one thread and with all cores, beside torch's fp16 cast and an
FBGEMM-style row-wise int8 quantizer (scale and bias per row) timed in the same run.
Throughput counts the uncompressed bytes (GB = 1e9 bytes); times are medians of --repeat runs.
"dec GB/s" decodes into a new tensor each call (page faults of fresh memory included); "dec into"
decodes into a reused tensor (decompress(frame, out=...)).
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch

import hvd_lossy
from hvd_lossy.bench.criteo import criteo_batch_lookups, synthetic_lookups


def median_seconds(fn, repeat):
    fn()  # warm-up: page faults, thread pool start
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def max_rel_error(x, y, eb_abs):
    """Largest |x - y| over the bound (<= 1 means the bound holds everywhere)."""
    err = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
    return err / eb_abs if eb_abs > 0 else (0.0 if err == 0 else float("inf"))


def bench_lossy(x, rows, eb, level, threads, repeat, dedup=True, dither=None):
    hvd_lossy.set_num_threads(threads)
    kw = dict(level=level, dedup=dedup, dither=dither)
    buf, sizes = hvd_lossy.compress_chunks(x, rows, eb, **kw)
    t_c = median_seconds(lambda: hvd_lossy.compress_chunks(x, rows, eb, **kw), repeat)
    t_d = median_seconds(lambda: hvd_lossy.decompress_chunks(buf, sizes), repeat)
    parts = hvd_lossy.decompress_chunks(buf, sizes)
    worst, offset = 0.0, 0
    for src, out, size in zip(torch.split(x, rows), parts, sizes):
        info = hvd_lossy.frame_info(buf[offset:offset + size])
        worst = max(worst, max_rel_error(src, out, info["eb_abs"]))
        offset += size
    raw = x.numel() * x.element_size()
    name = f"hvd_lossy L{level}" + ("" if dedup else " no dedup") + ("" if dither is None else " dither")
    result = {"method": name, "ratio": raw / buf.numel(), "compress_GBps": raw / t_c / 1e9,
              "decompress_GBps": raw / t_d / 1e9, "max_error_over_bound": worst, "bytes": buf.numel()}
    if len(rows) == 1:
        # Decoding into a reused tensor leaves out the page faults of a fresh 64 MB allocation,
        # which the operating system charges to whoever touches the memory first.
        out = torch.empty_like(x)
        t_into = median_seconds(lambda: hvd_lossy.decompress(buf, out=out), repeat)
        result["decompress_into_GBps"] = raw / t_into / 1e9
    return result


def int8_rowwise(x):
    lo = x.min(dim=1, keepdim=True).values
    hi = x.max(dim=1, keepdim=True).values
    scale = ((hi - lo) / 255.0).clamp_min(1e-12)
    q = torch.round((x - lo) / scale).to(torch.uint8)
    return q, scale, lo


def bench_baselines(x, threads, repeat):
    torch.set_num_threads(max(threads, 1) if threads else os.cpu_count())
    raw = x.numel() * x.element_size()
    half = x.half()
    out = [{"method": "torch fp16 cast", "ratio": 2.0,
            "compress_GBps": raw / median_seconds(lambda: x.half(), repeat) / 1e9,
            "decompress_GBps": raw / median_seconds(lambda: half.float(), repeat) / 1e9,
            "max_abs_error": (x - half.float()).abs().max().item()}]
    q, scale, lo = int8_rowwise(x)
    packed = q.numel() + 8 * q.shape[0]  # codes plus an fp32 scale and bias per row
    out.append({"method": "int8 row-wise (FBGEMM-style)", "ratio": raw / packed,
                "compress_GBps": raw / median_seconds(lambda: int8_rowwise(x), repeat) / 1e9,
                "decompress_GBps": raw / median_seconds(lambda: q.float() * scale + lo, repeat) / 1e9,
                "max_abs_error": (x - (q.float() * scale + lo)).abs().max().item()})
    return out


def workloads(synthetic_mb):
    tables = criteo_batch_lookups(batch=2048, dim=32)
    criteo = torch.cat(tables)
    synth = synthetic_lookups(synthetic_mb << 20, dim=32)
    return {
        "criteo": (criteo, [1024] * (2 * len(tables))),
        "synthetic": (synth, [synth.shape[0]]),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hvd_lossy.bench codec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--error-bound", type=float, default=0.03, help="relative bound (default 0.03)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--synthetic-mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", default="benchmarks/out/codec.json", help="where to write results")
    args = parser.parse_args(argv)

    cores = os.cpu_count()
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.processor() or platform.machine(),
               "cores": cores, "error_bound_rel": args.error_bound, "runs": []}
    for name, (x, rows) in workloads(args.synthetic_mb).items():
        for threads in (1, 0):
            label = "1 core" if threads == 1 else f"all cores ({cores})"
            # Stage ablation: quantize + pack alone, + duplicate-row removal, + entropy coder;
            # then the dithered (gradient) path, which has no dedup and no SIMD kernel.
            for level, dedup in [(1, False), *((lv, True) for lv in args.levels)]:
                r = bench_lossy(x, rows, args.error_bound, level, threads, args.repeat, dedup)
                results["runs"].append({"workload": name, "threads": label, **r})
            for level in args.levels:
                r = bench_lossy(x, rows, args.error_bound, level, threads, args.repeat, False, dither=1)
                results["runs"].append({"workload": name, "threads": label, **r})
            for r in bench_baselines(x, threads, args.repeat):
                results["runs"].append({"workload": name, "threads": label, **r})
    hvd_lossy.set_num_threads(0)

    print(f"{'workload':10} {'threads':14} {'method':30} {'ratio':>8} {'comp GB/s':>10} {'dec GB/s':>9} "
          f"{'dec into':>9} {'err/eb':>7}")
    for r in results["runs"]:
        err = r.get("max_error_over_bound")
        err = f"{err:7.3f}" if err is not None else f"{'-':>7}"
        into = r.get("decompress_into_GBps")
        into = f"{into:9.3f}" if into is not None else f"{'-':>9}"
        print(f"{r['workload']:10} {r['threads']:14} {r['method']:30} {r['ratio']:8.2f} "
              f"{r['compress_GBps']:10.3f} {r['decompress_GBps']:9.3f} {into} {err}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")
    return 0
