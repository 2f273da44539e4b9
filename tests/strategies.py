"""Hypothesis strategies shared by the codec tests (CPU and CUDA)."""
import math

import torch
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SPECIALS = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 3.4e38, -3.4e38, 1e-45, -1e-40,
            1e-8, 65504.0, 1.0, -1.0]


@st.composite
def tensors(draw, max_dim=9, max_specials=4):
    """Tensors of any supported dtype, 0 to 3 dimensions, scales from 1e-30 to 1e30, with special
    values planted and, half the time, the second half of the rows repeating the first (as hot
    embedding lookups do)."""
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, max_dim), min_size=ndim, max_size=ndim)))
    numel = math.prod(shape)
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = torch.randn(numel, generator=g, dtype=torch.float64) * scale
    for i, v in draw(st.lists(st.tuples(st.integers(0, max(numel - 1, 0)), st.sampled_from(SPECIALS)),
                              max_size=max_specials)):
        if numel:
            x[i] = v
    x = x.to(dtype).reshape(shape)
    if draw(st.booleans()) and numel > 1 and ndim >= 2:
        x = x.reshape(-1, shape[-1])
        x[len(x) // 2:] = x[: len(x) - len(x) // 2].clone()
        x = x.reshape(shape)
    return x
