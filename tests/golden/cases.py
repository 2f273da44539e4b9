"""Inputs of the golden frames that pin format version 1 (tests/golden/*.bin).

Inputs are computed from closed formulas, not a random generator, so they are the same with any
torch version. Regenerate the .bin files only for a deliberate format change (and bump the
format version): python tests/golden/cases.py --write
"""
import math
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent


def lookups(rows=96, dim=32, distinct=24, dtype=torch.float32):
    """Embedding-like rows with hot items repeated, values in [-0.1, 0.1]."""
    vals = [[0.1 * math.sin(1.7 * i + 0.37 * j + 0.11 * i * j) for j in range(dim)] for i in range(distinct)]
    ids = [(i * i * 7 + 3 * i) % distinct if i % 3 else i % 5 for i in range(rows)]
    return torch.tensor([vals[k] for k in ids], dtype=torch.float64).to(dtype)


def specials(dtype):
    x = lookups(rows=8, dim=8, distinct=8).to(torch.float64)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = float("nan"), float("inf"), -float("inf"), -0.0
    x[4, 4], x[5, 5] = 6e4, -1e-7
    return x.to(dtype)


CASES = {
    "f32_rel003_level1": (lambda: lookups(), dict(error_bound=0.03, mode="rel", level=1)),
    "f32_rel001_level2": (lambda: lookups(), dict(error_bound=0.01, mode="rel", level=2)),
    "f16_abs001_level2": (lambda: lookups(dtype=torch.float16), dict(error_bound=0.001, mode="abs", level=2)),
    "bf16_specials_rel005": (lambda: specials(torch.bfloat16), dict(error_bound=0.05, mode="rel", level=1)),
    "f32_lossless_nodedup": (lambda: specials(torch.float32), dict(error_bound=0.0, mode="rel", level=1, dedup=False)),
    "f32_1d_rel003": (lambda: lookups(rows=1, dim=100).reshape(-1), dict(error_bound=0.03, mode="rel", level=1)),
    "f32_rel002_dither_level2": (lambda: lookups(), dict(error_bound=0.02, mode="rel", level=2, dither=0xC0FFEE)),
    "f16_abs001_dither_level1": (lambda: specials(torch.float16), dict(error_bound=0.001, mode="abs", level=1, dither=3)),
}


def write():
    import hvd_lossy

    for name, (make, kwargs) in CASES.items():
        frame = hvd_lossy.compress(make(), **kwargs)
        (HERE / f"{name}.bin").write_bytes(frame.numpy().tobytes())
        print(name, frame.numel(), "bytes")


if __name__ == "__main__" and "--write" in sys.argv:
    write()
