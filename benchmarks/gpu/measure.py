"""The numbers issue 25 asks of a GPU, each frame checked against the CPU codec's bytes and each
decode against the bound; times are CUDA events on the current stream (medians).

    python benchmarks/gpu/measure.py --out DIR              # on the GPU machine (run.sh calls it)
    python benchmarks/gpu/measure.py --device cpu --quick   # dry run here: the CPU codec, wall clock

Writes DIR/gpu_issue25.json, after every item (a stage cut short by its timeout leaves the
items before it), with the keys of the earlier GPU issue:
  gpu, date, compress_GBps_64MB, decompress_GBps_64MB, roundtrip_us_1MB, step_compress_us,
  step_decompress_us, byte_identical_to_cpu, bound_ok, copy_GBps, fp16_cast_GBps
and the detail behind them under "items". GB/s count uncompressed bytes. "step" is one rank's
DLRM exchange: 26 tables x 8 destinations x 256 rows x dim 128 as one compress_grouped call
(8 frames of 26 segments, the layout hvd_lossy's all-to-all sends; the CUDA encoder codes its
208 pieces in one batch, one launch a stage) and the decode of the 8 frames (decompress_chunks,
the step_decompress_us key, and "receive_us": the all-to-all's receive path into one output;
both read the frames' headers from bounded prefixes and decode every frame with one call of the
batched decoder); fp32 is the headline, fp16 and the dithered gradient recipe (on the device, and on a GPU
also through the host codec as before, HVD_LOSSY_HOST_DITHER=1) are beside it, each with the
kernels and copies one call makes. A dry run on
the CPU writes the same keys with "device": "cpu": those are no GPU figures.
"""
import argparse
import json
import os
import pathlib
import platform
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402
import torch  # noqa: E402

import hvd_lossy  # noqa: E402

TABLES, DESTINATIONS, ROWS, DIM = 26, 8, 256, 128
REL_BOUND = 0.03  # the forward recipe's bound; the gradient one is 0.02 with dither
GRAD_BOUND, GRAD_SEED = 0.02, 12345


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "out"))
    p.add_argument("--repeat", type=int, default=30, help="timed calls a measurement (median)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--big-mb", type=int, default=64, help="size of the large tensor (MiB)")
    p.add_argument("--quick", action="store_true", help="few repeats, an 8 MiB large tensor")
    args = p.parse_args(argv)
    if args.quick:
        args.repeat, args.warmup, args.big_mb = 3, 1, min(args.big_mb, 8)
    return args


def timed_us(fn, device, warmup, repeat):
    """Median microseconds of fn(): gpu_check's timer (CUDA events on the current stream, or the
    wall clock on the CPU)."""
    return gpu_check.timed(fn, device, warmup, repeat) * 1e6


def worst_over_bound(x, y, eb_abs):
    """max |x - y| / eb_abs over the finite elements of x (NaN and Inf must come back as they
    were: a mismatch there counts as infinitely over)."""
    x, y = x.double(), y.double()
    finite = torch.isfinite(x)
    if not torch.equal(torch.isnan(x), torch.isnan(y)) or not torch.equal(
            x[torch.isinf(x)], y[torch.isinf(x)]):
        return float("inf")
    if not finite.any():
        return 0.0
    err = (x[finite] - y[finite]).abs().max().item()
    return err / eb_abs if eb_abs else (0.0 if err == 0 else float("inf"))


class Results:
    def __init__(self, out_dir, device):
        self.dir = pathlib.Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "gpu_issue25.json"
        gpu = torch.cuda.get_device_name() if device == "cuda" else "none (dry run on the CPU)"
        self.data = {"gpu": gpu, "device": device, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "host": platform.node(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "byte_identical_to_cpu": True, "bound_ok": True,
                     "items": {}}

    def item(self, name, identical=None, worst=None, **fields):
        if identical is not None:
            fields["identical_to_cpu"] = identical
            self.data["byte_identical_to_cpu"] &= bool(identical)
        if worst is not None:
            fields["max_error_over_bound"] = worst
            self.data["bound_ok"] &= worst <= 1.0
        self.data["items"][name] = fields
        self.save()

    def set(self, **keys):
        self.data.update(keys)
        self.save()

    def save(self):
        self.path.write_text(json.dumps(self.data, indent=2))


def step_lookups(dtype, seed):
    """One rank's send buffer: for each destination, its 26 tables' 256 rows (lookups of DLRM
    tables: rows repeat, as hot ids do), destination-major, table-major within."""
    g = torch.Generator().manual_seed(seed)
    tables = [torch.empty(1000, DIM).uniform_(-0.03, 0.03, generator=g) for _ in range(TABLES)]
    parts = []
    for _ in range(DESTINATIONS):
        for t in range(TABLES):
            ids = (torch.rand(ROWS, generator=g) ** 3 * 1000).long()  # skewed: hot rows repeat
            parts.append(tables[t][ids])
    return torch.cat(parts).to(dtype)


def measure_step(res, args, dtype, dither, host_dither=False):
    """One rank's DLRM exchange: compress_grouped of the 208 pieces into 8 frames, then
    decompress_chunks of them; host_dither: with HVD_LOSSY_HOST_DITHER=1, the host path the
    device dither replaces (the same bytes, for comparison)."""
    if host_dither:
        os.environ[hvd_lossy._codec.HOST_DITHER_VARIABLE] = "1"
    try:
        return _measure_step(res, args, dtype, dither, host_dither)
    finally:
        os.environ.pop(hvd_lossy._codec.HOST_DITHER_VARIABLE, None)


def _measure_step(res, args, dtype, dither, host_dither):
    rows = [ROWS] * (TABLES * DESTINATIONS)
    groups = [TABLES] * DESTINATIONS
    x_cpu = step_lookups(dtype, 1)
    x = x_cpu.to(args.device)
    bound, seed = (GRAD_BOUND, GRAD_SEED) if dither else (REL_BOUND, None)
    cap = hvd_lossy.max_grouped_bytes(rows, [DIM], groups, 0)
    out = torch.empty(cap, dtype=torch.uint8, device=args.device)
    out_cpu = torch.empty(cap, dtype=torch.uint8)

    def compress(src, dst):
        return hvd_lossy.compress_grouped(src, rows, [bound] * len(rows), groups, 0, dst, 0,
                                          mode="rel", level=1, dither=seed)

    sizes = compress(x, out)
    sizes_cpu = compress(x_cpu, out_cpu)
    frame_bytes = [sum(sizes[g * TABLES:(g + 1) * TABLES]) for g in range(DESTINATIONS)]
    total = sum(frame_bytes)
    identical = sizes == sizes_cpu and torch.equal(out[:total].cpu(), out_cpu[:total])
    buffer = out[:total]
    decoded = hvd_lossy.decompress_chunks(buffer, frame_bytes)
    worst = 0.0
    for d, frame_out in enumerate(decoded):
        infos = hvd_lossy.frame_info(buffer[sum(frame_bytes[:d]):sum(frame_bytes[:d + 1])])
        src = x_cpu[d * TABLES * ROWS:(d + 1) * TABLES * ROWS]
        for t, seg in enumerate(infos["segments"]):
            a, b = t * ROWS, (t + 1) * ROWS
            worst = max(worst, worst_over_bound(src[a:b], frame_out[a:b].cpu(), seg["eb_abs"]))
    received = torch.empty(x.shape, dtype=dtype, device=args.device)
    exchange_receive(buffer, frame_bytes, received)
    identical = identical and torch.equal(received.cpu().view(torch.uint8),
                                          torch.cat(decoded).cpu().view(torch.uint8))
    t_c = timed_us(lambda: compress(x, out), args.device, args.warmup, args.repeat)
    t_d = timed_us(lambda: hvd_lossy.decompress_chunks(buffer, frame_bytes), args.device,
                   args.warmup, args.repeat)
    t_r = timed_us(lambda: exchange_receive(buffer, frame_bytes, received), args.device,
                   args.warmup, args.repeat)
    raw = x.numel() * x.element_size()
    name = "step %s%s%s" % (str(dtype).replace("torch.", ""), " dithered" if dither else "",
                            " on the host" if host_dither else "")
    res.item(name, identical=identical, worst=worst, raw_bytes=raw, frame_bytes=total,
             ratio=raw / total, compress_us=t_c, decompress_us=t_d, receive_us=t_r,
             pieces=len(rows),
             frames=DESTINATIONS, bound_rel=bound, dither_seed=seed,
             launches=count_launches(args, {
                 "compress": lambda: compress(x, out),
                 "compress as 8 pieces": lambda: hvd_lossy.compress_grouped(
                     x, [TABLES * ROWS] * DESTINATIONS, [bound] * DESTINATIONS,
                     [1] * DESTINATIONS, 0, out, 0, mode="rel", level=1, dither=seed),
                 "decompress": lambda: hvd_lossy.decompress_chunks(buffer, frame_bytes),
                 "receive": lambda: exchange_receive(buffer, frame_bytes, received)}))
    return t_c, t_d


def exchange_receive(buffer, frame_bytes, out):
    """What hvd_lossy's all-to-all does with its received buffer of one frame a sender (the
    collective without the network): the frames' heads read from bounded prefixes, then every
    sender's rows decoded into one output, on a device by one batched decode
    (hvd_lossy.collective.decode_chunks)."""
    from hvd_lossy.collective import decode_chunks
    offsets = [sum(frame_bytes[:d]) for d in range(len(frame_bytes))]
    decode_chunks(buffer, [(o, n, TABLES * ROWS) for o, n in zip(offsets, frame_bytes)], out,
                  list(range(len(frame_bytes))))


def count_launches(args, calls):
    """Kernel launches and device copies of one call of each, from torch's profiler (CUPTI):
    with one launch set per call (issue 25 part 3, the encoder) a compress of the 208 pieces
    launches what one of 8 pieces does. None on the CPU, or where the profiler fails (the
    timings do not depend on it)."""
    if args.device != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        out = {}
        for name, fn in calls.items():
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            names = [e.name.lower() for e in prof.events()]  # device activity only
            copies = sum("memcpy" in n for n in names)
            sets = sum("memset" in n for n in names)
            out[name] = {"kernels": len(names) - copies - sets, "memcpy": copies, "memset": sets}
        return out
    except Exception as e:  # noqa: BLE001 - a diagnostic, never a reason to lose the numbers
        return {"error": "%s: %s" % (type(e).__name__, e)}


def measure_tensor(res, args, mb, name):
    """compress + decompress of one fp32 tensor of `mb` MiB (Zipf lookups of dim 32)."""
    from hvd_lossy.bench.criteo import synthetic_lookups
    x_cpu = synthetic_lookups(mb << 20, dim=32)
    x = x_cpu.to(args.device)
    frame = hvd_lossy.compress(x, REL_BOUND)
    frame_cpu = hvd_lossy.compress(x_cpu, REL_BOUND)
    identical = torch.equal(frame.cpu(), frame_cpu)
    y = hvd_lossy.decompress(frame)
    worst = worst_over_bound(x_cpu, y.cpu(), hvd_lossy.frame_info(frame)["eb_abs"])
    t_c = timed_us(lambda: hvd_lossy.compress(x, REL_BOUND), args.device, args.warmup,
                   args.repeat)
    t_d = timed_us(lambda: hvd_lossy.decompress(frame), args.device, args.warmup, args.repeat)
    t_rt = timed_us(lambda: hvd_lossy.decompress(hvd_lossy.compress(x, REL_BOUND)), args.device,
                    args.warmup, args.repeat)
    raw = x.numel() * x.element_size()
    res.item(name, identical=identical, worst=worst, raw_bytes=raw, frame_bytes=frame.numel(),
             compress_us=t_c, decompress_us=t_d, roundtrip_us=t_rt,
             compress_GBps=raw / t_c / 1e3, decompress_GBps=raw / t_d / 1e3)
    return raw, t_c, t_d, t_rt


def measure_yardsticks(res, args):
    """A device copy and torch's fp16 cast of the large tensor, counting its bytes once."""
    x = torch.randn((args.big_mb << 20) // 4, device=args.device)
    raw = x.numel() * 4
    t_copy = timed_us(lambda: x.clone(), args.device, args.warmup, args.repeat)
    t_cast = timed_us(lambda: x.half(), args.device, args.warmup, args.repeat)
    res.item("yardsticks", raw_bytes=raw, copy_us=t_copy, fp16_cast_us=t_cast)
    return raw / t_copy / 1e3, raw / t_cast / 1e3


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("measure.py: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    res = Results(args.out, args.device)
    step_c, step_d = measure_step(res, args, torch.float32, dither=False)
    res.set(step_compress_us=step_c, step_decompress_us=step_d)
    measure_step(res, args, torch.float16, dither=False)
    measure_step(res, args, torch.float32, dither=True)  # the gradient recipe, on the device
    if args.device == "cuda":  # ... and as before issue 25: through the CPU codec
        measure_step(res, args, torch.float32, dither=True, host_dither=True)
    _, _, _, rt = measure_tensor(res, args, 1, "1MB")
    res.set(roundtrip_us_1MB=rt)
    raw, t_c, t_d, _ = measure_tensor(res, args, args.big_mb, "%dMB" % args.big_mb)
    res.set(compress_GBps_64MB=raw / t_c / 1e3, decompress_GBps_64MB=raw / t_d / 1e3,
            large_tensor_MB=args.big_mb)
    copy, cast = measure_yardsticks(res, args)
    res.set(copy_GBps=copy, fp16_cast_GBps=cast)
    d = res.data
    print("%s: step %.0f / %.0f us, %d MB %.0f / %.0f GB/s, 1 MB round trip %.0f us, copy %.0f "
          "GB/s, fp16 cast %.0f GB/s, identical %s, bound %s -> %s"
          % (d["gpu"], d["step_compress_us"], d["step_decompress_us"], args.big_mb,
             d["compress_GBps_64MB"], d["decompress_GBps_64MB"], d["roundtrip_us_1MB"],
             d["copy_GBps"], d["fp16_cast_GBps"], d["byte_identical_to_cpu"], d["bound_ok"],
             res.path))
    return 0 if d["byte_identical_to_cpu"] and d["bound_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
