"""The frames and decode-limit stage of benchmarks/gpu_check.py (issues #10, #12 and #22).

For each workload (synthetic, criteo, criteo 52 chunks) and level, on --device:
  bytes      the device's frame (compress_chunks of the device tensor: one frame, the chunks its
             segments) against the CPU codec's, byte for byte (level 1 runs the CUDA encoder,
             native/cuda/; level 2 goes through the CPU codec, where the comparison holds by
             construction).
  cross      CUDA decode of the CPU's frame and CPU decode of the device's frame, bit-exact
             against the CPU decode of the CPU's frame.
  timing     compress, decompress and the device checksum (verify_cuda: CRC32C over the frame)
             with CUDA events, medians of --repeat.
Radix sections (frame.h "Radix section", level 1): frames with radix-packed segments (K = 17
with a row map, K = 5 and 295, outliers, a 175-code segment whose last value pads) decoded on
--device bit-exact against the CPU, and sealed frames with a value >= K^g, a nonzero padding
digit or K = 16 that must raise FrameError there.
The encoder part: the CUDA encoder's frames against the CPU's, byte for byte, on inputs chosen
for each of its paths (shapes from 0-d to 3-d, the three dtypes, abs and rel bounds, pieces of 0
rows, duplicate-heavy rows with a map, outliers with NaN/Inf, lossless segments, radix- and
short-block-friendly codes, codes too wide for short blocks), the all-to-all's grouped layout
with a prefix and the protocol extension, and the lossless fallback; each also decoded on the
device bit-exact against the CPU decode, and its encode timed with CUDA events.
And once, the limits: a corrupt frame announcing 64 GiB and one announcing 2^40 rows must
raise FrameError naming the CRC32C, and a sealed frame of 4 TiB must raise FrameError naming
max_output_bytes, each without growing device memory (torch's peak and the driver's free memory,
both before and after).
"""
import pathlib
import re
import struct
import sys

from hvd_lossy._bytes import uvarint as _varint

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _crc32c(ptr, n):
    """CRC32C of n bytes at ptr by the test hooks (tests/_hooks.py builds them; the shipped _C
    has no checksum entry point), to seal forged frames so that the checks behind them run."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests._hooks import hooks
    return hooks().crc32c(ptr, n)


def _sealed(frame, torch, _C):
    frame = frame.clone()
    c = _crc32c(frame.data_ptr() + 7, frame.numel() - 7)
    frame[3:7] = torch.tensor(list(c.to_bytes(4, "little")), dtype=torch.uint8)
    return frame


def forged_frames(torch, _C, device):
    """(name, frame on the CPU, a regex the refusal's message must match)."""
    def n_by_n(n, sealed):
        """n x n float32 in one lossy segment of one unique row of zeros: a few KiB, every size
        field consistent, 4 n^2 bytes of output announced."""
        blocks = bytes(n // 32)  # map and code sections: all blocks of width 0
        body = (bytes([2 << 2]) + _varint(n) + _varint(1) + bytes([0x04]) + _varint(n)
                + bytes([0, 0, 0x3C]) + _varint(1) + _varint(len(blocks)) + blocks + blocks)
        size = 8 + len(body)
        size += len(_varint(size)) - 1
        f = torch.frombuffer(bytearray(b"HV\x02" + bytes(4) + _varint(size) + body),
                             dtype=torch.uint8)
        return _sealed(f, torch, _C) if sealed else f

    # f32, ndim 2, trailing 32, one lossless level-1 segment of 2^40 rows, a 1-byte code
    # section, and a CRC that does not match.
    body = bytes([2 << 2]) + bytes([32, 1, 0x02]) + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x20]) \
        + bytes([1, 0])
    total = 7 + 1 + len(body)
    rows_2_40 = torch.frombuffer(bytearray(b"HV\x02" + struct.pack("<I", 0x12345678) + bytes([total]) + body),
                          dtype=torch.uint8)
    return [("corrupt, 64 GiB announced", n_by_n(1 << 17, False), "CRC32C"),
            # The CPU decoder parses a header before its CRC (sizes checked against the bytes
            # present); the CUDA one verifies the CRC first, on the device.
            ("corrupt, 2^40 rows announced", rows_2_40, "CRC32C" if device == "cuda" else "CRC32C|too small"),
            ("sealed, 4 TiB announced", n_by_n(1 << 20, True), "max_output_bytes")]


def _memory(torch, device):
    if device != "cuda":
        return None, None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.mem_get_info()[0]


def limits(torch, hvd_lossy, _C, device):
    out, ok = [], True
    for name, frame, expect in forged_frames(torch, _C, device):
        frame = frame.to(device)
        # The limit stays the default for the sealed frame (it is what must refuse it) and is
        # raised past the corrupt ones' sizes (only their checksums may refuse them).
        limit = None if expect == "max_output_bytes" else 1 << 50
        for what, call in (("decompress", lambda: hvd_lossy.decompress(frame, max_output_bytes=limit)),
                           ("decompress_chunks",
                            lambda: hvd_lossy.decompress_chunks(frame, max_output_bytes=limit))):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            peak0, free0 = _memory(torch, device)
            try:
                call()
                verdict = "decoded (expected FrameError)"
            except hvd_lossy.FrameError as e:
                verdict = "" if re.search(expect, str(e)) and type(e) is hvd_lossy.FrameError else f"wrong error: {e}"
            except Exception as e:  # an allocation failure is what this check exists to catch
                verdict = f"{type(e).__name__}: {e}"
            peak1, free1 = _memory(torch, device)
            grew = None if peak0 is None else {"torch_peak_bytes": peak1 - peak0, "free_drop_bytes": free0 - free1}
            good = not verdict and (grew is None or (grew["torch_peak_bytes"] < 1 << 20
                                                     and grew["free_drop_bytes"] < 256 << 20))
            ok &= good
            out.append({"frame": name, "call": what, "ok": good, "error": verdict, "memory_growth": grew})
    return ok, out


def _block_packed(values):
    """frame.h "Packed integer arrays" of the values (tests/test_radix.py has the same)."""
    values = list(values) + [0] * (-len(values) % 32)
    blocks = [values[i:i + 32] for i in range(0, len(values), 32)]
    widths = bytes(max(b).bit_length() for b in blocks)
    payload = b"".join(struct.pack("<I", sum(((v >> j) & 1) << i for i, v in enumerate(b)))
                       for w, b in zip(widths, blocks) for j in range(w))
    return widths + payload


def _sealed_radix(torch, _C, k, g, values):
    """An f32 frame of one 4 x 8 lossy level-1 segment (abs bound 0.5) whose code section is
    the radix section of K = k, groups of g, these values."""
    code = b"\xff" + _varint(k) + _varint(g) + _block_packed(values)
    body = bytes([2 << 2, 8, 1, 0, 4, 0x00, 0x00, 0x3F]) + _varint(len(code)) + code
    total = 7 + len(_varint(7 + 2 + len(body))) + len(body)
    rest = _varint(total) + body
    buf = torch.frombuffer(bytearray(rest), dtype=torch.uint8)
    crc = _crc32c(buf.data_ptr(), len(rest))
    return torch.frombuffer(bytearray(b"HV\x02" + struct.pack("<I", crc) + rest), dtype=torch.uint8)


def radix(torch, hvd_lossy, _C, device):
    """(ok, rows of the report) of the radix part, on device."""
    g = torch.Generator().manual_seed(30)
    u = (torch.rand(96, 16, generator=g) - 0.5) * 0.1
    specials = u.clone()
    specials.view(-1)[[5, 77, 300, 901]] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38])
    frames = [
        ("K 17, row map", hvd_lossy.compress_chunks(u[torch.arange(96) % 40], [64, 32], 0.03,
                                                    level=1)[0]),
        ("K 5 and 295", hvd_lossy.compress_chunks(u, [48, 48], [0.12, 0.0017], level=1)[0]),
        ("outliers", hvd_lossy.compress_chunks(specials, [50, 46], 0.003, mode="abs",
                                               level=1)[0]),
        ("175 codes, padded", hvd_lossy.compress_chunks(u.flatten()[:175].contiguous(), [175], 0.03,
                                                       level=1)[0]),
    ]
    bits = lambda t: t.view(torch.int32)  # noqa: E731
    out, ok = [], True
    for name, frame in frames:
        segs = hvd_lossy.frame_info(frame)["segments"]
        r = {"frame": name, "radix": [s["radix"] for s in segs]}
        try:
            ref = hvd_lossy.decompress(frame)
            got = hvd_lossy.decompress(frame.to(device)).cpu()
            r["ok"] = any(r["radix"]) and bool(torch.equal(bits(got), bits(ref)))
        except Exception as e:
            r["ok"], r["error"] = False, f"{type(e).__name__}: {e}"
        ok &= r["ok"]
        out.append(r)
    too_big = [0] * 5
    too_big[2] = 17 ** 7
    padded = [0] * 5
    padded[2] = 17 ** 6  # digit 6 of value 2: code 32 of 32
    for name, frame in (("value >= K^g", _sealed_radix(torch, _C, 17, 7, too_big)),
                        ("nonzero padding digit", _sealed_radix(torch, _C, 17, 7, padded)),
                        ("K a power of two", _sealed_radix(torch, _C, 16, 8, [0] * 4))):
        try:
            hvd_lossy.decompress(frame.to(device))
            r = {"frame": name, "ok": False, "error": "decoded (expected FrameError)"}
        except hvd_lossy.FrameError:
            r = {"frame": name, "ok": True}
        except Exception as e:
            r = {"frame": name, "ok": False, "error": f"{type(e).__name__}: {e}"}
        ok &= r["ok"]
        out.append(r)
    return ok, out


def encoder_cases(torch):
    """(name, CPU tensor, rows or None for compress(), bounds, mode)."""
    g = torch.Generator().manual_seed(40)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    scaled = rn(512, 64) * (2.0 ** torch.randint(0, 9, (512, 1), generator=g))
    hot = rn(64, 32)[torch.randint(0, 64, (4096,), generator=g)]
    specials = rn(300, 24)
    specials.view(-1)[[3, 50, 700, 4000]] = torch.tensor([float("nan"), float("inf"),
                                                          -float("inf"), 1e30])
    uniform = (torch.rand(2000, 32, generator=g) - 0.5) * 0.1
    return [
        ("0-d", torch.tensor(1.25), None, 0.01, "rel"),
        ("1-d", rn(1000), None, 0.01, "rel"),
        ("3-d", rn(8, 16, 12), None, 1e-3, "abs"),
        ("scaled rows (short blocks)", scaled, [100, 0, 412], [0.5, 0.1, 0.5], "abs"),
        ("hot rows (map)", hot, [4096], 0.01, "rel"),
        ("outliers NaN/Inf", specials, [150, 150], [1e-3, 0.01], "abs"),
        ("uniform (radix K 17)", uniform, [1000, 1000], [0.03, 0.012], "rel"),
        ("lossless and lossy", rn(256, 16), [100, 156], [0.0, 0.02], "rel"),
        ("wide codes", rn(256, 16) * 1e4, [256], 1e-3, "abs"),
        ("most outliers (lossless)", rn(64, 8) * 1e30, [64], 0.01, "abs"),
        ("float16", scaled.half(), [512], 0.05, "rel"),
        ("bfloat16", hot.bfloat16(), [1000, 3096], 0.02, "rel"),
    ]


def encoder(torch, hvd_lossy, _C, device, timed, args):
    """(ok, rows of the report) of the encoder part."""
    out, ok = [], True
    bits = lambda t: t.reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.int16)  # noqa: E731
    for name, x, rows, ebs, mode in encoder_cases(torch):
        r = {"case": name, "dtype": str(x.dtype).replace("torch.", "")}
        try:
            xd = x.to(device)
            if rows is None:
                enc = lambda t: hvd_lossy.compress(t, ebs, mode=mode, level=1)  # noqa: E731
            else:
                enc = lambda t: hvd_lossy.compress_chunks(t, rows, ebs, mode=mode, level=1)[0]  # noqa: E731
            cpu, dev = enc(x), enc(xd)
            r["bytes"] = cpu.numel()
            r["identical"] = bool(torch.equal(dev.cpu(), cpu))
            if not r["identical"] and dev.numel() == cpu.numel():
                r["first_difference"] = int((dev.cpu() != cpu).nonzero()[0])
            r["packings"] = [("radix" if s.get("radix") else "short" if s.get("short_blocks")
                              else "block") for s in hvd_lossy.frame_info(cpu).get("segments", [])]
            ref = hvd_lossy.decompress_chunks(cpu)
            got = hvd_lossy.decompress_chunks(dev)
            r["decodes"] = all(torch.equal(bits(a.cpu()), bits(b)) for a, b in zip(got, ref))
            r["encode_ms"] = timed(lambda: enc(xd), device, args.warmup, args.repeat) * 1e3
            r["ok"] = r["identical"] and r["decodes"]
        except Exception as e:
            r["ok"], r["error"] = False, f"{type(e).__name__}: {e}"
        ok &= r["ok"]
        out.append(r)
    # The all-to-all's layout: groups with a prefix before each and the protocol extension.
    x = torch.randn(600, 32, generator=torch.Generator().manual_seed(41))
    args_ = ([100, 0, 250, 250], [0.01, 0.02, 0.0, 0.05], [2, 0, 2], 5)
    r = {"case": "grouped with prefix and extension"}
    try:
        bufs = []
        for t in (x, x.to(device)):
            cap = 5 * 3 + hvd_lossy.max_grouped_bytes(args_[0], [32], args_[2], 5)
            buf = torch.full((cap,), 0xAB, dtype=torch.uint8, device=t.device)
            got = hvd_lossy.compress_grouped(t, args_[0], args_[1], args_[2], args_[3], buf, 0,
                                             level=1, extension=b"\x01\x02\x03")
            bufs.append((buf.cpu(), got))
        r["identical"] = bool(torch.equal(bufs[0][0], bufs[1][0])) and bufs[0][1] == bufs[1][1]
        r["ok"] = r["identical"]
    except Exception as e:
        r["ok"], r["error"] = False, f"{type(e).__name__}: {e}"
    ok &= r["ok"]
    out.append(r)
    return ok, out


def one(name, x_cpu, rows, level, args, timed, torch, hvd_lossy, _C):
    eb, dev = args.error_bound, args.device
    rows = rows or [x_cpu.shape[0]]
    x = x_cpu.to(dev)
    cpu_frame, _ = hvd_lossy.compress_chunks(x_cpu, rows, eb, level=level)
    dev_frame, _ = hvd_lossy.compress_chunks(x, rows, eb, level=level)
    ref = torch.cat([y.flatten() for y in hvd_lossy.decompress_chunks(cpu_frame)])

    def decoded(frame):
        return torch.cat([y.flatten() for y in hvd_lossy.decompress_chunks(frame)]).cpu()

    bits = lambda t: t.view(torch.int32 if t.element_size() == 4 else torch.int16)  # noqa: E731
    r = {"workload": name, "level": level, "frame_bytes": dev_frame.numel(),
         "ratio": x_cpu.numel() * x_cpu.element_size() / dev_frame.numel(),
         "bytes_identical_to_cpu": bool(torch.equal(dev_frame.cpu(), cpu_frame)),
         "device_decodes_cpu_frame": bool(torch.equal(bits(decoded(cpu_frame.to(dev))), bits(ref))),
         "cpu_decodes_device_frame": bool(torch.equal(bits(decoded(dev_frame.cpu())), bits(ref)))}
    r["compress_ms"] = timed(lambda: hvd_lossy.compress_chunks(x, rows, eb, level=level),
                             dev, args.warmup, args.repeat) * 1e3
    r["decompress_ms"] = timed(lambda: hvd_lossy.decompress_chunks(dev_frame), dev, args.warmup,
                               args.repeat) * 1e3
    if dev == "cuda":
        stream = torch.cuda.current_stream().cuda_stream
        verify = lambda: _C.verify_cuda(dev_frame.data_ptr(), dev_frame.numel(), stream)  # noqa: E731
        t = timed(verify, dev, args.warmup, args.repeat)
        r["verify_ms"], r["verify_GBps"] = t * 1e3, dev_frame.numel() / t / 1e9
    r["ok"] = r["bytes_identical_to_cpu"] and r["device_decodes_cpu_frame"] and r["cpu_decodes_device_frame"]
    return r


def run(args, report, data, timed):
    """The stage; data is gpu_check.workloads(args), timed its CUDA-event timer."""
    import torch
    import hvd_lossy
    from hvd_lossy import _C

    ok, runs = True, []
    lim_ok, lim = limits(torch, hvd_lossy, _C, args.device)
    rad_ok, rad = radix(torch, hvd_lossy, _C, args.device)
    enc_ok, enc = encoder(torch, hvd_lossy, _C, args.device, timed, args)
    ok &= lim_ok and rad_ok and enc_ok
    report.stage("segments", ok=ok, device=args.device, limits=lim, radix=rad, encoder=enc, runs=runs)
    for name, x, rows in data:
        for level in args.levels:
            try:
                r = one(name, x, rows, level, args, timed, torch, hvd_lossy, _C)
            except Exception as e:  # keep checking the others; the failure is reported
                r = {"workload": name, "level": level, "ok": False, "error": f"{type(e).__name__}: {e}"}
            ok &= r["ok"]
            runs.append(r)
            report.stage("segments", ok=ok, device=args.device, limits=lim, radix=rad, encoder=enc,
                         runs=runs)
    return ok


def print_table(stage):
    print(f"segments stage: {'ok' if stage.get('ok') else 'FAILED'}")
    for lim in stage.get("limits", []):
        print(f"  {lim['frame']:32} {lim['call']:17} {'ok' if lim['ok'] else 'FAILED'} "
              f"{lim['error']} {lim['memory_growth'] or ''}")
    for r in stage.get("radix", []):
        print(f"  radix: {r['frame']:24} {'ok' if r['ok'] else 'FAILED'} {r.get('radix', '')} "
              f"{r.get('error', '')}")
    for r in stage.get("encoder", []):
        print(f"  encoder: {r['case']:34} {'ok' if r['ok'] else 'FAILED'} "
              f"{r.get('packings', '')} {r.get('encode_ms', float('nan')):8.3f} ms "
              f"{r.get('error', '')}{' first difference at byte %d' % r['first_difference'] if 'first_difference' in r else ''}")
    print(f"  {'workload':17} {'L':>1} {'ratio':>6} {'same':>4} {'x-dec':>5} {'comp ms':>8} {'dec ms':>8} "
          f"{'crc ms':>7} {'crc GB/s':>8}")
    for r in stage.get("runs", []):
        if "error" in r:
            print(f"  {r['workload']:17} {r['level']:>1} ERROR {r['error']}")
            continue
        cross = r["device_decodes_cpu_frame"] and r["cpu_decodes_device_frame"]
        print(f"  {r['workload']:17} {r['level']:>1} {r['ratio']:6.2f} "
              f"{'yes' if r['bytes_identical_to_cpu'] else 'NO':>4} {'yes' if cross else 'NO':>5} "
              f"{r['compress_ms']:8.3f} {r['decompress_ms']:8.3f} {r.get('verify_ms', float('nan')):7.3f} "
              f"{r.get('verify_GBps', float('nan')):8.1f}")
