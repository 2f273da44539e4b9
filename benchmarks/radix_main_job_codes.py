"""Why radix packing barely moves the README main job's all-to-all (issue #10): the level-1 codes
that job actually sends, and what each way of packing them would cost.

    python benchmarks/radix_main_job_codes.py [--json benchmarks/results/radix_main_job_codes.json]

Runs the main job's adaptive training over shared memory (scripts/run_main.sh section 2: 2 ranks
under mpirun, --level 1) with a hook that saves every format-2 frame the all-to-all sends, then
reads each level-1 code section back to its codes and sizes them, forward (lookups) and backward
(dithered gradients) apart:
  sent            the code sections as sent (this checkout: radix where it pays)
  block           block packing (frame.h "Packed integer arrays")
  radix_global    the smaller of block packing and one radix section (frame.h "Radix section",
                  K = largest code + 1 of the segment): what this checkout's encoder does
  short           the smallest of those and short blocks (frame.h "Short-block section":
                  blocks of 16 codes, 4-bit widths): what the encoder does since short blocks
  radix_per_P     an upper estimate of a per-piece radix: every P codes their own K (one byte)
                  and g, or block packing, whichever is smaller (not a format, a bound)
  entropy_order0  the codes' order-0 entropy (what level 2's rANS approaches)
and the codes' K: radix saves log2 of the power of two above K over log2 K only when the codes
fill [0, K); trained embeddings and gradients are peaked with long tails, so K is set by a few
codes while per-block widths (block packing) already follow the typical ones.
"""
import argparse
import collections
import glob
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hvd_lossy import _C  # noqa: E402
from hvd_lossy.bench.frame_bytes import varint_at  # noqa: E402
HOOK = '''
import builtins, os
_dir, _n, _imp = os.environ["RADIX_FRAMES_DIR"], [0], builtins.__import__
def _install():
    import hvd_lossy
    orig = hvd_lossy.compress_grouped
    def hooked(tensor, rows, error_bounds, groups, prefix_bytes, out, offset=0, *a, **kw):
        r = orig(tensor, rows, error_bounds, groups, prefix_bytes, out, offset, *a, **kw)
        if kw.get("format") == 2 and isinstance(r, tuple) and out.device.type == "cpu":
            data, at = out.numpy().tobytes(), offset
            for size in r[1]:
                at += prefix_bytes
                if size:
                    with open(os.path.join(_dir, f"{os.getpid()}_{_n[0]}.bin"), "wb") as f:
                        f.write(data[at:at + size])
                    _n[0] += 1
                at += size
        return r
    hvd_lossy.compress_grouped = hooked
def _hook(name, *a, **kw):
    m = _imp(name, *a, **kw)
    if name == "hvd_lossy":
        builtins.__import__ = _imp
        _install()
    return m
builtins.__import__ = _hook
'''
ARGS = ["--data", "data/criteo_kaggle_sample", "--seed", "0", "--compression", "adaptive",
        "--error-bound", "0.03", "--backward-error-bound", "0.02", "--dither", "backward",
        "--level", "1"]


def capture(frames_dir, hook_dir):
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{hook_dir}", OMP_NUM_THREADS="1",
               RADIX_FRAMES_DIR=str(frames_dir), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", "2", "--mca", "btl", "self,tcp", "--mca",
           "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", "-x", "OMP_NUM_THREADS",
           "-x", "PYTHONPATH", "-x", "RADIX_FRAMES_DIR", sys.executable, "examples/dlrm/train.py",
           *ARGS, "--metrics-out", str(frames_dir / "metrics.json")]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=1200)
    return json.loads((frames_dir / "metrics.json").read_text())


def unpack_blocks(data, n):
    nb = -(-n // 32)
    widths = np.frombuffer(data[:nb], dtype=np.uint8)
    out, at = [], nb
    shifts = np.arange(32, dtype=np.uint64)
    for w in widths.tolist():
        planes = np.frombuffer(data[at:at + 4 * w], dtype="<u4").astype(np.uint64)
        at += 4 * w
        bits = (planes[:, None] >> shifts[None, :]) & 1  # (w, 32)
        out.append((bits << np.arange(w, dtype=np.uint64)[:, None]).sum(0))
    return np.concatenate(out)[:n].astype(np.int64) if out else np.zeros(0, np.int64)


def unpack_short(data, n):
    """frame.h "Short-block section": the mark, width nibbles, uint16 planes a block of 16."""
    nb = -(-n // 16)
    nib = np.frombuffer(data[1:1 + -(-nb // 2)], dtype=np.uint8)
    widths = np.stack([nib & 15, nib >> 4], 1).reshape(-1)[:nb]
    out, at = [], 1 + -(-nb // 2)
    shifts = np.arange(16, dtype=np.uint64)
    for w in widths.tolist():
        planes = np.frombuffer(data[at:at + 2 * w], dtype="<u2").astype(np.uint64)
        at += 2 * w
        bits = (planes[:, None] >> shifts[None, :]) & 1  # (w, 16)
        out.append((bits << np.arange(w, dtype=np.uint64)[:, None]).sum(0))
    return np.concatenate(out)[:n].astype(np.int64)


def short_bytes(c):
    if int(c.max()) >= 1 << 15:
        return None
    nb = -(-len(c) // 16)
    pad = np.zeros(nb * 16, dtype=np.int64)
    pad[:len(c)] = c
    m = pad.reshape(nb, 16).max(1)
    return 1 + -(-nb // 2) + 2 * int(sum(int(x).bit_length() for x in m))


def codes_of(code, n):
    if code[0] == 0xFD:
        return unpack_short(code, n)
    if code[0] != 0xFF:
        return unpack_blocks(code, n)
    k, at = varint_at(code, 1)
    g, at = varint_at(code, at)
    G = -(-n // g)
    v = unpack_blocks(code[at:], G)
    out = np.zeros(g * G, dtype=np.int64)
    for base in range(0, G, 2048):  # frame.h: spans of 2048 values, g lanes each
        span = min(G - base, 2048)
        w = v[base:base + span]
        for i in range(g):
            out[base * g + i * span:base * g + (i + 1) * span] = w % k
            w = w // k
    return out[:n]


def block_bytes(c):
    nb = -(-len(c) // 32)
    pad = np.zeros(nb * 32, dtype=np.int64)
    pad[:len(c)] = c
    m = pad.reshape(nb, 32).max(1)
    return nb + 4 * int(sum(int(x).bit_length() for x in m))


def radix_bytes(c, head):
    k = int(c.max()) + 1
    if k < 3 or k > 65535 or k & (k - 1) == 0:
        return None
    n = len(c)
    g = _C.radix_group(k, n)  # the codec's own rule (frame_v2_codec.h)
    G = -(-n // g)
    cc = np.zeros(g * G, dtype=np.int64)
    cc[:n] = c
    vals = np.zeros(G, dtype=np.int64)
    for base in range(0, G, 2048):
        span = min(G - base, 2048)
        for i in reversed(range(g)):
            lane = cc[base * g + i * span:base * g + (i + 1) * span]
            vals[base:base + span] = vals[base:base + span] * k + lane
    return head + block_bytes(vals)


def analyse(frames_dir):
    import torch

    import hvd_lossy
    tot = collections.Counter()
    ks = {"fwd": collections.Counter(), "bwd": collections.Counter()}
    for path in sorted(glob.glob(str(frames_dir / "*.bin"))):
        data = pathlib.Path(path).read_bytes()
        info = hvd_lossy.frame_info(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        segs = info["segments"]
        kind = "bwd" if any(s["dither_seed"] is not None for s in segs) else "fwd"
        tot[f"{kind} frame_bytes"] += len(data)
        at = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                        - s["outlier_bytes"] for s in segs)
        for s in segs:
            at += s["map_bytes"]
            code = data[at:at + s["code_bytes"]]
            at += s["code_bytes"] + s["outlier_bytes"]
            n = s["n_unique"] * s["row_len"]
            if n == 0 or s["lossless"] or s["level"] != 1:
                continue
            c = codes_of(code, n)
            b = block_bytes(c)
            r = radix_bytes(c, 3)
            tot[f"{kind} codes"] += n
            tot[f"{kind} sent"] += s["code_bytes"]
            tot[f"{kind} block"] += b
            tot[f"{kind} radix_global"] += min(b, r or b)
            sb = short_bytes(c)
            tot[f"{kind} short"] += min(b, r or b, sb or b)
            for P in (64, 256):
                est = 0
                for a in range(0, n, P):
                    p = c[a:a + P]
                    pb, pr = block_bytes(p), radix_bytes(p, 1)
                    est += min(pb, pr or pb)
                tot[f"{kind} radix_per_{P}"] += est
            cnt = np.bincount(c)
            cnt = cnt[cnt > 0]
            tot[f"{kind} entropy_order0"] += float(-(cnt * np.log2(cnt / n)).sum() / 8)
            ks[kind][int(c.max()) + 1] += n
    return tot, ks


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        frames_dir, hook_dir = pathlib.Path(tmp) / "frames", pathlib.Path(tmp) / "hook"
        frames_dir.mkdir()
        hook_dir.mkdir()
        metrics = capture(frames_dir, hook_dir)
        tot, ks = analyse(frames_dir)
    res = {"benchmark": "radix_main_job_codes", "all_to_all_ratio": metrics["compression_ratio"],
           "a2a_bytes_sent": metrics["a2a_bytes_sent"], "auc": metrics["auc"], "bytes": dict(tot),
           "codes_by_K": {kind: dict(sorted(c.items())) for kind, c in ks.items()}}
    print(f"main job: all-to-all x{metrics['compression_ratio']:.3f}, {metrics['a2a_bytes_sent']} B sent,"
          f" AUC {metrics['auc']!r}")
    for kind in ("fwd", "bwd"):
        n = tot[f"{kind} codes"]
        print(f"{kind}: {tot[f'{kind} frame_bytes']:.0f} B of frames, {n} level-1 codes")
        for name in ("sent", "block", "radix_global", "short", "radix_per_64", "radix_per_256",
                     "entropy_order0"):
            v = tot[f"{kind} {name}"]
            print(f"  {name:15} {v:10.0f} B  {8 * v / n:5.2f} bits a code  "
                  f"{v / tot[f'{kind} block'] - 1:+6.1%} vs block")
        c = ks[kind]
        mean_k = sum(k * m for k, m in c.items()) / max(1, sum(c.values()))
        print(f"  K (largest code + 1) of its segments: {min(c)}..{max(c)}, code-weighted mean {mean_k:.1f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
