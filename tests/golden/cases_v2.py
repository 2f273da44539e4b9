"""Inputs of the golden frames that pin format version 2 (tests/golden/v2_*.bin): one frame,
several row segments with their own bounds, as the all-to-all sends a destination.

Inputs come from the closed formulas of cases.py. Regenerate only for a deliberate format
change: python tests/golden/cases_v2.py --write
"""
import sys

import torch

from cases import HERE, lookups, specials

def hot_lookups(rows=600, dim=8, distinct=24):
    """Lookups where one hot row takes three rows of four (a skewed row map)."""
    base = lookups(rows=distinct, dim=dim, distinct=distinct)
    return base[[0 if i % 4 else (i // 4) % distinct for i in range(rows)]]


# name: (make the tensor, rows a segment, compress_chunks keyword arguments)
CASES_V2 = {
    "v2_f32_rel003_level2_3seg": (lambda: lookups(), [40, 32, 24],
                                  dict(error_bounds=[0.03, 0.01, 0.05], mode="rel", level=2)),
    "v2_f32_rel003_level1_3seg": (lambda: lookups(), [40, 32, 24],
                                  dict(error_bounds=0.03, mode="rel", level=1)),
    "v2_f16_abs001_dither_2seg": (lambda: lookups(dtype=torch.float16), [50, 46],
                                  dict(error_bounds=0.001, mode="abs", level=2, dither=77)),
    "v2_bf16_specials_lossless_mix": (lambda: specials(torch.bfloat16), [3, 5],
                                      dict(error_bounds=[0.0, 0.05], mode="rel", level=1)),
    "v2_f32_coded_map_level2": (lambda: hot_lookups(), [300, 300],
                                dict(error_bounds=0.03, mode="rel", level=2)),
    "v2_f32_1d_2seg": (lambda: lookups(rows=1, dim=100).reshape(-1), [60, 40],
                       dict(error_bounds=0.03, mode="rel", level=1)),
}


def encode(name):
    import hvd_lossy

    make, rows, kwargs = CASES_V2[name]
    buf, sizes = hvd_lossy.compress_chunks(make(), rows, format=2, **kwargs)
    return buf


def write():
    for name in CASES_V2:
        frame = encode(name)
        (HERE / f"{name}.bin").write_bytes(frame.numpy().tobytes())
        print(name, frame.numel(), "bytes")


if __name__ == "__main__" and "--write" in sys.argv:
    sys.path.insert(0, str(HERE))
    write()
