"""`python -m hvd_lossy.bench codec`: compression ratio, speed and max error of the codec, each
speed also as a ratio to torch's own fp16 cast timed in the same process.

Workloads:
  realistic  a 64 MB float32 batch, dim 128, that duplicates like real lookups: Zipf ids into one
             DLRM-initialised table, about 30% of the rows distinct, in random order (the
             repeated rows' first occurrences are cache misses). One tensor.
  criteo     the bundled Criteo Kaggle rows as a 2-rank all-to-all sends them: 26 tables, dim 32,
             DLRM uniform init, batch 2,048; each table's lookups split into 2 chunks of 1,024
             rows, each chunk compressed alone (bound over the chunk), all 52 in one native call.
  synthetic  the older 64 MB float32 set (Criteo cardinalities capped, dim 32): ratio ~200, so it
             hides the cost of distinct rows; kept for continuity with earlier results.
Every method runs on one thread; the codec and the cast alternate call by call, so that both see
the same machine load, and each time is the median of --repeat calls. "dec new" decodes into a
new tensor each call (its page faults included, as for the cast's half.float()), "dec into"
into a reused one; the cast is also timed into reused tensors (copy_), the fair partner of
"dec into" and of compress (whose frames land in reused codec-owned memory). For the realistic
set, decoding into new memory three ways: the codec's cached blocks, its fresh blocks (cache
off; on huge pages from 16 MiB, as the 64 MB set is), a torch.empty tensor. Then 1 thread vs 2 on one call of 52 pieces (compress_chunks
of one frame of 52 segments, and decoding it), for the criteo chunks and for the realistic batch
cut into 52. Frames are format 2, every piece of a call a segment of one frame, as the
all-to-all sends a destination.
With --ids only the realistic sets run, compressed on one thread with and without the rows'
ids (the ids the batch was drawn with) in the same rounds: duplicates found by content (every
row hashed) against by id (each repeated id's row compared with its first); the frames must be
the same bytes.
With --modes rel abs every configuration also runs with each piece's bound given as the absolute
bound its relative one comes to (taken before the timing): the same codes without the encoder's
pass over the values for their range, which is what separates the two.
With --reuse calls of drifting rows go through hvd_lossy.reuse and the share of rows sent as
references, residuals and fresh is reported with the bytes against today's; then one call is
timed coded as today, fresh through reuse and reused (hvd_lossy.bench.reuse_share).
With --step one rank's codec work in a DLRM training step, at its sizes and with its inputs just
written (in the caches, as training hands them over), beside the fp16 cast of the same tensors;
--against PATH times another checkout's build step by step in turn (hvd_lossy.bench.step).
Throughput counts the uncompressed bytes (GB = 1e9 bytes).
"""
import json
import os
import platform
import statistics
import subprocess
import time

import torch

import hvd_lossy
from hvd_lossy import _C, _codec
from hvd_lossy.bench import _cli, machine, reuse_share, step
from hvd_lossy.bench.criteo import criteo_batch_lookups, realistic_lookups, synthetic_lookups


def paired_medians(fns, repeat):
    """Median seconds of each callable, calling them in turn (one round per repeat) after a
    warm-up round, so that a change of machine load hits all of them alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def max_error_over_bound(x, y, eb_abs):
    """Largest |x - y| over the finite elements, divided by the bound (<= 1: the bound holds)."""
    finite = torch.isfinite(x)
    err = (x[finite].double() - y[finite].double()).abs().max().item() if finite.any() else 0.0
    return err / eb_abs if eb_abs > 0 else (0.0 if err == 0 else float("inf"))


def decode_into(frame, out, threads):
    """The frame straight into `out` with the native decompress_into (the lean exchange)."""
    errors = _C.decompress_into(frame.data_ptr(), frame.numel(), [(0, frame.numel(), out.shape[0])],
                                _codec._DTYPE_CODES[out.dtype], list(out.shape[1:]),
                                out.data_ptr(), out.numel() * out.element_size(), threads)
    if any(errors):
        raise RuntimeError(f"decompress_into failed: {errors}")
    return out


def _worst_error(x, rows, frame, decoded):
    """Largest error over bound of any piece, each against its own segment's bound."""
    worst = 0.0
    segs = hvd_lossy.frame_info(frame)["segments"]
    for seg, src, out in zip(segs, torch.split(x, rows), torch.split(decoded, rows)):
        worst = max(worst, max_error_over_bound(src, out, seg["eb_abs"]))
    return worst


def absolute_bounds(x, rows, eb):
    """Each piece's relative bound eb as an absolute one: eb x (max - min) of its finite values,
    the bound mode "rel" codes it with (up to rounding), for coding in mode "abs"."""
    out = []
    for piece in torch.split(x, rows):
        v = piece[torch.isfinite(piece)].double()
        out.append(eb * float(v.max() - v.min()) if v.numel() else 0.0)
    return out


def bench_method(x, rows, eb, level, repeat, dedup=True, dither=None, mode="rel"):
    """One codec configuration on one thread, beside the fp16 cast in both directions. Every
    piece goes in one frame, as the all-to-all sends a destination. mode "abs" codes each piece
    at the absolute bound its relative one comes to, taken before the timing: the same codes,
    without the encoder's pass over the values for their range."""
    hvd_lossy.set_num_threads(1)
    torch.set_num_threads(1)
    kw = dict(level=level, dedup=dedup, dither=dither)
    if mode == "abs":
        kw["mode"] = "abs"
        ebs = absolute_bounds(x, rows, eb)
        eb = ebs[0] if len(rows) == 1 else ebs
    if len(rows) == 1:
        compress = lambda: hvd_lossy.compress(x, eb, **kw)  # noqa: E731
    else:
        compress = lambda: hvd_lossy.compress_chunks(x, rows, eb, **kw)[0]  # noqa: E731
    frame = compress()
    decompress = lambda: hvd_lossy.decompress(frame)  # noqa: E731
    reused = torch.empty_like(x)
    decompress_into = lambda: hvd_lossy.decompress(frame, out=reused)  # noqa: E731
    decoded = hvd_lossy.decompress(frame)
    half = x.half()
    half_out, float_out = torch.empty_like(half), torch.empty_like(x)
    t_c, t_d, t_i, t_h, t_f, t_hi, t_fi = paired_medians(
        [compress, decompress, decompress_into, lambda: x.half(), lambda: half.float(),
         lambda: half_out.copy_(x), lambda: float_out.copy_(half)], repeat)
    worst = _worst_error(x, rows, frame, decoded)
    assert torch.equal(reused, decoded), "decoding into a reused tensor differs"
    raw = x.numel() * x.element_size()
    name = (f"L{level}" + ("" if dedup else " no dedup") + ("" if dither is None else " dither")
            + (" abs" if mode == "abs" else ""))
    gbps = lambda t: raw / t / 1e9  # noqa: E731
    return {"method": name, "ratio": raw / frame.numel(), "bytes": frame.numel(),
            "compress_GBps": gbps(t_c), "decompress_new_GBps": gbps(t_d),
            "decompress_into_GBps": gbps(t_i), "fp16_cast_GBps": gbps(t_h),
            "fp16_back_GBps": gbps(t_f), "fp16_cast_into_GBps": gbps(t_hi),
            "fp16_back_into_GBps": gbps(t_fi), "compress_vs_cast": t_h / t_c,
            "decompress_new_vs_cast": t_f / t_d, "decompress_into_vs_cast": t_f / t_i,
            "compress_vs_cast_into": t_hi / t_c, "decompress_into_vs_cast_into": t_fi / t_i,
            "max_error_over_bound": worst}


def bench_ids(x, ids, eb, level, repeat):
    """One frame of the whole batch on one thread, duplicates found by content and by `ids`, in
    the same rounds; the two frames must be the same bytes. Without dedup too, in the same
    rounds: what coding every row costs, against which the share of finding duplicates
    shows."""
    hvd_lossy.set_num_threads(1)
    torch.set_num_threads(1)
    rows = [x.shape[0]]
    by_content = lambda: hvd_lossy.compress_chunks(x, rows, eb, level=level)[0]  # noqa: E731
    by_id = lambda: hvd_lossy.compress_chunks(x, rows, eb, level=level, ids=ids)[0]  # noqa: E731
    frame = by_content()
    if not torch.equal(frame, by_id()):
        raise AssertionError("the frames with and without ids differ")
    every_row = lambda: hvd_lossy.compress_chunks(x, rows, eb, level=level, dedup=False)  # noqa: E731
    t_content, t_id, t_all = paired_medians([by_content, by_id, every_row], repeat)
    raw = x.numel() * x.element_size()
    return {"method": f"L{level}", "rows": x.shape[0], "distinct_ids": len(torch.unique(ids)),
            "ratio": raw / frame.numel(), "compress_content_GBps": raw / t_content / 1e9,
            "compress_ids_GBps": raw / t_id / 1e9, "compress_no_dedup_GBps": raw / t_all / 1e9,
            "ids_speedup": t_content / t_id}


def print_ids(results):
    print(f"{'workload':16} {'method':6} {'rows':>9} {'distinct':>9} {'ratio':>7} "
          f"{'content':>8} {'ids':>8} {'x':>6} {'no dedup':>9}")
    for r in results["ids"]:
        print(f"{r['workload']:16} {r['method']:6} {r['rows']:9d} {r['distinct_ids']:9d} "
              f"{r['ratio']:7.2f} {r['compress_content_GBps']:8.3f} {r['compress_ids_GBps']:8.3f} "
              f"{r['ids_speedup']:6.2f} {r['compress_no_dedup_GBps']:9.3f}")
    print("(compress GB/s on one thread, duplicates found by content and by id (the same bytes),\n"
          " and every row coded; x: ids' speed-up)")


def bench_fresh_memory(x, eb, repeat):
    """What decoding into new memory costs, three ways, in the same rounds: the codec's own
    blocks reused from its cache (the default), its fresh blocks (cache off; on transparent
    huge pages from 16 MiB, as output_blocks.cc advises them), and a torch.empty tensor (4 KiB
    pages, faulted in by the decoder)."""
    hvd_lossy.set_num_threads(1)
    torch.set_num_threads(1)
    frame = hvd_lossy.compress(x, eb)
    limit, _ = _codec.output_cache_bytes()

    def uncached():
        _codec.set_output_cache_bytes(0)
        try:
            return hvd_lossy.decompress(frame)
        finally:
            _codec.set_output_cache_bytes(limit)

    half = x.half()
    t = paired_medians([lambda: hvd_lossy.decompress(frame), uncached,
                        lambda: hvd_lossy.decompress(frame, out=torch.empty_like(x)),
                        lambda: half.float()], repeat)
    raw = x.numel() * x.element_size()
    names = ("cached_block", "fresh_huge_pages", "torch_empty")
    result = {f"decompress_{n}_GBps": raw / v / 1e9 for n, v in zip(names, t)}
    result.update({f"decompress_{n}_vs_cast": t[3] / v for n, v in zip(names, t)})
    result["fp16_back_GBps"] = raw / t[3] / 1e9
    return result


def bench_threads(x, rows, eb, repeat, level=1):
    """1 vs 2 threads on one call of len(rows) pieces, compress and decode (into a reused tensor
    and into new ones), interleaved."""
    torch.set_num_threads(1)
    buf, sizes = hvd_lossy.compress_chunks(x, rows, eb, level=level)
    out = torch.empty_like(x)

    def with_threads(n, fn):
        def run():
            hvd_lossy.set_num_threads(n)
            return fn()
        return run

    fns = []
    for n in (1, 2):
        fns += [with_threads(n, lambda: hvd_lossy.compress_chunks(x, rows, eb, level=level)),
                with_threads(n, lambda: hvd_lossy.decompress_chunks(buf, sizes)),
                with_threads(n, lambda n=n: decode_into(buf, out, n))]
    t = paired_medians(fns, repeat)
    hvd_lossy.set_num_threads(0)
    raw = x.numel() * x.element_size()
    names = ("compress", "decompress_new", "decompress_into")
    result = {"method": f"L{level}, {len(rows)} pieces", "pieces": len(rows), "ratio": raw / buf.numel()}
    for k, name in enumerate(names):
        result[f"{name}_GBps_1t"] = raw / t[k] / 1e9
        result[f"{name}_GBps_2t"] = raw / t[3 + k] / 1e9
        result[f"{name}_speedup_2t"] = t[k] / t[3 + k]
    return result


def distinct_share(rows, table_rows, zipf):
    """The share of distinct rows in a realistic batch of `rows` rows (it depends on the ids
    only, so a batch of dim 1 tells it cheaply)."""
    x = realistic_lookups(4 * rows, dim=1, table_rows=table_rows, zipf=zipf)
    return len(torch.unique(x)) / rows


def zipf_for(rows, table_rows, share):
    """The Zipf exponent whose realistic batch of `rows` rows has about `share` of them distinct
    (a bisection: a flatter law spreads the draws over more ids)."""
    lo, hi = 0.0, 4.0
    for _ in range(16):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if distinct_share(rows, table_rows, mid) < share else (mid, hi)
    return (lo + hi) / 2


def workloads(realistic_mb, names, table_rows, dims=None, distinct=None):
    """The data sets by name, each (tensor, rows of its pieces, ids of its rows or None); with
    `dims` or `distinct` the realistic set once per dim and distinct share (named e.g.
    realistic d32 30%)."""
    made = {}
    if "realistic" in names and (dims or distinct):
        for dim in dims or [128]:
            rows = max(1, (realistic_mb << 20) // (4 * dim))
            for share in distinct or [None]:
                # a table of 4 ids a row leaves room for up to ~88% distinct
                n = table_rows if share is None else max(table_rows, 4 * rows)
                zipf = 1.04 if share is None else zipf_for(rows, n, share)
                x, ids = realistic_lookups(realistic_mb << 20, dim=dim, table_rows=n, zipf=zipf,
                                           with_ids=True)
                label = f"d{dim}" + ("" if share is None else f" {round(share * 100)}%")
                made[f"realistic {label}"] = (x, [x.shape[0]], ids)
    elif "realistic" in names:
        x, ids = realistic_lookups(realistic_mb << 20, dim=128, table_rows=table_rows,
                                   with_ids=True)
        made["realistic"] = (x, [x.shape[0]], ids)
    if "criteo" in names:
        tables = criteo_batch_lookups(batch=2048, dim=32)
        made["criteo"] = (torch.cat(tables), [1024] * (2 * len(tables)), None)
    if "synthetic" in names:
        x = synthetic_lookups(realistic_mb << 20, dim=32)
        made["synthetic"] = (x, [x.shape[0]], None)
    return made


def pieces(n_rows, count):
    return [n_rows * (i + 1) // count - n_rows * i // count for i in range(count)]


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__), timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def print_fresh(r):
    print(f"\n{r['workload']}: decoding into new memory, L1, one thread: codec's cached block "
          f"{r['decompress_cached_block_GBps']:.3f} GB/s ({r['decompress_cached_block_vs_cast']:.2f}x "
          f"cast back), fresh huge pages {r['decompress_fresh_huge_pages_GBps']:.3f} "
          f"({r['decompress_fresh_huge_pages_vs_cast']:.2f}x), torch.empty "
          f"{r['decompress_torch_empty_GBps']:.3f} ({r['decompress_torch_empty_vs_cast']:.2f}x); "
          f"half.float() {r['fp16_back_GBps']:.3f}")


def print_table(results):
    print(f"{'workload':16} {'method':22} {'ratio':>7} {'comp':>7} {'dec new':>8} {'dec into':>9} "
          f"{'fp16':>6} {'back':>6} {'comp/cast':>9} {'new/cast':>8} {'into/cast':>9} {'err/eb':>6}")
    for r in results["runs"]:
        print(f"{r['workload']:16} {r['method']:22} {r['ratio']:7.2f} {r['compress_GBps']:7.3f} "
              f"{r['decompress_new_GBps']:8.3f} {r['decompress_into_GBps']:9.3f} "
              f"{r['fp16_cast_GBps']:6.2f} {r['fp16_back_GBps']:6.2f} {r['compress_vs_cast']:9.3f} "
              f"{r['decompress_new_vs_cast']:8.3f} {r['decompress_into_vs_cast']:9.3f} "
              f"{r['max_error_over_bound']:6.3f}")
    print("(GB/s on one thread; x/cast: the codec's speed over the fp16 cast's in the same rounds;\n"
          " the cast allocates its result: x.half(), half.float())")
    print(f"\n{'workload':16} {'method':22} {'cast into':>9} {'back into':>9} {'comp/into':>9} "
          f"{'dec into/back into':>18}")
    for r in results["runs"]:
        print(f"{r['workload']:16} {r['method']:22} {r['fp16_cast_into_GBps']:9.2f} "
              f"{r['fp16_back_into_GBps']:9.2f} {r['compress_vs_cast_into']:9.3f} "
              f"{r['decompress_into_vs_cast_into']:18.3f}")
    print("(the cast into reused tensors, copy_(): no allocation, no page faults)")
    print(f"\n{'workload':16} {'call':20} {'comp 1t':>8} {'comp 2t':>8} {'x':>5} {'new 1t':>7} "
          f"{'new 2t':>7} {'x':>5} {'into 1t':>8} {'into 2t':>8} {'x':>5}")
    for r in results["threads"]:
        print(f"{r['workload']:16} {r['method']:20} {r['compress_GBps_1t']:8.3f} "
              f"{r['compress_GBps_2t']:8.3f} {r['compress_speedup_2t']:5.2f} "
              f"{r['decompress_new_GBps_1t']:7.3f} {r['decompress_new_GBps_2t']:7.3f} "
              f"{r['decompress_new_speedup_2t']:5.2f} {r['decompress_into_GBps_1t']:8.3f} "
              f"{r['decompress_into_GBps_2t']:8.3f} {r['decompress_into_speedup_2t']:5.2f}")


def main(argv=None):
    parser = _cli.Parser(prog="python -m hvd_lossy.bench codec", description=__doc__)
    parser.add_argument("--error-bound", type=_cli.number(0), default=0.03,
                        help="relative bound (a fraction of each tensor's value range; 0 is lossless)")
    parser.add_argument("--levels", type=int, nargs="+", choices=[1, 2], default=[1, 2],
                        help="codec levels to measure")
    parser.add_argument("--workloads", nargs="+", default=["realistic", "criteo"],
                        choices=["realistic", "criteo", "synthetic"], help="data sets to code")
    parser.add_argument("--realistic-mb", type=_cli.number(1, kind=int), default=64,
                        help="size of the realistic and synthetic sets, MB")
    parser.add_argument("--table-rows", type=_cli.number(1, kind=int), default=1_000_000,
                        help="rows of the realistic set's table (1,000,000: ~30%% of 64 MB distinct)")
    parser.add_argument("--dims", type=_cli.number(1, kind=int), nargs="+",
                        help="row widths of the realistic set, one set each (default: 128)")
    parser.add_argument("--distinct", type=_cli.number(0, 1, low_open=True), nargs="+",
                        help="shares of distinct rows of the realistic set (e.g. 0.30 0.55), one "
                             "set each; the table size is chosen to match (default: --table-rows)")
    parser.add_argument("--repeat", type=_cli.number(1, kind=int), default=7,
                        help="timed runs of each measurement (the median is reported)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run for tests: 4 MB sets (a 20,000-row table, again ~30%% "
                             "distinct), 1 repeat, level 1 only")
    parser.add_argument("--modes", nargs="+", choices=["rel", "abs"], default=["rel"],
                        help="bound modes: rel (the range taken by the encoder, as the "
                             "all-to-all's relative bounds) and abs (each piece's relative bound "
                             "given as the absolute bound it comes to: no range pass)")
    parser.add_argument("--ids", action="store_true",
                        help="only the realistic sets, compressed with and without their rows' "
                             "ids side by side (duplicates found by id or by content)")
    parser.add_argument("--reuse", action="store_true",
                        help="only reuse: the share of calls of drifting rows sent through "
                             "hvd_lossy.reuse as references / residuals / fresh and their "
                             "bytes, then the compress time a row coded, fresh and reused")
    parser.add_argument("--reuse-step", type=_cli.number(0), default=0.1,
                        help="--reuse: how far every row moves between calls, in bounds")
    parser.add_argument("--reuse-calls", type=_cli.number(1, kind=int), default=40,
                        help="--reuse: calls of one destination's chunk")
    parser.add_argument("--step", action="store_true",
                        help="only one rank's codec work in a training step of the DLRM user "
                             "script, its inputs just written, beside the fp16 cast of the same "
                             "tensors (hvd_lossy.bench.step)")
    parser.add_argument("--against", metavar="PATH",
                        help="--step: also time another checkout's built codec "
                             "(PATH/hvd_lossy/_C*.so), step by step in turn with this one")
    parser.add_argument("--json", default="benchmarks/out/codec.json", help="where to write results")
    args = parser.parse_args(argv)
    if args.against and not args.step:
        parser.error("--against times builds side by side in --step only")
    if args.step:
        try:
            against = step.load_build(args.against) if args.against else None
        except FileNotFoundError as e:
            parser.error(str(e))
        result = step.measure(repeat=3 if args.quick else max(args.repeat, 100), against=against)
        step.print_step(result)
        print(machine.summary(machine.describe()))
        _write(args.json, {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": git_commit(),
                           "step": result, "cpu": machine.describe()})
        return 0
    if args.reuse:
        calls = 8 if args.quick else args.reuse_calls
        result = reuse_share.measure(calls=calls, step=args.reuse_step, bound=args.error_bound,
                                     rows=256 if args.quick else 1024)
        reuse_share.print_share(result, args.reuse_step)
        timing = reuse_share.time_rows(dim=(args.dims or [128])[0], repeat=3 if args.quick
                                       else max(args.repeat, 20), bound=args.error_bound,
                                       rows=64 if args.quick else 512)
        reuse_share.print_time(timing)
        print(machine.summary(machine.describe()))
        _write(args.json, {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": git_commit(),
                           "error_bound_rel": args.error_bound, "step_bounds": args.reuse_step,
                           "reuse": result, "reuse_time": timing, "cpu": machine.describe()})
        return 0
    if args.quick:
        args.realistic_mb, args.table_rows, args.repeat, args.levels = 4, 20_000, 1, [1]
    if args.ids:
        args.workloads = ["realistic"]

    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": git_commit(),
               "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "cpu": machine.describe(),
               "torch": torch.__version__, "error_bound_rel": args.error_bound,
               "repeat": args.repeat, "load_average_before": os.getloadavg(), "runs": [],
               "threads": [], "ids": []}
    results["table_rows"] = args.table_rows
    for name, (x, rows, ids) in workloads(args.realistic_mb, args.workloads, args.table_rows,
                                          args.dims, args.distinct).items():
        if args.ids:
            for level in args.levels:
                results["ids"].append({"workload": name, **bench_ids(x, ids, args.error_bound,
                                                                     level, args.repeat)})
            continue
        configs = [dict(level=lv) for lv in args.levels]
        configs += [dict(level=1, dither=1), dict(level=1, dedup=False),
                    dict(level=1, dedup=False, dither=1)]
        configs = [dict(cfg, mode=m) for m in args.modes for cfg in configs]
        for cfg in configs:
            r = bench_method(x, rows, args.error_bound, repeat=args.repeat, **cfg)
            if name.startswith("realistic") and cfg == configs[0]:
                r["distinct_row_fraction"] = len(torch.unique(x, dim=0)) / x.shape[0]
            results["runs"].append({"workload": name, **r})
        if name.startswith("realistic") and "fresh_memory" not in results and hasattr(_codec, "output_cache_bytes"):  # not on older builds
            results["fresh_memory"] = {"workload": name, **bench_fresh_memory(x, args.error_bound,
                                                                               args.repeat)}
        split = rows if len(rows) > 1 else pieces(x.shape[0], 52)
        results["threads"].append({"workload": name, **bench_threads(x, split, args.error_bound,
                                                                     args.repeat)})
    hvd_lossy.set_num_threads(0)
    torch.set_num_threads(os.cpu_count() or 1)
    results["load_average_after"] = os.getloadavg()
    if args.ids:
        print_ids(results)
    else:
        print_table(results)
    if "fresh_memory" in results:
        print_fresh(results["fresh_memory"])
    print(machine.summary(results["cpu"]))
    print(f"load average before / after: {results['load_average_before'][0]:.2f} / "
          f"{results['load_average_after'][0]:.2f} (on {results['cores']} cores)")
    _write(args.json, results)
    return 0


def _write(path, results):
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {path}")
