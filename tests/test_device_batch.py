"""The CUDA encoder codes every piece of a call in one batch (native/common/piece_table.h: one
device table of pieces, each stage one launch for all of them, call-wide scans and one sort,
the frames put together by one move list). That batch, run on the host in the device's
decomposition (native/testing/batch_ref.h, through _hl_test.compress_into_batched_hd: the
per-piece and per-item functions the kernels call, a few blocks a piece with strided items),
must write the CPU encoder's compress_into layout byte for byte: every dtype, dither, abs and
rel bounds, dedup on and off, empty and one-row pieces, NaN and Inf, lossless pieces and the
lossless fallback of a piece of nothing but outliers. No GPU is needed; tests/test_cuda.py
compares real device frames where one is present."""
import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
D = 12

# (rows a piece, bounds a piece, pieces a group, prefix bytes, extension)
LAYOUTS = {
    "one piece": ([300], [0.03], [1], 0, None),
    "empty and one-row pieces": ([0, 1, 37, 1, 64, 0], [0.02, 0.05, 0.01, 0.0, 1e-3, 0.02],
                                 [2, 3, 1], 0, None),
    "a DLRM exchange in small": ([16] * 24, [0.02] * 24, [6, 6, 6, 6], 4, b"\x01proto"),
    "empty groups with an extension": ([120, 0, 80, 400], [0.03, 0.01, 0.0, 1e-3],
                                       [0, 2, 2, 0], 3, b"\x02p"),
}


def rows_for(n_rows, seed, dtype, specials, spread=10.0):
    """Rows with duplicates (a few distinct rows repeated), per-row scales from 1e-3 to `spread`
    (spread None: the integers -1, 0, 1, whose codes at a bound of 0.5 are radix packed), and
    NaN, +-Inf and an out-of-range value where specials."""
    g = torch.Generator().manual_seed(seed)
    distinct = max(1, n_rows // 3)
    if spread is None:
        base = torch.randint(-1, 2, (distinct, D), generator=g).float()
    else:
        scale = torch.logspace(-3, np.log10(spread), distinct, dtype=torch.float64)[:, None]
        base = (torch.randn(distinct, D, generator=g, dtype=torch.float64) * scale).float()
    x = base[torch.randint(0, distinct, (n_rows,), generator=g)].clone()
    if specials and x.numel():
        flat = x.view(-1)
        big = 6e4 if dtype == torch.float16 else 3e9
        for at, v in ((0, float("nan")), (7, float("inf")), (-1, -float("inf")),
                      (len(flat) // 2, big)):
            flat[at % len(flat)] = v
    return x.to(dtype)


def raw_bytes(x):
    return x.contiguous().view(INT_VIEW[x.dtype]).numpy().tobytes()


def cpu_layout(x, rows, ebs, groups, prefix, ext, mode, dedup, dither):
    """(layout bytes, sizes, group bytes or None) of the CPU encoder, gaps 0xab."""
    cap = hvd_lossy.max_grouped_bytes(rows, [D], groups, prefix)
    out = torch.full((cap,), 0xAB, dtype=torch.uint8)
    got = hvd_lossy.compress_grouped(x, rows, ebs, groups, prefix, out, 0, mode=mode, level=1,
                                     dedup=dedup, dither=dither, extension=ext)
    sizes, group_bytes = got if ext is not None else (got, None)
    end = len(groups) * prefix + (sum(group_bytes) if ext is not None else sum(sizes))
    return out.numpy().tobytes()[:end], list(sizes), group_bytes


def batched_layout(x, rows, ebs, groups, prefix, ext, mode, dedup, dither):
    return _hl_test.compress_into_batched_hd(
        raw_bytes(x), DTYPE_CODE[x.dtype], rows, [D], ebs, 1 if mode == "rel" else 0, dedup,
        groups, prefix, ext or b"", -1 if dither is None else dither)


def assert_same_layout(x, rows, ebs, groups, prefix, ext, mode, dedup, dither):
    want, sizes, group_bytes = cpu_layout(x, rows, ebs, groups, prefix, ext, mode, dedup, dither)
    got, got_sizes, got_groups = batched_layout(x, rows, ebs, groups, prefix, ext, mode, dedup,
                                                dither)
    assert got_sizes == sizes
    if group_bytes is not None:
        assert got_groups == list(group_bytes)
    assert len(got) == len(want)
    if got != want:
        first = next(i for i in range(len(want)) if got[i] != want[i])
        pytest.fail(f"batched layout differs from the CPU encoder's first at byte {first} of "
                    f"{len(want)}")


CASES = [(name, dtype, mode, dither, dedup)
         for name in sorted(LAYOUTS)
         for dtype in (torch.float32, torch.float16, torch.bfloat16)
         for mode in ("abs", "rel")
         for dither, dedup in ((None, True), (None, False), (4321, True))]


@pytest.mark.parametrize("name,dtype,mode,dither,dedup", CASES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_batched_encoder_writes_the_cpu_encoders_layout(name, dtype, mode, dither, dedup):
    rows, ebs, groups, prefix, ext = LAYOUTS[name]
    x = rows_for(sum(rows), 7 + len(name), dtype, specials=True)
    assert_same_layout(x, rows, ebs, groups, prefix, ext, mode, dedup, dither)


@pytest.mark.parametrize("seed", range(12))
def test_batched_encoder_matches_the_cpu_encoder_on_random_calls(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    rows = [int(r) for r in rng.choice([0, 1, 2, 5, 33, 70], size=n)]
    ebs = [float(b) for b in rng.choice([0.0, 1e-4, 0.01, 0.2], size=n)]
    cuts = sorted(rng.choice(n + 1, size=int(rng.integers(0, 4)), replace=True).tolist())
    groups = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    dtype = [torch.float32, torch.float16, torch.bfloat16][seed % 3]
    dither = None if seed % 4 else int(rng.integers(0, 2 ** 24))
    ext = None if seed % 2 else b"\x05ext"
    x = rows_for(sum(rows), seed, dtype, specials=bool(seed % 3))
    assert_same_layout(x, rows, ebs, groups, int(rng.integers(0, 5)), ext,
                       "rel" if seed % 2 else "abs", bool(seed % 5), dither)


def test_a_piece_of_nothing_but_outliers_falls_back_to_lossless_in_the_second_round():
    rows = [20, 20, 20]
    x = rows_for(60, 3, torch.float32, specials=False)
    # distinct values far out of the codes' range: every element an outlier, so the lossy
    # sections outgrow the worst case and the piece is coded again lossless
    x[20:40] = 1e30 * torch.arange(1, 20 * D + 1, dtype=torch.float32).reshape(20, D)
    want, _sizes, _ = cpu_layout(x, rows, [0.01] * 3, [3], 0, None, "abs", True, None)
    segs = hvd_lossy.frame_info(torch.frombuffer(bytearray(want), dtype=torch.uint8))["segments"]
    assert [s["lossless"] for s in segs] == [False, True, False]
    assert_same_layout(x, rows, [0.01] * 3, [3], 0, None, "abs", True, None)


def test_batched_encoder_refuses_an_input_of_the_wrong_size():
    with pytest.raises(ValueError, match="input of 4 bytes, the pieces need 96"):
        _hl_test.compress_into_batched_hd(b"\0" * 4, 0, [2], [D], [0.1], 0, True, [1], 0, b"", -1)
