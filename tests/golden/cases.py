"""Inputs of the golden frames (tests/golden/*.bin, their cases in frame_cases.py).

Inputs are computed from closed formulas, not a random generator, so they are the same with any
torch version.
"""
import math
import pathlib

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
