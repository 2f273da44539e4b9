"""Writes a seed corpus of valid hvd_lossy frames for the decoder fuzzers.

One file per frame, named after what it exercises, so the fuzzers start from every kind of
section the decoder parses: levels 1 and 2 (one and several rANS streams, escaped codes), the
three dtypes, rel and abs bounds, duplicate rows (row map), dither, outliers (NaN, +-Inf, values beyond
the quantizer's range), lossless frames, empty tensors, 0-d and 1-d tensors. With --chunks it also
writes buffers of back-to-back frames for the Python harness's split_frames.

Usage: python fuzz/make_seeds.py OUT_DIR [--chunks] [--max-bytes 8192]
"""
import argparse
from pathlib import Path

import torch

import hvd_lossy


def _lookups(rows, dim, dtype, seed, distinct=None):
    """Embedding-like rows; with `distinct`, only that many different rows (hot lookups)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * 0.05
    if distinct:
        x = x[torch.randint(0, distinct, (rows,), generator=g) % rows]
    return x.to(dtype)


def _with_specials(x):
    x = x.clone()
    flat = x.view(-1)
    for i, v in enumerate([float("nan"), float("inf"), -float("inf"), 3e38, -1e-40]):
        if i < flat.numel():
            flat[(7 * i + 3) % flat.numel()] = v
    return x


def frames():
    """Yields (name, frame) pairs of one-segment frames covering every section kind."""
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    for dname, dtype in dtypes.items():
        for level in (1, 2):
            x = _lookups(64, 16, dtype, seed=level)
            yield f"{dname}_rel003_l{level}", hvd_lossy.compress(x, 0.03, level=level)
            yield f"{dname}_abs001_l{level}", hvd_lossy.compress(x, 0.001, mode="abs", level=level)
            dup = _lookups(96, 16, dtype, seed=10 + level, distinct=7)
            yield f"{dname}_dedup_l{level}", hvd_lossy.compress(dup, 0.01, level=level)
            yield f"{dname}_nodedup_l{level}", hvd_lossy.compress(dup, 0.01, level=level, dedup=False)
            yield f"{dname}_outliers_l{level}", hvd_lossy.compress(_with_specials(x), 0.05, level=level)
            yield f"{dname}_dedup_outliers_l{level}", hvd_lossy.compress(_with_specials(dup), 0.02,
                                                                         level=level)
            yield f"{dname}_dither_l{level}", hvd_lossy.compress(_with_specials(x), 0.03, level=level,
                                                                 dither=1234 + level)
            yield f"{dname}_lossless_l{level}", hvd_lossy.compress(x[:8], 0.0, level=level)
        yield f"{dname}_1d", hvd_lossy.compress(_lookups(1, 40, dtype, seed=3).view(-1), 0.02)
        yield f"{dname}_0d", hvd_lossy.compress(torch.tensor(1.5, dtype=dtype), 0.1)
        yield f"{dname}_empty_rows", hvd_lossy.compress(torch.empty(0, 16, dtype=dtype), 0.01)
        yield f"{dname}_empty_1d", hvd_lossy.compress(torch.empty(0, dtype=dtype), 0.01)
        yield f"{dname}_zero_len_rows", hvd_lossy.compress(torch.empty(5, 0, dtype=dtype), 0.01)
        yield f"{dname}_3d", hvd_lossy.compress(_lookups(24, 8, dtype, seed=4).view(3, 8, 8), 0.02,
                                                level=2)
        yield f"{dname}_constant", hvd_lossy.compress(torch.full((16, 8), 2.0, dtype=dtype), 0.01)
        yield f"{dname}_all_nan", hvd_lossy.compress(torch.full((4, 4), float("nan"), dtype=dtype), 0.01)
    # Several rANS streams (4096 codes each) and escaped codes (zigzag >= 255): a tight bound.
    x = _lookups(160, 64, torch.float32, seed=5)
    yield "f32_l2_streams", hvd_lossy.compress(x, 0.02, level=2)
    sparse = torch.zeros(64, 64)
    sparse.view(-1)[::97] = 10.0  # mostly code 0, a few codes of 1000: escapes (symbol 255)
    yield "f32_l2_escapes", hvd_lossy.compress(sparse + 0.001 * x[:64], 0.005, mode="abs", level=2)
    yield "f32_l2_lossless_zeros", hvd_lossy.compress(torch.zeros(64, 64), 0.0, level=2, dedup=False)
    yield "f16_l2_streams_dedup", hvd_lossy.compress(
        _lookups(400, 32, torch.float16, seed=6, distinct=200), 0.03, level=2)
    # Sections big enough for the decoder's multithreaded paths: more than 4096 packed blocks,
    # more than 8 rANS streams, more than 65536 codes to dequantize.
    yield "f32_l1_many_blocks", hvd_lossy.compress(torch.zeros(4100 * 32), 0.1, mode="abs", level=1)
    many = torch.zeros(300, 256)
    many.view(-1)[::301] = 1.0
    yield "f32_l2_many_streams", hvd_lossy.compress(many, 0.1, mode="abs", level=2, dedup=False)
    # Wide codes: level-1 blocks of many bit planes.
    yield "f32_l1_wide", hvd_lossy.compress(_lookups(8, 32, torch.float32, seed=7), 1e-7, mode="abs")


def segmented_frames():
    """Yields (name, frame) pairs of frames of several segments with their own bounds,
    levels, coded and packed maps, outliers, lossless and dithered segments, 0-d and 1-d."""
    for dname, dtype in {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}.items():
        x = _with_specials(_lookups(96, 16, dtype, seed=20, distinct=9))
        for level in (1, 2):
            buf, _ = hvd_lossy.compress_chunks(x, [30, 0, 40, 26], [0.03, 0.01, 0.0, 0.002],
                                               level=level)
            yield f"seg_{dname}_segments_l{level}", buf
            buf, _ = hvd_lossy.compress_chunks(x, [48, 48], 0.02, level=level, dither=99)
            yield f"seg_{dname}_dither_l{level}", buf
        hot = _lookups(8, 8, dtype, seed=21)[[0 if i % 4 else i % 8 for i in range(400)]]
        yield f"seg_{dname}_coded_map", hvd_lossy.compress_chunks(hot, [200, 200], 0.03,
                                                                level=2)[0]
        phi = (5 ** 0.5 - 1) / 2  # many distinct rows, skewed repeats: a bucketed map
        skewed = _lookups(120, 8, dtype, seed=23)[[int(120 * ((i * phi) % 1) ** 3)
                                                   for i in range(300)]]
        yield f"seg_{dname}_bucketed_map", hvd_lossy.compress_chunks(skewed, [150, 150], 0.03,
                                                                   level=2)[0]
        yield f"seg_{dname}_1d", hvd_lossy.compress_chunks(_lookups(1, 40, dtype, seed=3).view(-1),
                                                         [25, 15], 0.02)[0]
        yield f"seg_{dname}_0d", hvd_lossy.compress(torch.tensor(1.5, dtype=dtype), 0.1)
        yield f"seg_{dname}_3d", hvd_lossy.compress(_lookups(24, 8, dtype, seed=4).view(3, 8, 8),
                                                   0.02, level=2)
    yield "seg_f32_l2_streams", hvd_lossy.compress(_lookups(160, 64, torch.float32, seed=5), 0.02,
                                                  level=2)
    yield "seg_f32_empty", hvd_lossy.compress_chunks(torch.empty(0, 4), [0, 0], 0.1)[0]
    yield from radix_frames()
    yield from short_frames()
    yield from ext_frames()


def radix_frames():
    """Yields (name, frame) pairs of frames with radix-packed level-1 code sections
    (frame.h "Radix section"): codes uniform below K = 17 (rel bound 0.03 of a uniform range),
    other K, few codes (one value block, padding digits), outliers, dither, a row map."""
    g = torch.Generator().manual_seed(30)
    u = (torch.rand(96, 16, generator=g) - 0.5) * 0.1
    yield "seg_radix_k17", hvd_lossy.compress_chunks(u, [64, 32], 0.03, level=1)[0]
    yield "seg_radix_k5_k300", hvd_lossy.compress_chunks(u, [48, 48], [0.12, 0.0017], mode="rel",
                                                        level=1)[0]
    yield "seg_radix_few_codes_1d", hvd_lossy.compress_chunks(u.flatten()[:47].contiguous(), [47],
                                                             0.03, level=1)[0]
    yield "seg_radix_outliers", hvd_lossy.compress_chunks(_with_specials(u), [50, 46], 0.003,
                                                         mode="abs", level=1)[0]
    yield "seg_radix_dither_bf16", hvd_lossy.compress_chunks(u.to(torch.bfloat16), [96], 0.03,
                                                            level=1, dither=7)[0]
    yield "seg_radix_map", hvd_lossy.compress_chunks(u[torch.arange(96) % 40], [96], 0.03,
                                                    level=1)[0]


def short_frames():
    """Yields (name, frame) pairs of frames with short-block level-1 code sections
    (frame.h "Short-block section"): rows whose scale changes from row to row, an odd number of
    blocks (a padding nibble), outliers, dither, a row map."""
    g = torch.Generator().manual_seed(31)
    s = torch.randn(96, 16, generator=g) * torch.rand(96, 1, generator=g) ** 4
    yield "seg_short", hvd_lossy.compress_chunks(s, [64, 32], 0.003, mode="abs", level=1)[0]
    yield "seg_short_odd_blocks_1d", hvd_lossy.compress_chunks(s.flatten()[:40].contiguous(), [40],
                                                              0.003, mode="abs", level=1)[0]
    yield "seg_short_outliers", hvd_lossy.compress_chunks(_with_specials(s), [50, 46], 0.003,
                                                         mode="abs", level=1)[0]
    yield "seg_short_dither_f16", hvd_lossy.compress_chunks(s.to(torch.float16), [96], 0.003,
                                                           mode="abs", level=1, dither=9)[0]
    yield "seg_short_map", hvd_lossy.compress_chunks(s[torch.arange(96) % 40], [96], 0.003,
                                                    mode="abs", level=1)[0]


def ext_frames():
    """Yields (name, frame) pairs of frames with the transport's extension
    (HL_FRAME_EXT), as the alltoall sends each destination: segments, none, a failure."""
    from hvd_lossy import chunk_header, protocol

    def fields(status=0, pending=(0, 0, 0)):
        return ([status, 7 if status else 0, -1 if status else 0, 5, 1, 2, 0, 0, *pending,
                 0x5EED1234] + [16] + [-1] * (protocol.MAX_NDIM - 1))
    x = _with_specials(_lookups(64, 16, torch.float16, seed=22, distinct=7))
    for level in (1, 2):
        ext = chunk_header.extension(fields(pending=(10, 1, 3) if level == 2 else (0, 0, 0)))
        rows, groups = [20, 0, 24, 20], [2, 0, 2]
        out = torch.zeros(hvd_lossy.max_grouped_bytes(rows, [16], groups, 0),
                          dtype=torch.uint8)
        _sizes, sizes = hvd_lossy.compress_grouped(x, rows, [0.03, 0.01, 0.0, 0.002], groups, 0,
                                                   out, level=level, extension=ext)
        yield f"ext_f16_chunk_l{level}", out[:sizes[0]].clone()
        yield f"ext_f16_empty_l{level}", out[sizes[0]:sizes[0] + sizes[1]].clone()
    yield "ext_failure", chunk_header.header_frame(x, fields(status=3))


def chunk_buffers():
    """Yields (name, buffer) pairs of back-to-back frames."""
    def back_to_back(x, rows, bounds, **kw):
        return torch.cat([hvd_lossy.compress_chunks(p, [r], eb, **kw)[0]
                          for p, r, eb in zip(x.split(rows), rows, bounds)])
    x = _lookups(40, 8, torch.float32, seed=8, distinct=5)
    yield "chunks_f32_mixed", back_to_back(x, [10, 0, 20, 10], [0.01, 0.02, 0.0, 0.05], level=2)
    yield "chunks_bf16", back_to_back(x.to(torch.bfloat16), [20, 20], [0.03, 0.03])
    yield "chunks_1d", back_to_back(torch.arange(12, dtype=torch.float16), [5, 7], [0.1, 0.1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--chunks", action="store_true", help="also write back-to-back frame buffers")
    ap.add_argument("--max-bytes", type=int, default=8192,
                    help="skip seeds larger than this (the fuzzers' -max_len)")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    items = list(frames()) + list(segmented_frames()) + (list(chunk_buffers()) if args.chunks else [])
    written = 0
    for name, frame in items:
        data = bytes(frame.numpy().tobytes())
        if len(data) > args.max_bytes:
            print(f"skipped {name}: {len(data)} bytes > --max-bytes {args.max_bytes}")
            continue
        (args.out_dir / name).write_bytes(data)
        written += 1
    print(f"wrote {written} seeds to {args.out_dir}")


if __name__ == "__main__":
    main()
