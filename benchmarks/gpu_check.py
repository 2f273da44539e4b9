"""One-shot check of the CUDA codec for a short GPU lease (built for an H200, sm_90).

From the repository root on the GPU machine:

    python benchmarks/gpu_check.py                 # build in place, test, benchmark (< 4 minutes)
    python benchmarks/gpu_check.py --build none    # already built

and here, without a GPU, a dry run of everything but the CUDA parts:

    python benchmarks/gpu_check.py --device cpu --build none --quick

Stages (each logged, each result written to <out>/gpu_check.json as soon as it is known):
  build      cmake + ninja straight into hvd_lossy/ (HVD_LOSSY_WITH_CUDA=ON, archs --archs); the
             machine has no Horovod and nothing to download, so no pip install is needed. It
             also makes build/cuda_selftest.
  selftest   build/cuda_selftest when present (tests/cuda_selftest.cc; any CUDA build makes it):
             thousands of random frames against the CPU codec.
  tests      pytest tests/test_cuda.py (frames byte-identical to the CPU codec, cross decoding,
             the bound, corrupted frames), tests/test_cuda_encoder.py (the CUDA encoder's frames
             against the CPU's, path by path) and tests/test_frame_format.py (golden frames).
  benchmark  compress/decompress timed with CUDA events (warm-up, median of --repeat) on
               synthetic   a 64 MB float32 batch of Criteo-scale lookups (hvd_lossy.bench.criteo)
               criteo      the bundled Criteo rows, 26 tables of dim 32, DLRM uniform init,
                           batch 2,048: as one tensor, and as the 52 chunks of a 2-rank
                           all-to-all in one compress_chunks call
             at levels 1 and 2, each checked byte for byte against the CPU codec, beside a
             device-to-device copy of the same bytes (the memory-bandwidth yardstick).
  segments   (benchmarks/gpu_check_segments.py) frames of many segments of the device against the
             CPU's, cross decoding, the device CRC32C's speed, and corrupt or oversized frames
             refused before any device memory is allocated (skip with --skip-segments).
  profile    (--profile) GPU time per kernel of a few synthetic calls, into <out>/profile.txt.
  sanitize   (--sanitize) the selftest under compute-sanitizer memcheck.
<out> is $OUT when set (the lease's output folder), else benchmarks/out. The last lines printed
are a short table. Exit status: 0 when every stage that ran passed.
"""
import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default) or cpu: a dry run of the script on the CPU codec")
    p.add_argument("--build", choices=["cmake", "pip", "none"], default="cmake",
                   help="cmake: configure and build in place (default); pip: pip install -e .; none: use the built module")
    p.add_argument("--archs", default="90", help="CUDA architectures (default 90, the H200)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--skip-segments", action="store_true", help="skip the segments and decode-limit stage")
    p.add_argument("--quick", action="store_true", help="small workloads and few repeats (a dry run)")
    p.add_argument("--synthetic-mb", type=int, default=64)
    p.add_argument("--error-bound", type=float, default=0.03, help="relative bound (default 0.03)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=20, help="timed calls per measurement (median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cpu-repeat", type=int, default=3, help="timed calls of the CPU codec, for reference")
    p.add_argument("--test-timeout", type=int, default=150, help="seconds for the test stage")
    p.add_argument("--selftest-cases", type=int, default=3000, help="random cases of build/cuda_selftest")
    p.add_argument("--sanitize", action="store_true",
                   help="also run build/cuda_selftest under compute-sanitizer memcheck (about 1-2 minutes)")
    p.add_argument("--sanitize-timeout", type=int, default=120)
    p.add_argument("--profile", action="store_true",
                   help="also time each kernel of a few synthetic compress/decompress calls (torch.profiler)")
    p.add_argument("--build-timeout", type=int, default=400, help="seconds for the build stage")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "out"),
                   help="folder for gpu_check.json and the logs (default $OUT, else benchmarks/out)")
    args = p.parse_args(argv)
    if args.quick:
        args.synthetic_mb = min(args.synthetic_mb, 8)
        args.repeat = min(args.repeat, 3)
        args.warmup = min(args.warmup, 1)
        args.cpu_repeat = 1
    return args


class Report:
    """Results, saved after every stage so that a stage cut short leaves the earlier ones."""

    def __init__(self, out_dir):
        self.dir = pathlib.Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "gpu_check.json"
        self.data = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
                     "python": sys.version.split()[0], "stages": {}}

    def stage(self, name, **fields):
        self.data["stages"][name] = fields
        self.save()

    def save(self):
        self.path.write_text(json.dumps(self.data, indent=2))


def run_logged(cmd, log_path, timeout, env=None, cwd=REPO):
    """Runs cmd with output to log_path (and the tail echoed); returns (ok, seconds, tail)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        except OSError as e:
            log.write(f"could not run {cmd[0]}: {e}\n")
            rc = "not run"
    seconds = time.perf_counter() - t0
    tail = pathlib.Path(log_path).read_text(errors="replace").splitlines()[-15:]
    print(f"$ {' '.join(map(str, cmd))}\n  -> {rc} in {seconds:.0f} s", flush=True)
    if rc != 0:
        print("\n".join("  | " + line for line in tail), flush=True)
    return rc == 0, seconds, tail


# ---- build ------------------------------------------------------------------------------------

def build(args, report):
    env = dict(os.environ, HVD_LOSSY_WITH_CUDA="ON", HVD_LOSSY_CUDA_ARCHS=args.archs,
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 4))
    if not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["CUDACXX"] = "/usr/local/cuda/bin/nvcc"
    log = report.dir / "build.log"
    if args.build == "pip":
        ok, secs, tail = run_logged([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                                     "--no-deps", "-e", "."], log, args.build_timeout, env)
    else:
        try:
            import pybind11
        except ImportError:
            report.stage("build", ok=False, error="pybind11 is not installed")
            return False
        build_dir = REPO / "build" / "gpu_check"
        configure = ["cmake", "-S", str(REPO), "-B", str(build_dir),
                     f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={REPO / 'hvd_lossy'}",
                     f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                     "-DCMAKE_BUILD_TYPE=Release", "-DHVD_LOSSY_WITH_CUDA=ON",
                     f"-DHVD_LOSSY_CUDA_ARCHS={args.archs}"]
        if shutil.which("ninja"):
            configure.append("-GNinja")
        ok, secs, tail = run_logged(configure, log, args.build_timeout, env)
        if ok:
            ok, secs2, tail = run_logged(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 4)],
                                         report.dir / "build2.log", args.build_timeout, env)
            secs += secs2
    report.stage("build", ok=ok, seconds=round(secs, 1), mode=args.build, log_tail=tail)
    return ok


# ---- standalone selftest and memory checker ---------------------------------------------------

SELFTEST = REPO / "build" / "cuda_selftest"


def selftest(args, report):
    """tests/cuda_selftest.cc, built beforehand (it needs no Python): random frames vs the CPU."""
    if not SELFTEST.exists():
        report.stage("selftest", ok=True, skipped=f"{SELFTEST} not built (see tests/cuda_selftest.cc)")
        return True
    ok, secs, tail = run_logged([str(SELFTEST), str(args.selftest_cases)], report.dir / "selftest.log", 240)
    report.stage("selftest", ok=ok, seconds=round(secs, 1), summary=" / ".join(tail[-4:]), log_tail=tail)
    return ok


def sanitize(args, report):
    """compute-sanitizer memcheck over a short selftest run: out-of-bounds accesses fail it."""
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not SELFTEST.exists() or not os.path.exists(tool):
        report.stage("sanitize", ok=True, skipped="needs build/cuda_selftest and compute-sanitizer")
        return True
    cmd = [tool, "--tool", "memcheck", "--error-exitcode", "9", str(SELFTEST), "60", "2", "40"]
    ok, secs, tail = run_logged(cmd, report.dir / "sanitize.log", args.sanitize_timeout)
    report.stage("sanitize", ok=ok, seconds=round(secs, 1), summary=" / ".join(tail[-3:]), log_tail=tail)
    return ok


# ---- tests --------------------------------------------------------------------------------------

def tests(args, report):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--maxfail=5", "--tb=short",
           "tests/test_cuda.py", "tests/test_cuda_encoder.py", "tests/test_frame_format.py"]
    ok, secs, tail = run_logged(cmd, report.dir / "tests.log", args.test_timeout, env)
    summary = next((line for line in reversed(tail) if " passed" in line or " failed" in line
                    or " error" in line or " skipped" in line), "")
    report.stage("tests", ok=ok, seconds=round(secs, 1), summary=summary.strip("= "), log_tail=tail)
    return ok


# ---- benchmark ----------------------------------------------------------------------------------

def timed(fn, device, warmup, repeat):
    """Median seconds of fn() (CUDA events on the current stream for cuda, wall clock for cpu)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def workloads(args):
    import torch
    from hvd_lossy.bench.criteo import criteo_batch_lookups, synthetic_lookups

    tables = criteo_batch_lookups(batch=2048, dim=32)
    criteo = torch.cat(tables)
    synth = synthetic_lookups(args.synthetic_mb << 20, dim=32)
    return [("synthetic", synth, None), ("criteo", criteo, None), ("criteo 52 chunks", criteo, [1024] * 52)]


def bench_one(name, x_cpu, rows, level, args):
    import torch
    import hvd_lossy

    eb, dev = args.error_bound, args.device
    x = x_cpu.to(dev)
    raw = x.numel() * x.element_size()
    if rows is None:
        comp = lambda src: hvd_lossy.compress(src, eb, level=level)  # noqa: E731
        frame = comp(x)
        frame_cpu = comp(x_cpu)
        decomp = lambda: hvd_lossy.decompress(frame)  # noqa: E731
        decomp_cpu = lambda: hvd_lossy.decompress(frame_cpu)  # noqa: E731
        nbytes = frame.numel()
        y = decomp()
        info = hvd_lossy.frame_info(frame)
        worst = (x.double() - y.double()).abs().max().item() / info["eb_abs"] if info["eb_abs"] else 0.0
    else:
        comp = lambda src: hvd_lossy.compress_chunks(src, rows, eb, level=level)  # noqa: E731
        frame, sizes = comp(x)
        frame_cpu, sizes_cpu = comp(x_cpu)
        decomp = lambda: hvd_lossy.decompress_chunks(frame, sizes)  # noqa: E731
        decomp_cpu = lambda: hvd_lossy.decompress_chunks(frame_cpu, sizes_cpu)  # noqa: E731
        nbytes = frame.numel()
        worst = 0.0  # one frame, the chunks its segments
        segments = hvd_lossy.frame_info(frame)["segments"]
        for src, out, seg in zip(torch.split(x, rows), decomp(), segments):
            if seg["eb_abs"]:
                worst = max(worst, (src.double() - out.double()).abs().max().item() / seg["eb_abs"])
    identical = bool(torch.equal(frame.cpu(), frame_cpu))
    t_c = timed(lambda: comp(x), dev, args.warmup, args.repeat)
    t_d = timed(decomp, dev, args.warmup, args.repeat)
    t_c_cpu = timed(lambda: comp(x_cpu), "cpu", 0, args.cpu_repeat)
    t_d_cpu = timed(decomp_cpu, "cpu", 0, args.cpu_repeat)
    return {"workload": name, "level": level, "error_bound_rel": eb, "chunks": len(rows) if rows else 1,
            "raw_bytes": raw, "frame_bytes": nbytes, "ratio": raw / nbytes,
            "identical_to_cpu": identical, "max_error_over_bound": worst,
            "compress_ms": t_c * 1e3, "decompress_ms": t_d * 1e3,
            "compress_GBps": raw / t_c / 1e9, "decompress_GBps": raw / t_d / 1e9,
            "cpu_compress_ms": t_c_cpu * 1e3, "cpu_decompress_ms": t_d_cpu * 1e3}


def copy_bandwidth(x_cpu, args):
    """GB/s of a device copy of the same bytes, counted once (the codec reads its input at least once)."""
    x = x_cpu.to(args.device)
    t = timed(lambda: x.clone(), args.device, args.warmup, args.repeat)
    return {"bytes": x.numel() * x.element_size(), "ms": t * 1e3,
            "GBps": x.numel() * x.element_size() / t / 1e9}


def benchmark(args, report):
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        report.stage("benchmark", ok=False, error="torch sees no CUDA device")
        return False
    sys.path.insert(0, str(REPO))
    import hvd_lossy
    from hvd_lossy import _C

    if args.device == "cuda" and not _C.WITH_CUDA:
        report.stage("benchmark", ok=False, error=f"{_C.__file__} was built without CUDA")
        return False
    runs, ok = [], True
    data = workloads(args)
    yardstick = copy_bandwidth(data[0][1], args)
    for name, x, rows in data:
        for level in args.levels:
            try:
                r = bench_one(name, x, rows, level, args)
            except Exception as e:  # keep measuring the other workloads; the failure is reported
                r = {"workload": name, "level": level, "error": f"{type(e).__name__}: {e}"}
            ok &= "error" not in r and r["identical_to_cpu"] and r["max_error_over_bound"] <= 1.0
            runs.append(r)
            report.stage("benchmark", ok=ok, device=args.device, copy=yardstick, runs=runs,
                         gpu=torch.cuda.get_device_name() if args.device == "cuda" else platform.processor())
    return ok


def frame_stage(args, report):
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        report.stage("segments", ok=False, error="torch sees no CUDA device")
        return False
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check_segments

    return gpu_check_segments.run(args, report, workloads(args), timed)


def profile(args, report):
    """Per-kernel GPU time of a few compress/decompress calls (torch.profiler, CUPTI), so that
    the slow stages can be named; the full table goes to <out>/profile.txt."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sys.path.insert(0, str(REPO))
    import hvd_lossy
    from hvd_lossy.bench.criteo import synthetic_lookups

    x = synthetic_lookups(args.synthetic_mb << 20, dim=32).to(args.device)
    lines, top = [], {}
    for level in args.levels:
        frame = hvd_lossy.compress(x, args.error_bound, level=level)
        hvd_lossy.decompress(frame)
        torch.cuda.synchronize()
        for what, fn in (("compress", lambda: hvd_lossy.compress(x, args.error_bound, level=level)),
                         ("decompress", lambda: hvd_lossy.decompress(frame))):
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            events = prof.key_averages()
            gpu_us = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)  # noqa: E731
            try:
                table = events.table(sort_by="device_time_total", row_limit=40)
            except (KeyError, AttributeError, ValueError):
                table = events.table(sort_by="cuda_time_total", row_limit=40)
            lines += [f"==== level {level} {what} (5 calls)", table]
            top[f"L{level} {what}"] = [(e.key[:60], round(gpu_us(e) / 5, 1))
                                        for e in sorted(events, key=lambda e: -gpu_us(e))[:8]]
    (report.dir / "profile.txt").write_text("\n".join(lines))
    report.stage("profile", ok=True, top_kernels_us_per_call=top)
    for k, v in top.items():
        print(f"{k}: " + ", ".join(f"{name.split('(')[0].split('::')[-1]} {us:.0f}us" for name, us in v[:6]))
    return True


def print_table(report):
    stages = report.data["stages"]
    print()
    for name, s in stages.items():
        if name not in ("benchmark", "segments"):
            print(f"{name:10} {'ok' if s.get('ok') else 'FAILED'} {s.get('summary', '')} "
                  f"{s.get('error', '')} ({s.get('seconds', '-')} s)")
    if "runs" in stages.get("segments", {}):
        sys.path.insert(0, str(REPO / "benchmarks"))
        import gpu_check_segments

        gpu_check_segments.print_table(stages["segments"])
    elif "segments" in stages:
        print(f"segments   FAILED {stages['segments'].get('error', '')}")
    b = stages.get("benchmark")
    if not b:
        print(f"results: {report.path}")
        return
    if "copy" in b:
        c = b["copy"]
        print(f"device copy of {c['bytes'] / 2**20:.0f} MiB: {c['ms']:.3f} ms, {c['GBps']:.0f} GB/s")
    print(f"{'workload':17} {'L':>1} {'ratio':>6} {'same':>4} {'err/eb':>6} {'comp ms':>8} {'GB/s':>6} "
          f"{'dec ms':>8} {'GB/s':>6} {'cpu comp':>8} {'cpu dec':>8}")
    for r in b.get("runs", []):
        if "error" in r:
            print(f"{r['workload']:17} {r['level']:>1} ERROR {r['error']}")
            continue
        print(f"{r['workload']:17} {r['level']:>1} {r['ratio']:6.2f} {'yes' if r['identical_to_cpu'] else 'NO':>4} "
              f"{r['max_error_over_bound']:6.3f} {r['compress_ms']:8.3f} {r['compress_GBps']:6.1f} "
              f"{r['decompress_ms']:8.3f} {r['decompress_GBps']:6.1f} {r['cpu_compress_ms']:8.2f} "
              f"{r['cpu_decompress_ms']:8.2f}")
    print(f"results: {report.path}")


def main(argv=None):
    args = parse_args(argv)
    report = Report(args.out)
    report.data["args"] = vars(args)
    if args.device == "cpu":
        print("dry run on the CPU codec: no build, no CUDA tests", flush=True)
        args.build, args.skip_tests = "none", True
    built = build(args, report) if args.build != "none" else True
    ok = built
    if args.device == "cuda":  # after the build, which makes build/cuda_selftest
        ok &= selftest(args, report)
    # The benchmark runs even when tests fail: its byte comparisons and timings help the diagnosis.
    if built and not args.skip_tests:
        ok &= tests(args, report)
    if built and not args.skip_bench:
        try:
            ok &= benchmark(args, report)
        except Exception as e:
            report.stage("benchmark", ok=False, error=f"{type(e).__name__}: {e}")
            ok = False
    if built and not args.skip_segments:
        try:
            ok &= frame_stage(args, report)
        except Exception as e:
            report.stage("segments", ok=False, error=f"{type(e).__name__}: {e}")
            ok = False
    if built and args.device == "cuda" and args.profile:
        try:
            profile(args, report)
        except Exception as e:
            report.stage("profile", ok=False, error=f"{type(e).__name__}: {e}")
    if args.device == "cuda" and args.sanitize:
        ok &= sanitize(args, report)
    report.data["ok"] = bool(ok)
    report.save()
    print_table(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
