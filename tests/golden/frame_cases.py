"""Inputs of the golden frames that pin format version 2 (tests/golden/v2_*.bin): one frame,
several row segments with their own bounds, as the all-to-all sends a destination.

Inputs come from the closed formulas of cases.py. Regenerate only for a deliberate format
change: python tests/golden/frame_cases.py --write
"""
import sys

import torch

from cases import HERE, lookups, specials

def hot_lookups(rows=600, dim=8, distinct=24):
    """Lookups where one hot row takes three rows of four (a skewed row map)."""
    base = lookups(rows=distinct, dim=dim, distinct=distinct)
    return base[[0 if i % 4 else (i // 4) % distinct for i in range(rows)]]


def skewed_lookups(rows=512, dim=8, distinct=160):
    """Lookups of many distinct rows with a skewed (Criteo-like) repeat pattern: row i looks up
    distinct row floor(distinct * frac(i * golden ratio)^3)."""
    base = lookups(rows=distinct, dim=dim, distinct=distinct)
    phi = (5 ** 0.5 - 1) / 2
    return base[[int(distinct * ((i * phi) % 1.0) ** 3) for i in range(rows)]]


def scaled_rows(rows=128, dim=16):
    """Rows whose scale changes from row to row, as trained lookups and gradients do: row i is a
    lookups() row times 0.05 + frac(i * golden ratio)^4 (short blocks follow such scales)."""
    base = lookups(rows=rows, dim=dim, distinct=rows)
    phi = (5 ** 0.5 - 1) / 2
    return base * torch.tensor([[0.05 + ((i * phi) % 1.0) ** 4] for i in range(rows)])


# name: (make the tensor, rows a segment, compress_chunks keyword arguments)
FRAME_CASES = {
    "f32_rel003_level2_3seg": (lambda: lookups(), [40, 32, 24],
                                  dict(error_bounds=[0.03, 0.01, 0.05], mode="rel", level=2)),
    "f32_rel003_level1_3seg": (lambda: lookups(), [40, 32, 24],
                                  dict(error_bounds=0.03, mode="rel", level=1)),
    "f16_abs001_dither_2seg": (lambda: lookups(dtype=torch.float16), [50, 46],
                                  dict(error_bounds=0.001, mode="abs", level=2, dither=77)),
    "bf16_specials_lossless_mix": (lambda: specials(torch.bfloat16), [3, 5],
                                      dict(error_bounds=[0.0, 0.05], mode="rel", level=1)),
    "f32_coded_map_level2": (lambda: hot_lookups(), [300, 300],
                                dict(error_bounds=0.03, mode="rel", level=2)),
    "f32_bucketed_map_level2": (lambda: skewed_lookups(), [256, 256],
                                   dict(error_bounds=0.03, mode="rel", level=2)),
    "f32_1d_2seg": (lambda: lookups(rows=1, dim=100).reshape(-1), [60, 40],
                       dict(error_bounds=0.03, mode="rel", level=1)),
    # Radix-packed level-1 codes (frame.h "Radix section"): K = 17 in groups of 4 and K = 11 in
    # groups of 8 behind a packed map; dithered (no dedup) K = 19 and 11.
    "f32_radix_level1_2seg": (lambda: lookups(rows=128, dim=32), [64, 64],
                                 dict(error_bounds=[0.03, 0.05], mode="rel", level=1)),
    "f32_radix_dither_2seg": (lambda: lookups(rows=128, dim=32), [64, 64],
                                 dict(error_bounds=[0.03, 0.05], mode="rel", level=1, dither=5)),
    # Short-block level-1 codes (frame.h "Short-block section"), deduplicated and dithered.
    "f32_short_level1_2seg": (lambda: scaled_rows(), [64, 64],
                                 dict(error_bounds=[0.01, 0.003], mode="rel", level=1)),
    "f32_short_dither_2seg": (lambda: scaled_rows(), [64, 64],
                                 dict(error_bounds=[0.01, 0.003], mode="rel", level=1, dither=9)),
    # A destination's chunk of the alltoall: the protocol's extension in the frame header
    # (hvd_lossy/chunk_header.py: flags PENDING, grank 3, settings 0x5EED1234, pending 10, 1, 7).
    "ext_f32_rel003_level2_3seg": (lambda: lookups(), [40, 32, 24],
                                      dict(error_bounds=[0.03, 0.01, 0.05], mode="rel", level=2,
                                           extension=bytes.fromhex("02063412ed5e14020e"))),
}

# Frames an earlier encoder wrote, which decoders keep reading: the rows of
# f32_coded_map_level2 as written before bucketed maps (the same map, plain coded).
LEGACY_CASES = {
    "f32_coded_map_level2_before_buckets": FRAME_CASES["f32_coded_map_level2"],
    # ... and of f16_abs001_dither_2seg before shared rANS tables (a table a segment)
    "f16_abs001_dither_2seg_before_shared_table": FRAME_CASES["f16_abs001_dither_2seg"],
    # ... and of the level-1 cases before radix packing (their codes block packed)
    "f32_1d_2seg_before_radix": FRAME_CASES["f32_1d_2seg"],
    "f32_rel003_level1_3seg_before_radix": FRAME_CASES["f32_rel003_level1_3seg"],
    # ... and before short blocks (a radix section and block packing, now short blocks)
    "f32_1d_2seg_before_short": FRAME_CASES["f32_1d_2seg"],
    "bf16_specials_lossless_mix_before_short": FRAME_CASES["bf16_specials_lossless_mix"],
}

# Chunks of no segments: (dtype, trailing, extension). A failure (flags FAILED: grank 1,
# settings 0, status 3, a 2^40, b -5, dtype -1) and the own/empty chunk of a 3-d tensor.
EMPTY_FRAME = {
    "ext_empty_failure": (torch.float32, [], bytes.fromhex("010200000000068080808080400901")),
    "ext_empty_bf16_3d": (torch.bfloat16, [26, 32], bytes.fromhex("0000ffffff7f")),
}


def encode(name):
    import hvd_lossy

    if name in EMPTY_FRAME:
        dtype, trailing, ext = EMPTY_FRAME[name]
        return torch.frombuffer(bytearray(hvd_lossy._codec.empty_frame(dtype, trailing, ext)),
                                dtype=torch.uint8)
    make, rows, kwargs = FRAME_CASES[name]
    kwargs = dict(kwargs)
    ext = kwargs.pop("extension", None)
    if ext is None:
        return hvd_lossy.compress_chunks(make(), rows, **kwargs)[0]
    x = make()
    out = torch.zeros(hvd_lossy.max_grouped_bytes(rows, list(x.shape[1:]), [len(rows)], 0),
                      dtype=torch.uint8)
    bounds = kwargs.pop("error_bounds")
    _sizes, frames = hvd_lossy.compress_grouped(x, rows, bounds, [len(rows)], 0, out,
                                                extension=ext, **kwargs)
    return out[:frames[0]].clone()


def write():
    for name in list(FRAME_CASES) + list(EMPTY_FRAME):
        frame = encode(name)
        (HERE / f"{name}.bin").write_bytes(frame.numpy().tobytes())
        print(name, frame.numel(), "bytes")


if __name__ == "__main__" and "--write" in sys.argv:
    sys.path.insert(0, str(HERE))
    write()
