"""Specification of the codec: the error bound, round trips, dedup, sizes and bad input."""
import os
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hvd_lossy
from hvd_lossy import FrameError
from strategies import DTYPES, SPECIALS, tensors
from tests._launch import on_every_kernel_path, same_on_every_kernel_path


def max_error(x, y):
    """max |x - x_hat| in float64 over the finite elements of x."""
    x64, y64 = x.double(), y.double()
    finite = torch.isfinite(x64)
    if not finite.any():
        return 0.0
    return (x64[finite] - y64[finite]).abs().max().item()


def assert_bound_and_specials(x, frame):
    info = hvd_lossy.frame_info(frame)
    y = hvd_lossy.decompress(frame)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert max_error(x, y) <= info["eb_abs"]
    # NaN and infinities come back exactly where they were.
    assert torch.equal(torch.isnan(x), torch.isnan(y))
    inf = torch.isinf(x)
    assert torch.equal(x[inf], y[inf])
    return info, y


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=tensors(),
       eb=st.sampled_from([0.0, 1e-6, 1e-3, 0.01, 0.03, 0.05, 0.3, 1.0]),
       mode=st.sampled_from(["rel", "abs"]),
       level=st.sampled_from([1, 2]),
       dedup=st.booleans())
def test_roundtrip_respects_error_bound_on_every_element(x, eb, mode, level, dedup):
    frame = hvd_lossy.compress(x, eb, mode=mode, level=level, dedup=dedup)
    info, y = assert_bound_and_specials(x, frame)
    if eb == 0:
        assert info["lossless"]
    if info["lossless"]:
        assert torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                           y.view(torch.int16 if x.element_size() == 2 else torch.int32))
    assert frame.numel() <= hvd_lossy.max_frame_bytes(info["n_rows"], info["row_len"], len(x.shape))


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_on_bin_edges_stay_within_bound(dtype):
    eb = 2.0 ** -7  # a bound the frame stores exactly (24 bits)
    step = 2 * eb
    k = torch.arange(-200, 200, dtype=torch.float64)
    # exactly halfway between two reconstruction levels, and one ulp either side
    edges = (k + 0.5) * step
    x = torch.cat([edges, torch.nextafter(edges, edges + 1), torch.nextafter(edges, edges - 1)])
    x = x.to(dtype).reshape(-1, 8)
    frame = hvd_lossy.compress(x, eb, mode="abs")
    info, _ = assert_bound_and_specials(x, frame)
    assert info["eb_abs"] == eb


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_survive_lossy_compression(dtype):
    x = torch.tensor(SPECIALS * 4, dtype=torch.float64).to(dtype).reshape(4, -1)
    for mode in ("rel", "abs"):
        frame = hvd_lossy.compress(x, 0.05, mode=mode)
        info, y = assert_bound_and_specials(x, frame)
        assert info["n_outliers"] > 0


def test_rel_bound_is_fraction_of_finite_range():
    x = torch.tensor([[-2.0, 6.0, float("inf"), float("nan")]])
    info = hvd_lossy.frame_info(hvd_lossy.compress(x, 0.03))
    assert 0.03 * 8.0 * (1 - 2 ** -15) <= info["eb_abs"] <= 0.03 * 8.0  # rounded down to 24 bits
    assert info["mode"] == "rel"


@pytest.mark.parametrize("x", [torch.full((16, 4), 3.25), torch.tensor([[float("nan")] * 4]),
                               torch.zeros(3, 0), torch.zeros(0, 32)])
def test_zero_range_or_no_finite_values_is_lossless(x):
    frame = hvd_lossy.compress(x, 0.03, mode="rel")
    info = hvd_lossy.frame_info(frame)
    assert info["lossless"] and info["eb_abs"] == 0
    y = hvd_lossy.decompress(frame)
    assert torch.equal(x.view(torch.int32), y.view(torch.int32))


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (0, 32), (1, 32), (5, 1), (2, 3, 4), (3, 0)])
def test_roundtrip_keeps_dtype_and_shape(shape):
    x = torch.randn(shape)
    y = hvd_lossy.decompress(hvd_lossy.compress(x, 0.01))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert max_error(x, y) <= 0.01 * (x.max() - x.min()).item() if x.numel() else True


def test_non_contiguous_input_is_compressed_as_its_values():
    base = torch.randn(32, 64)
    x = base.t()[::2]
    assert not x.is_contiguous()
    y = hvd_lossy.decompress(hvd_lossy.compress(x, 0.0))
    assert torch.equal(y, x)


def test_duplicate_rows_are_stored_once():
    g = torch.Generator().manual_seed(0)
    table = torch.rand(50, 32, generator=g) * 0.2 - 0.1
    ids = torch.randint(0, 50, (1024,), generator=g)
    x = table[ids]
    frame = hvd_lossy.compress(x, 0.03)
    info = hvd_lossy.frame_info(frame)
    assert info["n_unique"] == len(torch.unique(ids))
    no_dedup = hvd_lossy.compress(x, 0.03, dedup=False)
    assert hvd_lossy.frame_info(no_dedup)["n_unique"] == 1024
    assert frame.numel() * 5 < no_dedup.numel()
    assert torch.equal(hvd_lossy.decompress(frame), hvd_lossy.decompress(no_dedup))


def _code_classes(x, eb):
    """The rows a lossy frame stores, by frame.h's rule written again in numpy: each element's
    zigzag code (or the outlier mark) at step 2 * eb, rows equal when their codes are and their
    outliers' raw bits too; returns each row's class, numbered by first occurrence."""
    import numpy as np

    v = x.numpy().astype(np.float64)
    step = 2 * eb
    t = v * (1 / step)
    with np.errstate(invalid="ignore"):
        in_range = np.abs(t) <= 2.0**30 - 1
        q = np.rint(np.where(in_range, t, 0))
        back = (q * step).astype(np.float32).astype(np.float64)
        ok = in_range & (np.abs(v - back) <= eb)
    raw = x.numpy().view(np.uint32)
    codes = np.where(ok, q, 2.0**31)  # the mark: no code is 2^31
    keys = [tuple(codes[r].tolist()) + tuple(raw[r][~ok[r]].tolist()) for r in range(len(v))]
    first = {}
    return [first.setdefault(k, len(first)) for k in keys]


@pytest.mark.parametrize("distinct", [0.05, 0.45, 0.7, 1.0])
def test_dedup_stores_one_row_a_code_class_in_order_of_first_occurrence(distinct):
    """Rows are merged exactly when their codes agree and their outliers are the same bits:
    repeats bit for bit (hot lookups), rows that differ below the step, rows that differ only
    in an outlier's value (kept apart), codes above a byte (compared at full width); at shares
    of distinct rows below and above one half (the dedup table's first size) and with none
    repeated."""
    g = torch.Generator().manual_seed(int(distinct * 100))
    eb = 2.0**-6
    n = 3000
    table = torch.randn(int(n * distinct) + 1, 24, generator=g) * 0.05
    table[::7] *= 200  # codes above a byte
    table[::11, 3] = float("nan")
    ids = torch.randint(0, len(table), (n,), generator=g) if distinct < 1 else torch.arange(n)
    x = table[ids % len(table)].clone()
    x[::13] += eb / 8  # differ in bits, mostly not in codes
    x[::17, 3] = float("inf")  # an outlier of another value
    classes = _code_classes(x, eb)
    frame = hvd_lossy.compress(x, eb, mode="abs", level=1)
    before = hvd_lossy.get_num_threads()
    try:  # a block's rows are quantized by several threads, then numbered in order: same frame
        for n in (1, 2):
            hvd_lossy.set_num_threads(n)
            assert torch.equal(hvd_lossy.compress(x, eb, mode="abs", level=1), frame), n
    finally:
        hvd_lossy.set_num_threads(before)
    info = hvd_lossy.frame_info(frame)
    n_classes = max(classes) + 1
    assert info["n_unique"] in (n_classes, n)  # n: dedup did not pay, every row stored
    if distinct < 1:
        assert info["n_unique"] == n_classes
    y = hvd_lossy.decompress(frame)
    first_of = {}
    for r, c in enumerate(classes):  # a class decodes as its first row does
        f = first_of.setdefault(c, r)
        assert torch.equal(y[r].view(torch.int32), y[f].view(torch.int32)), (r, f)
    err = (y - x).abs()
    finite = torch.isfinite(x)
    assert bool((err[finite] <= eb).all())
    assert torch.equal(y[~finite].view(torch.int32), x[~finite].view(torch.int32))


def test_rows_differing_only_in_an_outlier_value_are_not_merged():
    x = torch.zeros(4, 8)
    x[:, 0] = torch.linspace(-1, 1, 4)
    x[1, 3] = float("nan")
    x[2] = x[1]
    x[2, 3] = float("inf")  # same codes as row 1 except the outlier's raw bits
    x[3] = x[1]
    y = hvd_lossy.decompress(hvd_lossy.compress(x, 0.01))
    assert torch.isnan(y[1, 3]) and torch.isinf(y[2, 3]) and torch.isnan(y[3, 3])


def test_level_two_is_smaller_on_embedding_lookups():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4096, 32, generator=g) * 0.02 - 0.01
    l1 = hvd_lossy.compress(x, 0.03, level=1)
    l2 = hvd_lossy.compress(x, 0.03, level=2)
    assert hvd_lossy.frame_info(l2)["level"] == 2
    assert l2.numel() < l1.numel()
    assert torch.equal(hvd_lossy.decompress(l1), hvd_lossy.decompress(l2))


def test_frame_info_describes_the_frame():
    x = torch.randn(10, 4, dtype=torch.float16)
    frame = hvd_lossy.compress(x, 0.05, mode="abs", level=2)
    info = hvd_lossy.frame_info(frame)
    assert info["dtype"] == torch.float16 and info["shape"] == (10, 4)
    assert 0.05 * (1 - 2 ** -15) <= info["eb_abs"] <= 0.05 and info["mode"] == "abs"
    assert info["frame_bytes"] == frame.numel()
    assert info["raw_bytes"] == 80 and info["ratio"] == pytest.approx(80 / frame.numel())


def test_compress_chunks_makes_one_frame_a_segment_a_piece_with_its_own_bound():
    x = torch.randn(10, 3)
    buf, sizes = hvd_lossy.compress_chunks(x, [4, 0, 6], [0.01, 0.02, 0.05])
    assert sizes == [buf.numel()] and hvd_lossy.split_frames(buf) == sizes
    info = hvd_lossy.frame_info(buf)
    assert [seg["rows"] for seg in info["segments"]] == [4, 0, 6]
    y = hvd_lossy.decompress(buf)
    for seg, src, got, eb in zip(info["segments"], torch.split(x, [4, 0, 6]),
                                 torch.split(y, [4, 0, 6]), [0.01, 0.02, 0.05]):
        if src.numel():
            want = eb * (src.max() - src.min()).item()
            assert want * (1 - 2 ** -15) <= seg["eb_abs"] <= want
        assert max_error(src, got) <= seg["eb_abs"]
    # each segment decodes as compressing its piece alone
    assert torch.equal(y[:4], hvd_lossy.decompress(hvd_lossy.compress(x[:4], 0.01)))


def test_compress_chunks_of_a_1d_tensor_gives_1d_pieces():
    x = torch.randn(9)
    buf, sizes = hvd_lossy.compress_chunks(x, [2, 7], 0.0)
    parts = hvd_lossy.decompress_chunks(buf)
    assert torch.equal(torch.cat(parts), x)


@pytest.mark.parametrize("bad, match", [
    (dict(error_bound=-0.01), "error_bound must be a finite number >= 0, got -0.01"),
    (dict(error_bound=float("nan")), "error_bound .* got nan"),
    (dict(error_bound=float("inf")), "error_bound .* got inf"),
    (dict(mode="relative"), "unsupported mode 'relative'"),
    (dict(level=3), "unsupported level 3"),
])
def test_bad_arguments_raise_value_error_naming_the_value(bad, match):
    kwargs = dict(error_bound=0.01, mode="rel", level=1)
    kwargs.update(bad)
    with pytest.raises(ValueError, match=match):
        hvd_lossy.compress(torch.randn(4, 4), **kwargs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool, torch.uint8])
def test_unsupported_dtype_raises_value_error(dtype):
    with pytest.raises(ValueError, match=f"unsupported dtype {dtype}"):
        hvd_lossy.compress(torch.zeros(4, dtype=dtype), 0.01)


def test_non_tensor_raises_type_error():
    with pytest.raises(TypeError, match="expected a torch.Tensor, got list"):
        hvd_lossy.compress([1.0, 2.0], 0.01)


def test_bad_chunk_rows_raise():
    x = torch.randn(5, 2)
    with pytest.raises(ValueError, match="rows sum to 4 but the tensor has 5"):
        hvd_lossy.compress_chunks(x, [2, 2], 0.01)
    with pytest.raises(ValueError, match=r"rows\[0\] is -1"):
        hvd_lossy.compress_chunks(x, [-1, 6], 0.01)
    with pytest.raises(ValueError, match="got 1 error bounds for 2 pieces"):
        hvd_lossy.compress_chunks(x, [2, 3], [0.01])


def test_corrupt_or_foreign_frames_raise_frame_error():
    frame = hvd_lossy.compress(torch.randn(64, 8), 0.01)
    assert issubclass(FrameError, ValueError)
    with pytest.raises(FrameError, match="truncated"):
        hvd_lossy.decompress(frame[:50])
    with pytest.raises(FrameError, match="truncated: its header says"):
        hvd_lossy.decompress(frame[:-1])
    with pytest.raises(FrameError, match="truncated or has trailing bytes"):
        hvd_lossy.decompress(torch.cat([frame, torch.zeros(1, dtype=torch.uint8)]))
    flipped = frame.clone()
    flipped[-3] ^= 0x10
    with pytest.raises(FrameError, match="checksum"):
        hvd_lossy.decompress(flipped)
    with pytest.raises(FrameError, match="not an hvd_lossy frame: it starts 00 00 00"):
        hvd_lossy.decompress(torch.zeros(200, dtype=torch.uint8))
    with pytest.raises(TypeError, match="torch.uint8"):
        hvd_lossy.decompress(torch.zeros(200))


def test_simd_and_portable_paths_write_identical_frames(tmp_path):
    """The AVX-512 and AVX2 kernels (plain and dithered, encode and decode, range, pack and
    unpack; float32, and float16/bfloat16 at AVX-512) must give exactly the portable loops'
    bytes, near the dtypes' overflow and subnormal edges too. Rows of 37 exercise every vector
    tail, rows of 128 the full-width loops; codes that fit a byte for a while and then do not,
    the encoder's switch from byte codes to 32-bit ones in the middle of a tensor."""
    import os
    import pathlib
    import subprocess
    import sys

    script = tmp_path / "frames.py"
    script.write_text(
        "import sys, torch, hvd_lossy\n"
        "g = torch.Generator().manual_seed(7)\n"
        "out = [bytes([hvd_lossy._C.simd_level()])]\n"
        "edges = {torch.float32: 3.4e38, torch.float16: 65504.0, torch.bfloat16: 3.3e38}\n"
        "for dtype, scale in ((torch.float32, 1e-3), (torch.float32, 1.0), (torch.float32, 1e6),\n"
        "                     (torch.float16, 1.0), (torch.float16, 1e-5), (torch.float16, 3e4),\n"
        "                     (torch.bfloat16, 1.0), (torch.bfloat16, 1e-30), (torch.bfloat16, 1e30)):\n"
        "    for rows, dim in ((257, 37), (96, 128), (5, 3)):\n"
        "        x = (torch.randn(rows, dim, generator=g) * scale).to(dtype)\n"
        "        x[3, 1] = float('nan'); x[2, 2] = float('-inf'); x[4] = x[2]; x[1, 0] = edges[dtype]\n"
        "        x[0, :3] = torch.tensor([6e-8, -3e-5, 1e-40]).to(dtype)  # subnormals of each dtype\n"
        "        x = torch.cat([x, x[torch.randint(0, rows, (rows,), generator=g)]])\n"
        "        for eb, mode in ((0.03, 'rel'), (1e-4, 'rel'), (0.01, 'abs'), (1e-7, 'abs')):\n"
        "            for dither in (None, 11, 2**24 - 1):\n"
        "                for level in (1, 2):\n"
        "                    frame = hvd_lossy.compress(x, eb, mode=mode, dither=dither, level=level)\n"
        "                    out.append(frame.numpy().tobytes())\n"
        "                    out.append(hvd_lossy.decompress(frame).view(torch.uint8).numpy().tobytes())\n"
        "big = torch.randn(4096, 128, generator=g)[torch.randint(0, 4096, (16384,), generator=g)]\n"
        "frame = hvd_lossy.compress(big, 0.03)  # decodes to 8 MiB: the streaming row copy\n"
        "out.append(frame.numpy().tobytes())\n"
        "out.append(hvd_lossy.decompress(frame).numpy().tobytes())\n"
        "buf = torch.cat([hvd_lossy.compress(p, 0.03) for p in big.split(4096)])  # 8 MiB, 4 frames\n"
        "out += [p.numpy().tobytes() for p in hvd_lossy.decompress_chunks(buf)]\n"
        "u = (torch.rand(2000, 32, generator=g) - 0.5) * 0.1  # radix-packed codes (K = 17)\n"
        "for rows in ([64] * 5, [37, 2000 - 37]):\n"
        "    for dither in (None, 5):\n"
        "        buf = hvd_lossy.compress_chunks(u[:sum(rows)], rows, 0.03, level=1,\n"
        "                                        dither=dither)[0]\n"
        "        out.append(buf.numpy().tobytes())\n"
        "        out += [p.numpy().tobytes() for p in hvd_lossy.decompress_chunks(buf)]\n"
        "s = torch.randn(9000, 16, generator=g) * torch.rand(9000, 1, generator=g) ** 4  # row scales\n"
        "for rows in ([64] * 5, [8999, 1]):  # short blocks; 4,500 pairs of them: threaded\n"
        "    for dither in (None, 5):\n"
        "        buf = hvd_lossy.compress_chunks(s[:sum(rows)], rows, 0.003, level=1,\n"
        "                                        dither=dither)[0]\n"
        "        assert hvd_lossy.frame_info(buf)['segments'][0]['short_blocks']\n"
        "        out.append(buf.numpy().tobytes())\n"
        "        out += [p.numpy().tobytes() for p in hvd_lossy.decompress_chunks(buf)]\n"
        "m = torch.randn(6000, 32, generator=g) * 0.01  # codes of a byte, then wider, then NaN:\n"
        "m[4000:] *= 1000  # tiles of byte codes before and beside rows that need more\n"
        "m[5500, 3] = float('nan')\n"
        "m = m[torch.randint(0, 6000, (6000,), generator=g).sort().values]  # repeats, in order\n"
        "n = torch.randn(6000, 32, generator=g) * 0.01  # byte codes, but one NaN: the one tile\n"
        "n[2500, 7] = float('nan')  # its rows' outlier flags read off the tile's codes\n"
        "for x, dither in ((m, None), (m, 5), (n, 5)):\n"
        "    frame = hvd_lossy.compress(x, 0.01, mode='abs', dither=dither)\n"
        "    back = hvd_lossy.decompress(frame)\n"
        "    fin = torch.isfinite(x)\n"
        "    assert torch.equal(torch.isnan(back), torch.isnan(x)), dither\n"
        "    assert (back[fin].double() - x[fin].double()).abs().max().item() <= 0.01, dither\n"
        "    out.append(frame.numpy().tobytes())\n"
        "    out.append(back.numpy().tobytes())\n"
        "sys.stdout.buffer.write(b''.join(out))\n")

    def frames(**flags):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_LOSSY_NO_")}
        env.update(flags, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
        return subprocess.run([sys.executable, str(script)], env=env, check=True,
                              capture_output=True, timeout=300).stdout

    # The first byte says which kernels ran; the rest must not depend on it.
    runs = [frames(), frames(HVD_LOSSY_NO_AVX512="1"), frames(HVD_LOSSY_NO_AVX2="1")]
    levels = [r[0] for r in runs]
    assert levels[2] == 0 and levels[1] <= 1 and levels[0] >= levels[1]
    assert len(runs[0]) > 1 and runs[0][1:] == runs[1][1:] == runs[2][1:]


def test_dither_kernels_match_the_scalar_rule_at_every_element_index(tmp_path):
    """The vector dither generators (eight lanes of 32-bit hashing, the high half of the element
    index mixed once per call) against hl::dither_unit element by element, encode and decode, on
    every kernel path: at index 0, and where runs of 4, 8 and 16 elements cross 2^32 and 2^33,
    which only a segment of more than 2^32 elements reaches."""
    from tests._hooks import OUT

    script = tmp_path / "dither.py"
    script.write_text(
        "import math, random, sys\n"
        f"sys.path.insert(0, {str(OUT)!r})\n"
        "import _hl_test, hvd_lossy\n"
        "rng = random.Random(5)\n"
        "x = [rng.gauss(0, 1) for _ in range(45)]\n"
        "x[3], x[9], x[20], x[30] = math.nan, math.inf, 1e30, -1e-30\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "for first in (0, 2**32 - 45, 2**32 - 9, 2**32 - 8, 2**32 - 5, 2**32 - 1, 2**32,\n"
        "              2**33 - 3, 2**40 + 7):\n"
        "    for seed in (0, 11, 2**24 - 1):\n"
        "        z, z_ref, y, y_ref = _hl_test.dithered_f32(x, first, seed, 0.01)\n"
        "        assert z == z_ref, (first, seed, z, z_ref)\n"
        "        assert [float(v).hex() for v in y] == [float(v).hex() for v in y_ref], (first, seed)\n"
        "        assert 0xffffffff in z and len(set(z)) > 10\n"
        "        out.append((z, [float(v).hex() for v in y]))\n"
        "print(repr(out))\n")

    same_on_every_kernel_path(script)


@pytest.mark.parametrize("mode", ["rel", "abs"])
def test_rows_past_the_point_where_dedup_cannot_pay_are_stored_as_without_dedup(mode):
    """dedup_pays only falls as unique rows are found, so once the rows numbered so far fail it
    the whole piece stores every row: the encoder stops numbering there (one thread: 2,048 rows
    of d16 a block; here after about 11,000 of 20,000 rows) and the frame is the bytes of the
    frame without dedup, with wide rows (abs: codes of 256 or more), outliers (NaN) and repeats
    among the rows past that point, and decodes within the bound."""
    g = torch.Generator().manual_seed(5)
    distinct = torch.rand(14000, 16, generator=g) * 2 - 1
    x = torch.cat([distinct, distinct[torch.randint(0, 14000, (6000,), generator=g)]])
    x[17000, 5] = float("nan")
    eb = 0.01
    if mode == "abs":
        x[15000:15003, 3] = 40.0  # 2,000 steps: wide rows
        x[15003] = x[15000]  # a wide repeat
    before = hvd_lossy.get_num_threads()
    try:
        hvd_lossy.set_num_threads(1)
        frame = hvd_lossy.compress(x, eb, mode=mode)
        assert torch.equal(frame, hvd_lossy.compress(x, eb, mode=mode, dedup=False))
        assert hvd_lossy.frame_info(frame)["n_unique"] == len(x)
    finally:
        hvd_lossy.set_num_threads(before)
    y = hvd_lossy.decompress(frame)
    finite = ~x.isnan()
    values = x[finite].double()
    bound = eb if mode == "abs" else eb * (values.max() - values.min()).item()
    assert (values - y[finite].double()).abs().max().item() <= bound
    assert y[17000, 5].isnan()


def test_dedup_hashes_follow_one_rule_on_every_kernel_path(tmp_path):
    """The quantizer that serves dedup hashes each row as the scalar rule says (narrow_hash of a
    narrow row's bytes, wide_hash of a wide row's codes and outliers), on every kernel path and at
    row lengths with and without whole blocks of 32 and a rest of 8 or fewer codes; and a narrow
    row's hash covers every code: one code changed anywhere in the row changes it. Bounded rows
    (a range pass's max |x| given, every code within a byte) are quantized in runs, each row's
    hash folded from its lanes in registers, and hash by the same rule, rows with a rounding
    edge in a run (done the general way) too."""
    from tests._hooks import OUT

    script = tmp_path / "hashes.py"
    script.write_text(
        "import math, random, sys\n"
        f"sys.path.insert(0, {str(OUT)!r})\n"
        "import _hl_test, hvd_lossy\n"
        "rng = random.Random(7)\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "for d in (5, 8, 16, 29, 32, 40, 64, 77, 128):\n"
        "    rows = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(6)]\n"
        "    rows[1][d - 1] = 50.0  # a code of 256 or more: a wide row\n"
        "    rows[2][d // 2] = math.nan  # an outlier: a wide row\n"
        "    x = [v for r in rows for v in r]\n"
        "    narrow, h, ref = _hl_test.narrow_hashes_f32(x, d, 0.1)\n"
        "    assert list(narrow) == [1, 0, 0, 1, 1, 1], (d, narrow)\n"
        "    assert list(h) == list(ref), d\n"
        "    out.append(list(h))\n"
        "    for at in range(d):  # one code one step up (0.2 = two bounds) at each position\n"
        "        y = rows[0][:]\n"
        "        y[at] += 0.2\n"
        "        _, h2, ref2 = _hl_test.narrow_hashes_f32(rows[0] + y, d, 0.1)\n"
        "        assert list(h2) == list(ref2) and h2[1] != h2[0], (d, at)\n"
        "for d in (16, 32, 40, 64, 256, 288):  # bounded: byte runs, row pairs at d16, folds\n"
        "    rows = [[rng.uniform(-1, 1) for _ in range(d)] for _ in range(7)]\n"
        "    rows[2] = rows[0][:]  # a repeat\n"
        "    rows[3][d - 1] = 0.25  # a rounding edge at step 0.1: that run the general way\n"
        "    rows[5][0] = -0.75  # an edge whose rounding misses the bound: an outlier, wide\n"
        "    x = [v for r in rows for v in r]\n"
        "    narrow, h, ref = _hl_test.narrow_hashes_f32(x, d, 0.05, max(map(abs, x)))\n"
        "    assert list(narrow) == [1, 1, 1, 1, 1, 0, 1], (d, narrow)\n"
        "    assert h[0] == h[2] and len(set(h)) == 6, (d, h)\n"
        "    assert list(h) == list(ref), d\n"
        "    out.append(list(h))\n"
        "print(repr(out))\n")

    same_on_every_kernel_path(script)


def test_segments_of_byte_codes_write_the_same_frames_on_every_kernel_path(tmp_path):
    """A bounded segment whose codes all fit a byte (rel 0.03 of values in [-1, 1]) takes the
    AVX2 quantizer's runs of byte codes, tested once a run; a run with a lane it is not sure of
    (a value on a rounding edge, NaN, Inf) is done again the general way, from the middle of a
    row or of a dithered tile on. The frames are the portable loops' bytes at row lengths below,
    at and above a run (256), with and without a rest of 32, dithered or not, and they decode
    within the bound."""
    script = tmp_path / "byte_runs.py"
    script.write_text(
        "import hashlib, math, torch, hvd_lossy\n"
        "torch.manual_seed(3)\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "for d in (16, 32, 100, 128, 288, 640):\n"
        "    x = torch.rand(300, d) * 2 - 1\n"
        "    x[0, 0], x[0, 1] = -1.0, 1.0  # the range, so that the edges below stay edges\n"
        "    step = 2 * hvd_lossy.frame_info(hvd_lossy.compress(x, 0.03))['eb_abs']\n"
        "    edges = ((torch.randint(-7, 7, (60,)).double() + 0.5) * step).float()\n"
        "    x.view(-1)[torch.randint(2, x.numel(), (60,))] = edges\n"
        "    x[7, d // 2], x[9, d - 1] = math.nan, math.inf\n"
        "    x[20:40] = x[0:20]  # repeats\n"
        "    for dither in (None, 5):\n"
        "        for rows in ([300], [100, 200]):\n"
        "            f, _ = hvd_lossy.compress_chunks(x, rows, 0.03, dither=dither)\n"
        "            y = hvd_lossy.decompress(f)\n"
        "            err = (x.double() - y.double()).abs()[torch.isfinite(x)].max().item()\n"
        "            assert err <= step / 2, (d, dither, err, step)\n"
        "            out.append(hashlib.sha1(f.numpy().tobytes()).hexdigest())\n"
        "print(repr(out))\n")

    same_on_every_kernel_path(script)


def test_the_range_pass_leaves_out_nan_and_inf_wherever_they_fall_on_every_kernel_path(tmp_path):
    """The finite range (the relative bound's base and STAT_MIN/MAX) is the same on every kernel
    path and equals numpy's over the finite elements, with NaN and +-Inf at the start, middle and
    end of the AVX2 pass's 2048-element blocks and of its 32-, 16- and 8-element steps, at lengths on
    both sides of those sizes, and with nothing finite at all."""
    script = tmp_path / "ranges.py"
    script.write_text(
        "import numpy as np, torch, hvd_lossy\n"
        "hvd_lossy.set_num_threads(1)\n"
        "rng = np.random.default_rng(5)\n"
        "out, checked = [hvd_lossy._C.simd_level()], 0\n"
        "for n in list(range(1, 41)) + [2047, 2048, 2049, 4096 + 15, 6144 + 9, 20000]:\n"
        "    base = (rng.standard_normal(n) * 3).astype(np.float32)\n"
        "    places = sorted({0, n // 2, n - 1, min(n - 1, 2047), min(n - 1, 2048),\n"
        "                     min(n - 1, 15), min(n - 1, 16), min(n - 1, 8),\n"
        "                     min(n - 1, 31), min(n - 1, 32), min(n - 1, 33)})\n"
        "    for special in (np.nan, np.inf, -np.inf, None):\n"
        "        for p in places:\n"
        "            x = base.copy()\n"
        "            if special is not None:\n"
        "                x[p] = special\n"
        "            else:\n"
        "                x[p] = 1e30 if p % 2 else -1e30  # an extreme finite element counts\n"
        "            s = hvd_lossy.piece_stats(torch.from_numpy(x), [n], ranges_only=True)[0]\n"
        "            fin = x[np.isfinite(x)]\n"
        "            want = (float(fin.min()), float(fin.max())) if fin.size else None\n"
        "            got = (s[hvd_lossy.STAT_MIN], s[hvd_lossy.STAT_MAX])\n"
        "            assert (np.isnan(got).all() if want is None else got == want), (n, p, special, got, want)\n"
        "            out.append(got)\n"
        "            checked += 1\n"
        "    x = np.full(n, np.nan, np.float32)\n"
        "    x[::3] = np.inf\n"
        "    s = hvd_lossy.piece_stats(torch.from_numpy(x), [n], ranges_only=True)[0]\n"
        "    assert np.isnan(s[hvd_lossy.STAT_MIN]) and np.isnan(s[hvd_lossy.STAT_MAX]), n\n"
        "print(repr([checked] + [repr(v) for v in out]))\n")

    runs = on_every_kernel_path(script)
    assert runs[0][0] > 46 * 4 * 3
    assert runs[2][1] == "0" and runs[1][1] <= "1" and runs[0][1] >= runs[1][1]
    assert runs[0][2:] == runs[1][2:] == runs[2][2:]


def test_float32_kernels_match_the_scalar_rule_at_the_edges_of_single_precision(tmp_path):
    """The AVX2 quantizer decides in single precision where it is sure and in double where an
    element lies near a rounding edge (quantize_f32_fast.h): codes, outliers and decodes must
    be the scalar rule's on every kernel path, for elements placed at the edges themselves
    (ties and a few ulps either side of k + 1/2 steps, |x / step| around 2^12, subnormals, NaN,
    +-Inf) and at steps inside and outside [2^-100, 2^100], with and without dither."""
    from tests._hooks import OUT

    script = tmp_path / "edges.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(OUT)!r})\n"
        "import numpy as np, _hl_test, hvd_lossy\n"
        "rng = np.random.default_rng(3)\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "near = np.array([0, 1e-9, 2**-12, 2**-10, 2**-9, 2**-8.5, 2**-8, 1e-3, 0.01])\n"
        "near = np.concatenate([near, -near])\n"
        "checked = 0\n"
        "for eb in (0.03, 1e-4, 3e-7, 2.0**-102, 2.0**-99, 2.0**98, 2.0**101, 1e-30, 1e30):\n"
        "    step = 2 * eb\n"
        "    k = rng.integers(-5000, 5000, 4000).astype(np.float64)\n"
        "    edges = (k + 0.5 + rng.choice(near, k.size)) * step\n"
        "    spread = rng.standard_normal(4000) * step * 10.0 ** rng.uniform(-1, 4, 4000)\n"
        "    x = np.concatenate([edges, spread]).astype(np.float32)\n"
        "    x[:8] = [np.nan, np.inf, -np.inf, 1e-45, -1e-40, 0.0, -0.0, 3.4e38]\n"
        "    x = x[rng.permutation(x.size)].tolist()\n"
        "    for dither, first, seed in ((False, 0, 0), (True, 0, 7), (True, 2**32 - 4001, 2**24 - 1)):\n"
        "        z, z_ref, y, y_ref = _hl_test.quantized_f32(x, eb, dither, first, seed)\n"
        "        assert z == z_ref, (eb, dither, [(a, b, c) for a, b, c in zip(x, z, z_ref) if b != c][:5])\n"
        "        assert [float(v).hex() for v in y] == [float(v).hex() for v in y_ref], (eb, dither)\n"
        "        checked += len(z)\n"
        "        out.append(hash(tuple(z)))\n"
        "print(repr([checked] + out))\n")

    runs = on_every_kernel_path(script)
    assert runs[0][0] == 9 * 3 * 8000
    assert runs[2][1] == 0 and runs[1][1] <= 1 and runs[0][1] >= runs[1][1]
    assert runs[0][2:] == runs[1][2:] == runs[2][2:]


def test_float32_kernels_told_the_range_match_the_scalar_rule_at_the_narrowed_edges(tmp_path):
    """Told the largest |element| (the range pass's max_abs), the single-precision lanes trust
    themselves up to 2^-21 * L of a rounding edge, L the least power of two above
    max_abs / step + 1 (quantize_f32_fast.h), where they would otherwise send 2^-9 to the double
    kernel. Elements either side of that margin, and on the edge itself, at L from 2 to 4096
    (beyond 4000 the lanes check |x / step| themselves), with and without dither: codes,
    outliers and decodes are the scalar rule's on every kernel path, so every element is within
    the bound."""
    from tests._hooks import OUT

    script = tmp_path / "bounded_edges.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(OUT)!r})\n"
        "import numpy as np, _hl_test, hvd_lossy\n"
        "rng = np.random.default_rng(5)\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "checked = 0\n"
        "for eb in (0.03, 1e-4, 7.5):\n"
        "    step = 2 * eb\n"
        "    for L in (2, 16, 256, 4096):\n"
        "        m = 2.0 ** -21 * L\n"
        "        near = np.array([0, 1e-12, m / 4, m / 2, m * 0.999, m, m * 1.001, 2 * m, 2.0 ** -9])\n"
        "        near = np.concatenate([near, -near])\n"
        "        top = L - 2\n"
        "        k = rng.integers(-top, top + 1, 3000).astype(np.float64)\n"
        "        x = ((k + 0.5 + rng.choice(near, k.size)) * step).astype(np.float32)\n"
        "        max_abs = float(np.abs(x).max())\n"
        "        for dither, first, seed in ((False, 0, 0), (True, 0, 7), (True, 2**32 - 1001, 99)):\n"
        "            z, z_ref, y, y_ref = _hl_test.quantized_f32(x.tolist(), eb, dither, first, seed, max_abs)\n"
        "            assert z == z_ref, (eb, L, dither, [(a, b, c) for a, b, c in zip(x, z, z_ref) if b != c][:5])\n"
        "            assert [float(v).hex() for v in y] == [float(v).hex() for v in y_ref], (eb, L, dither)\n"
        "            checked += len(z)\n"
        "            out.append(hash(tuple(z)))\n"
        "print(repr([checked] + out))\n")

    runs = on_every_kernel_path(script)
    assert runs[0][0] == 3 * 4 * 3 * 3000
    assert runs[0][2:] == runs[1][2:] == runs[2][2:]


def test_float32_dequantizers_match_the_scalar_rule_where_single_precision_takes_over(tmp_path):
    """Where a step has few significant bits (a frame's has at most 16), the float32 decoders
    reconstruct in single precision (kernels_scalar.h f32_exact_codes): q * step and, with
    dither, one fused multiply-add; elsewhere in double. Their output must be the scalar
    rule's bit for bit on every kernel path: codes at and one past the largest the single form
    takes (|q| = 2^(24 - p), and 2^24 without dither), eight-code groups that mix them, steps of
    1 to 24 significant bits, steps at and past 2^-100 and 2^100, and a step that no float
    holds."""
    from tests._hooks import OUT

    script = tmp_path / "dequantize.py"
    script.write_text(
        "import sys, random, zlib\n"
        f"sys.path.insert(0, {str(OUT)!r})\n"
        "import _hl_test, hvd_lossy\n"
        "rng = random.Random(11)\n"
        "zig = lambda q: (q << 1) ^ (q >> 31)\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "checked = 0\n"
        "steps = []\n"
        "for p in (1, 2, 8, 15, 16, 17, 23, 24):\n"
        "    for e in (-100, -99, -40, -7, 0, 5, 76):\n"
        "        m = rng.randrange(2 ** (p - 1), 2 ** p) | 1 if p > 1 else 1\n"
        "        steps.append((p, m * 2.0 ** (e - p + 1)))\n"
        "steps += [(53, 0.1), (1, 2.0 ** -101), (16, 65535 * 2.0 ** -116), (1, 2.0 ** 100),\n"
        "          (1, 2.0 ** 101), (16, 65535 * 2.0 ** 85)]\n"
        "for p, step in steps:\n"
        "    for dither in (False, True):\n"
        "        top = 2 ** (24 - min(p, 24)) if dither else 2 ** 24\n"
        "        edge = [top, -top, top - 1, 1 - top, top + 1, -top - 1, 0, 1, -1]\n"
        "        qs = []\n"
        "        for g in range(400):\n"
        "            kind = g % 4  # small codes, edges only, one edge among small, any width\n"
        "            for _ in range(8):\n"
        "                if kind == 0: q = rng.randint(-min(top, 255), min(top, 255) - 1)\n"
        "                elif kind == 1: q = rng.choice(edge)\n"
        "                elif kind == 2: q = rng.choice(edge) if rng.random() < 0.15 else rng.randint(-3, 3)\n"
        "                else: q = rng.randint(-2 ** 26, 2 ** 26)\n"
        "                qs.append(q)\n"
        "        z = [zig(q) for q in qs]\n"
        "        for first, seed in ((0, 5), (2 ** 32 - 1601, 2 ** 24 - 1)):\n"
        "            y, y_ref = _hl_test.dequantized_f32(z, step, dither, first, seed)\n"
        "            bad = [(q, a.hex(), b.hex()) for q, a, b in zip(qs, y, y_ref) if a.hex() != b.hex()]\n"
        "            assert not bad, (p, step, dither, first, bad[:4])\n"
        "            checked += len(y)\n"
        "            out.append(zlib.crc32(' '.join(v.hex() for v in y).encode()))\n"
        "print(repr([checked] + out))\n")

    runs = on_every_kernel_path(script)
    assert runs[0][0] == (8 * 7 + 6) * 2 * 2 * 3200
    assert runs[2][1] == 0 and runs[1][1] <= 1 and runs[0][1] >= runs[1][1]
    assert runs[0][2:] == runs[1][2:] == runs[2][2:]


def test_outputs_written_with_streaming_stores_are_the_same_on_every_kernel_path(tmp_path):
    """From 1 MiB of output on, the decoder writes rows with streaming stores (its one-thread
    sweep and its threaded row copy) and so does an all-to-all's copy of its own rows
    (`copy_rows`): the same bytes as the portable path's memcpy, at outputs just below and above
    that size, rows of 64, 128 and 512 bytes, destinations on and off a 64-byte line, and copies
    that leave every byte around them alone."""
    script = tmp_path / "streams.py"
    script.write_text(
        "import hashlib, torch, hvd_lossy\n"
        "g = torch.Generator().manual_seed(3)\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "digest = lambda t: hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()\n"
        "for dim in (16, 32, 128):\n"
        "    for rows in ((1 << 20) // (4 * dim) - 3, 3 * (1 << 20) // (8 * dim)):  # below, above\n"
        "        x = torch.randn(rows // 4 + 1, dim, generator=g)\n"
        "        x = x[torch.randint(0, x.shape[0], (rows,), generator=g)]  # repeated rows\n"
        "        frame = hvd_lossy.compress(x, 0.03)\n"
        "        for threads in (1, 2):\n"
        "            hvd_lossy.set_num_threads(threads)\n"
        "            for shift in (0, 1):  # an output 64-byte aligned, or one float past it\n"
        "                buf = torch.full((rows * dim + 32,), 7.0)\n"
        "                o = buf[16 + shift:16 + shift + rows * dim].view(rows, dim)\n"
        "                hvd_lossy.decompress(frame, out=o)\n"
        "                out.append(digest(buf))\n"
        "        hvd_lossy.set_num_threads(0)\n"
        "for n in (0, 100, 4096, (1 << 20) - 1, 1 << 20, (3 << 19) + 37):\n"
        "    for at in (0, 1, 63):\n"
        "        src = torch.randint(0, 256, (n + at,), dtype=torch.uint8, generator=g)[at:]\n"
        "        buf = torch.full((n + 128,), 9, dtype=torch.uint8)\n"
        "        hvd_lossy._codec.copy_rows(buf[at:at + n], src)\n"
        "        assert torch.equal(buf[at:at + n], src), (n, at)\n"
        "        assert (buf[:at] == 9).all() and (buf[at + n:] == 9).all(), (n, at)\n"
        "        out.append(digest(buf))\n"
        "print(repr(out))\n")

    same_on_every_kernel_path(script)


def test_decompress_into_a_given_tensor_reuses_it():
    x = torch.randn(64, 8)
    frame = hvd_lossy.compress(x, 0.01)
    out = torch.empty(64, 8)
    assert hvd_lossy.decompress(frame, out=out) is out
    assert torch.equal(out, hvd_lossy.decompress(frame))
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float32 tensor of shape \(64, 8\)"):
        hvd_lossy.decompress(frame, out=torch.empty(8, 64))
    with pytest.raises(ValueError, match="non-contiguous"):
        hvd_lossy.decompress(frame, out=torch.empty(8, 64).t())


def test_decompress_into_matches_the_frame_natively_and_writes_nothing_on_a_mismatch():
    """decompress(frame, out=) matches the frame's dtype and shape against out in its one native
    call (_C.decompress_as): a mismatch of either decodes nothing and raises the Python path's
    message; a corrupted frame raises FrameError; 0-row and 16-bit frames decode as before."""
    x = torch.randn(64, 8)
    frame = hvd_lossy.compress(x, 0.01)
    for wrong in (torch.full((8, 64), 7.0), torch.full((64, 8), 7.0, dtype=torch.float16),
                  torch.full((64, 4, 2), 7.0), torch.full((512,), 7.0)):
        with pytest.raises(ValueError, match="out must be a contiguous torch.float32 tensor"):
            hvd_lossy.decompress(frame, out=wrong)
        assert bool((wrong == 7).all())
    bad = frame.clone()
    bad[-1] ^= 1
    with pytest.raises(FrameError):
        hvd_lossy.decompress(bad, out=torch.empty(64, 8))
    for y in (torch.randn(0, 8), torch.randn(5, 3).to(torch.bfloat16), torch.randn(7).half()):
        f = hvd_lossy.compress(y, 0.01)
        out = torch.empty_like(y)
        assert hvd_lossy.decompress(f, out=out) is out
        assert torch.equal(out, hvd_lossy.decompress(f))


# ---- subtractive dither ---------------------------------------------------------------------

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=tensors(),
       eb=st.sampled_from([1e-6, 1e-3, 0.01, 0.03, 0.3]),
       mode=st.sampled_from(["rel", "abs"]),
       level=st.sampled_from([1, 2]),
       seed=st.integers(0, hvd_lossy.DITHER_SEEDS - 1))
def test_dithered_roundtrip_respects_error_bound_on_every_element(x, eb, mode, level, seed):
    frame = hvd_lossy.compress(x, eb, mode=mode, level=level, dither=seed)
    info, _ = assert_bound_and_specials(x, frame)
    assert info["dither_seed"] == (None if info["lossless"] else seed)
    assert info["n_unique"] == info["n_rows"]  # dithered frames are never deduplicated


@pytest.mark.parametrize("dtype", DTYPES)
def test_dither_keeps_values_below_the_bound_on_average(dtype):
    # Plain rounding sends every |x| < eb to 0; with dither the mean of many decoded copies of
    # a small value is the value (error uniform in [-eb, eb], independent of x).
    eb, n = 0.01, 200_000
    for value in (0.1 * eb, -0.37 * eb, 0.5 * eb, 1.3 * eb):
        x = torch.full((n // 8, 8), value, dtype=dtype)
        exact = x.double()[0, 0].item()
        plain = hvd_lossy.decompress(hvd_lossy.compress(x, eb, mode="abs")).double()
        dithered = hvd_lossy.decompress(hvd_lossy.compress(x, eb, mode="abs", dither=7)).double()
        assert (dithered - exact).abs().max().item() <= eb
        # standard error of the mean: eb / sqrt(3 n); allow 5 of them plus the dtype's rounding
        tolerance = 5 * eb / (3 * n) ** 0.5 + 2 * abs(exact) * 2.0 ** -8
        assert abs(dithered.mean().item() - exact) < tolerance, (value, dithered.mean().item())
        if abs(value) < eb:
            assert plain.abs().max().item() == 0.0  # the bias dither removes
        errors = (dithered - exact).flatten()
        assert errors.std().item() == pytest.approx(eb / 3 ** 0.5, rel=0.05)


def test_dither_seed_travels_in_the_frame_and_decides_the_bytes():
    x = torch.randn(64, 16)
    a, b = hvd_lossy.compress(x, 0.05, dither=5), hvd_lossy.compress(x, 0.05, dither=5)
    c = hvd_lossy.compress(x, 0.05, dither=6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert hvd_lossy.frame_info(a)["dither_seed"] == 5
    assert hvd_lossy.frame_info(hvd_lossy.compress(x, 0.05))["dither_seed"] is None
    assert not torch.equal(hvd_lossy.decompress(a), hvd_lossy.decompress(c))


def test_dither_turns_dedup_off_and_lossless_frames_carry_no_seed():
    x = torch.randn(4, 16).repeat(16, 1)
    assert hvd_lossy.frame_info(hvd_lossy.compress(x, 0.05))["n_unique"] == 4
    dithered = hvd_lossy.frame_info(hvd_lossy.compress(x, 0.05, dither=1))
    assert dithered["n_unique"] == 64
    lossless = hvd_lossy.frame_info(hvd_lossy.compress(x, 0.0, dither=1))
    assert lossless["lossless"] and lossless["dither_seed"] is None


def test_compress_chunks_gives_piece_i_seed_plus_i_modulo_2_to_the_24():
    x = torch.randn(30, 8)
    last = hvd_lossy.DITHER_SEEDS - 1
    buf, _ = hvd_lossy.compress_chunks(x, [10, 10, 10], 0.05, dither=last)
    assert [s["dither_seed"] for s in hvd_lossy.frame_info(buf)["segments"]] == [last, 0, 1]
    for got, piece, seed in zip(hvd_lossy.decompress(buf).split(10), x.split(10), (last, 0, 1)):
        assert torch.equal(got, hvd_lossy.decompress(hvd_lossy.compress(piece, 0.05, dither=seed)))


@pytest.mark.parametrize("dither", [-1, hvd_lossy.DITHER_SEEDS, True, 1.5, "7"])
def test_bad_dither_seed_raises_naming_the_value(dither):
    with pytest.raises(ValueError, match="dither"):
        hvd_lossy.compress(torch.ones(4), 0.1, dither=dither)
    with pytest.raises(ValueError, match="dither"):
        hvd_lossy.compress_chunks(torch.ones(4, 2), [2, 2], 0.1, dither=dither)


# ---- native entry points of the lean exchange (compress_into / decompress_into) --------------

from hvd_lossy import _C, _codec  # noqa: E402
import _hl_test  # the test-only native hooks (tests/_hooks.py)

SENTINEL = 0xA5


def compress_into(x, rows, groups, prefix, eb=0.03, level=1, dither=None, threads=0, cap=None):
    """Calls _C.compress_into on x (pieces of `rows`) into a buffer filled with SENTINEL; returns
    (buffer, sizes)."""
    trailing = list(x.shape[1:])
    need = _codec.max_grouped_bytes(rows, trailing, groups, prefix)
    out = torch.full((need if cap is None else cap,), SENTINEL, dtype=torch.uint8)
    sizes = _C.compress_into(x.data_ptr(), _codec._DTYPE_CODES[x.dtype], rows, trailing,
                             [eb] * len(rows), 1, level, True, groups, prefix, out.data_ptr(),
                             out.numel(), threads, -1 if dither is None else dither)
    return out, list(sizes)


def group_frames(x, rows, groups, **kw):
    """The frame of each group (None for an empty one): compress_chunks of its pieces."""
    frames, k, at = [], 0, 0
    for g in groups:
        r = rows[k:k + g]
        frames.append(hvd_lossy.compress_chunks(x[at:at + sum(r)], r, 0.03, **kw)[0] if g else None)
        k, at = k + g, at + sum(r)
    return frames


def expected_layout(frames, prefix):
    """[(prefix start, frame start, frame or None) per group] of the documented layout, and its
    end."""
    layout, at = [], 0
    for f in frames:
        layout.append((at, at + prefix, f))
        at += prefix + (f.numel() if f is not None else 0)
    return layout, at


def lookups(rows, dim, dtype=torch.float32, seed=0, distinct=40):
    g = torch.Generator().manual_seed(seed)
    table = (torch.rand(distinct, dim, generator=g) * 2 - 1) * 0.05
    return table[torch.randint(0, distinct, (rows,), generator=g)].to(dtype)


@pytest.mark.parametrize("groups", [[2, 0, 3], [0, 5], [5, 0], [1, 1, 1, 1, 1], [0, 0, 5, 0]])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compress_into_lays_out_prefix_then_the_groups_frame_with_no_gaps(groups, dtype):
    rows = [30, 0, 17, 64, 5]
    x = lookups(sum(rows), 8, dtype)
    prefix = 24
    out, sizes = compress_into(x, rows, groups, prefix)
    layout, end = expected_layout(group_frames(x, rows, groups), prefix)
    assert end == len(groups) * prefix + sum(sizes)
    k = 0
    for (start, at, frame), g in zip(layout, groups):
        assert (out[start:start + prefix] == SENTINEL).all(), "a prefix was written"
        if frame is not None:
            assert torch.equal(out[at:at + frame.numel()], frame)
            assert sum(sizes[k:k + g]) == frame.numel()  # a group's sizes add up to its frame
        k += g
    assert (out[end:] == SENTINEL).all(), "bytes past the send buffer were written"


@pytest.mark.parametrize("dither, level", [(None, 2), (123, 1), (2**24 - 1, 2)])
def test_compress_into_frame_equals_compress_chunks_frame_for_every_mode(dither, level):
    rows = [100, 3, 0, 250]
    x = lookups(sum(rows), 16, seed=3)
    ref, _ = hvd_lossy.compress_chunks(x, rows, 0.03, level=level, dither=dither)
    for threads in (1, 2):
        out, sizes = compress_into(x, rows, [4], 0, level=level, dither=dither, threads=threads)
        assert len(sizes) == 4 and torch.equal(out[:sum(sizes)], ref)


def test_compress_into_with_no_pieces_leaves_only_the_prefixes():
    x = torch.empty(0, 4)
    out, sizes = compress_into(x, [], [0, 0], 16)
    assert sizes == [] and (out == SENTINEL).all()


def test_max_grouped_bytes_is_the_prefixes_plus_every_worst_case_frame():
    rows, trailing = [10, 0, 7], [3, 4]
    worst = sum(hvd_lossy.max_frame_bytes(r * 3, 4, 3) for r in rows)
    assert _codec.max_grouped_bytes(rows, trailing, [1, 1, 1], 40) == 3 * 40 + worst
    # pieces sharing a frame share its header
    assert _codec.max_grouped_bytes(rows, trailing, [1, 2], 40) < 2 * 40 + worst


@pytest.mark.parametrize("groups, cap, match", [
    ([2, 2], None, r"groups hold 4 frames, expected one per piece \(3\)"),
    ([4, -1], None, "group 1 has -1 frames, expected >= 0"),
    ([3], 100, "output buffer holds 100 bytes, the frames may need"),
])
def test_compress_into_refuses_bad_groups_or_a_small_buffer(groups, cap, match):
    x = lookups(30, 8)
    rows = [10, 10, 10]
    trailing = [8]
    cap = cap or 1 << 16
    out = torch.empty(cap, dtype=torch.uint8)
    with pytest.raises(ValueError, match=match):
        _C.compress_into(x.data_ptr(), 0, rows, trailing, [0.03] * 3, 1, 1, True, groups, 8,
                         out.data_ptr(), cap)


def decompress_into(buf, sources, out, dtype=None, trailing=None, threads=0):
    """_C.decompress_into's messages (None per source that decoded); dtype and trailing default
    to out's, and may be given apart from it to test the native checks."""
    dtype = out.dtype if dtype is None else dtype
    trailing = list(out.shape[1:]) if trailing is None else trailing
    errors = _C.decompress_into(buf.data_ptr(), buf.numel(), sources, _codec._DTYPE_CODES[dtype],
                                trailing, out.data_ptr(), out.numel() * out.element_size(), threads)
    return [None if e is None else e[0] for e in errors]


def grouped_sources(sizes, groups, rows, prefix):
    """(offset, length, rows) of each group of a compress_into buffer."""
    sources, at, k = [], 0, 0
    for g in groups:
        at += prefix
        length = sum(sizes[k:k + g])
        sources.append((at, length, sum(rows[k:k + g])))
        at += length
        k += g
    return sources


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dither", [None, 5])
@pytest.mark.parametrize("threads", [1, 2])
def test_decompress_into_decodes_each_sources_frames_at_consecutive_rows(dtype, dither, threads):
    rows, groups, prefix = [40, 0, 13, 77, 9, 0], [2, 0, 3, 1], 16
    x = lookups(sum(rows), 12, dtype, seed=4)
    buf, sizes = compress_into(x, rows, groups, prefix, dither=dither)
    out = torch.full_like(x, float("nan"))
    sources = grouped_sources(sizes, groups, rows, prefix)
    assert decompress_into(buf, sources, out, threads=threads) == [None] * len(groups)
    ref, ref_sizes = hvd_lossy.compress_chunks(x, rows, 0.03, dither=dither)
    assert torch.equal(out, torch.cat(hvd_lossy.decompress_chunks(ref, ref_sizes)))


def test_decompress_into_of_one_dimensional_pieces_and_of_nothing():
    x = torch.randn(9)
    frames = [hvd_lossy.compress(x[:2], 0.0), hvd_lossy.compress(x[2:], 0.0)]
    buf, sizes = torch.cat(frames), [f.numel() for f in frames]
    out = torch.empty(9)
    assert decompress_into(buf, [(0, sizes[0], 2), (sizes[0], sizes[1], 7)], out, trailing=[]) == [None, None]
    assert torch.equal(out, x)
    empty = torch.empty(0, 4)
    assert decompress_into(buf, [(3, 0, 0)], empty) == [None]
    assert decompress_into(buf, [], empty) == []


def three_sources(dtype=torch.float32):
    """A buffer of three sources of two frames each, their sources and the rows they hold."""
    rows = [20, 10, 5, 25, 30, 0]
    x = lookups(sum(rows), 8, dtype, seed=9)
    frames = [hvd_lossy.compress_chunks(p, [p.shape[0]], 0.03)[0] for p in x.split(rows)]
    sizes = [f.numel() for f in frames]
    return x, torch.cat(frames), sizes, grouped_sources(sizes, [2, 2, 2], rows, 0)


def test_decompress_into_reports_a_corrupted_source_and_decodes_the_others():
    x, buf, sizes, sources = three_sources()
    ref = torch.cat(hvd_lossy.decompress_chunks(buf, sizes))
    buf[sources[1][0] + sources[1][1] - 5] ^= 0x40  # in source 1's last frame
    out = torch.zeros_like(x)
    errors = decompress_into(buf, sources, out)
    assert errors[0] is None and errors[2] is None
    assert errors[1].startswith("source 1") and "checksum" in errors[1]
    assert torch.equal(out[:30], ref[:30]) and torch.equal(out[60:], ref[60:])


def test_decompress_into_says_whether_a_source_was_corrupt_or_disagrees_with_what_was_asked():
    x, buf, sizes, sources = three_sources()
    buf[sources[1][0] + sources[1][1] - 5] ^= 0x40  # source 1: corrupt
    moved = [sources[0], sources[1], (sources[2][0], sources[2][1], sources[2][2] + 2)]
    out = torch.zeros(x.shape[0] + 2, x.shape[1])
    errors = hvd_lossy.decompress_into(buf, moved, out)  # source 2: asked for 2 rows too many
    assert errors[0] is None
    assert "checksum" in errors[1] and errors[1].mismatch is False
    assert "expected" in errors[2] and errors[2].mismatch is True


@pytest.mark.parametrize("change, match", [
    (lambda s: [s[0], (s[1][0], s[1][1] - 1, s[1][2]), s[2]], "truncated"),
    (lambda s: [s[0], (s[1][0], s[1][1] + 1, s[1][2]), s[2]], "truncated: 1 bytes, a frame has"),
    (lambda s: [s[0], (s[1][0], s[1][1], s[1][2] + 2), (s[2][0], s[2][1], s[2][2] - 2)],
     "hold 30 rows, expected 32"),
    (lambda s: [s[0], (s[1][0], s[1][1], s[1][2] - 6), (s[2][0], s[2][1], s[2][2] + 6)],
     "frame holds 25 rows, only 19 of the source's 24 are left"),
])
def test_decompress_into_refuses_frames_that_do_not_fill_their_source(change, match):
    x, buf, sizes, sources = three_sources()
    errors = decompress_into(buf, change(sources), torch.zeros_like(x))
    assert errors[0] is None
    assert errors[1].startswith("source 1") and re.search(match, errors[1]), errors[1]


def test_decompress_into_refuses_a_frame_announcing_more_rows_before_allocating():
    # A forged frame (valid checksum) claiming 2**40 rows of 8: refused from its header alone.
    from tests._format_ref import varint
    body = bytes([2 << 2]) + varint(8) + varint(1) + bytes([0x02]) + varint(1 << 40) \
        + varint(1) + b"\x00"  # f32 (r, 8), one lossless segment of 2^40 rows, 1 code byte
    total = 7 + 1 + len(body)
    rest = bytearray(varint(total) + body)
    crc = _hl_test.crc32c(torch.frombuffer(rest, dtype=torch.uint8).data_ptr(), len(rest))
    forged = torch.frombuffer(bytearray(b"HV\x02" + crc.to_bytes(4, "little") + rest),
                              dtype=torch.uint8)
    errors = decompress_into(forged, [(0, forged.numel(), 64)], torch.zeros(64, 8))
    assert errors[0].startswith("source 0, frame 0 at byte 0: frame")


@pytest.mark.parametrize("dtype, out_shape, match", [
    (torch.float16, (90, 8), "frame holds dtype code 0, expected 1"),
    (torch.float32, (90, 4, 2), r"frame has shape \(\d+, 8\), expected \(rows, 4, 2\)"),
    (torch.float32, (720,), r"frame has shape \(\d+, 8\), expected \(rows\)"),
])
def test_decompress_into_refuses_frames_of_another_dtype_or_row_shape(dtype, out_shape, match):
    x, buf, sizes, sources = three_sources()
    out = torch.zeros(out_shape, dtype=dtype)
    if out.dim() == 1:  # 1-d pieces: a source's rows are its elements
        sources = [(o, n, r * 8) for o, n, r in sources]
    errors = decompress_into(buf, sources, out)
    assert all(e is not None and re.search(match, e) for e in errors), errors


@pytest.mark.parametrize("sources, out_rows, match", [
    ([(0, 10, -1)], 0, "source 0 has -1 rows, expected >= 0"),
    ([(10, 1 << 20, 5)], 5, r"source 0 spans bytes \[10, 1048586\), past the buffer"),
    ([(0, 0, 0)], 3, "output buffer holds 96 bytes, the 0 rows of the sources take 0"),
])
def test_decompress_into_raises_for_bad_arguments(sources, out_rows, match):
    buf = hvd_lossy.compress(torch.randn(5, 8), 0.03)
    with pytest.raises(ValueError, match=match):
        decompress_into(buf, sources, torch.zeros(out_rows, 8))


@pytest.mark.parametrize("pieces", [
    [torch.randn(7, 3), torch.randn(5).half(), torch.randn(2, 3, 4).bfloat16(),
     torch.tensor(2.5), torch.zeros(0, 6)],  # mixed: each part on its own cache line
    [torch.randn(2, 3, 4), torch.randn(1, 3, 4), torch.randn(0, 3, 4)],  # pieces of one tensor
    [torch.randn(4), torch.randn(0), torch.randn(9)],
    [torch.randn(5, 0), torch.randn(3, 0)],
], ids=["mixed", "pieces", "1d", "empty-rows"])
def test_decompress_chunks_of_frames_of_several_dtypes_and_shapes(pieces):
    buf = torch.cat([hvd_lossy.compress(p, 0.0) for p in pieces])
    for parts in (hvd_lossy.decompress_chunks(buf), hvd_lossy.decompress_chunks(buf, hvd_lossy.split_frames(buf))):
        assert len(parts) == len(pieces)
        for got, want in zip(parts, pieces):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
            assert got.is_contiguous()


def test_decompress_chunks_raises_frame_error_naming_the_bad_frame():
    frames = [hvd_lossy.compress(p, 0.01) for p in torch.randn(30, 4).split(10)]
    buf, sizes = torch.cat(frames), [f.numel() for f in frames]
    buf[sizes[0] + sizes[1] - 2] ^= 1  # the last byte of frame 1
    with pytest.raises(FrameError, match="checksum"):
        hvd_lossy.decompress_chunks(buf, sizes)
    with pytest.raises(FrameError, match="truncated"):
        hvd_lossy.decompress_chunks(buf[:-3])


def test_output_cache_reuses_a_block_only_once_nothing_references_it():
    limit, _ = _codec.output_cache_bytes()
    frame = hvd_lossy.compress(torch.randn(4096, 64), 0.01)
    nbytes = 4096 * 64 * 4
    try:
        _codec.set_output_cache_bytes(0)
        assert _codec.output_cache_bytes() == (0, 0)
        hvd_lossy.decompress(frame)
        assert _codec.output_cache_bytes()[1] == 0  # a disabled cache keeps nothing
        _codec.set_output_cache_bytes(64 << 20)
        a = hvd_lossy.decompress(frame)
        block_a = a.data_ptr()
        view = a[10:20]
        del a
        assert _codec.output_cache_bytes()[1] == 0  # the view still holds the block
        b = hvd_lossy.decompress(frame)
        assert b.data_ptr() != block_a
        del view
        assert _codec.output_cache_bytes()[1] == nbytes  # now it is free, so kept
        c = hvd_lossy.decompress(frame)
        assert c.data_ptr() == block_a and _codec.output_cache_bytes()[1] == 0
        assert torch.equal(b, c)
    finally:
        _codec.set_output_cache_bytes(limit)
    with pytest.raises(ValueError, match="output cache size must be an int >= 0"):
        _codec.set_output_cache_bytes(-1)


def test_codec_benchmark_reports_speeds_beside_the_fp16_cast_and_thread_scaling(tmp_path):
    import json

    from hvd_lossy.bench import codec as bench

    out = tmp_path / "codec.json"
    assert bench.main(["--quick", "--workloads", "realistic", "criteo", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    runs = {(r["workload"], r["method"]): r for r in results["runs"]}
    assert set(runs) == {(w, m) for w in ("realistic", "criteo")
                         for m in ("L1", "L1 dither", "L1 no dedup", "L1 no dedup dither")}
    for r in runs.values():
        assert r["max_error_over_bound"] <= 1
        assert r["compress_vs_cast"] == pytest.approx(r["compress_GBps"] / r["fp16_cast_GBps"])
        assert r["decompress_new_vs_cast"] == pytest.approx(r["decompress_new_GBps"] / r["fp16_back_GBps"])
    realistic = runs[("realistic", "L1")]
    assert 0.2 < realistic["distinct_row_fraction"] < 0.4  # duplicates like real lookups
    assert 10 < realistic["ratio"] < 25
    assert [t["pieces"] for t in results["threads"]] == [52, 52]
    assert set(results["fresh_memory"]) >= {"decompress_cached_block_GBps",
                                            "decompress_fresh_huge_pages_GBps",
                                            "decompress_torch_empty_GBps"}
    for t in results["threads"]:
        assert t["compress_speedup_2t"] == pytest.approx(t["compress_GBps_2t"] / t["compress_GBps_1t"])
    # every figure travels with the kernel path that produced it and the CPU's SIMD flags
    assert results["cpu"]["simd_level"] == hvd_lossy._C.simd_level()
    assert isinstance(results["cpu"]["simd_flags"], list)


def test_codec_benchmark_measures_each_dim_and_distinct_share_against_the_cast_into(tmp_path):
    import json

    from hvd_lossy.bench import codec as bench

    out = tmp_path / "codec.json"
    assert bench.main(["--quick", "--workloads", "realistic", "--dims", "32", "128",
                       "--distinct", "0.30", "0.55", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    runs = {(r["workload"], r["method"]): r for r in results["runs"]}
    names = [f"realistic d{d} {s}%" for d in (32, 128) for s in (30, 55)]
    assert {w for w, _ in runs} == set(names)
    for name, share in zip(names, (0.30, 0.55) * 2):
        assert runs[(name, "L1")]["distinct_row_fraction"] == pytest.approx(share, abs=0.03)
        for method in ("L1", "L1 dither"):
            r = runs[(name, method)]
            assert r["max_error_over_bound"] <= 1
            assert r["compress_vs_cast_into"] == pytest.approx(r["compress_GBps"]
                                                               / r["fp16_cast_into_GBps"])
    assert results["cpu"]["simd_level"] == hvd_lossy._C.simd_level()


def test_a_distinct_share_outside_0_to_1_is_refused():
    from hvd_lossy.bench import codec as bench

    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit) as e:
            bench.main(["--distinct", bad])
        assert e.value.code == 2


def test_every_thread_count_writes_the_same_frames_on_the_parallel_paths():
    """Tensors past the encoder's one-thread size (65,536 elements), dithered and without dedup
    (tiles quantized by several threads, their largest code combined), with dedup, with codes
    above a byte in some tiles only, and a call of many small pieces (each on one thread): the
    same bytes with 1, 2 and 3 threads, and the same values back."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6000, 32, generator=g) * 0.05
    x[4500:4510] *= 300  # a few tiles whose codes need more than a byte
    table = torch.randn(900, 32, generator=g)
    lookups = table[torch.randint(0, 900, (6000,), generator=g)]
    calls = [lambda: hvd_lossy.compress_chunks(x, [6000], 0.01, dither=5)[0],
             lambda: hvd_lossy.compress_chunks(x, [6000], 0.01, dedup=False)[0],
             lambda: hvd_lossy.compress_chunks(lookups, [6000], 0.03)[0],
             lambda: hvd_lossy.compress_chunks(lookups, [64] * 90 + [240], 0.03)[0]]
    before = hvd_lossy.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 3):
            hvd_lossy.set_num_threads(n)
            frames = [call() for call in calls]
            runs.append((frames, [hvd_lossy.decompress(f) for f in frames]))
    finally:
        hvd_lossy.set_num_threads(before)
    for frames, back in runs[1:]:
        for a, b in zip(frames, runs[0][0]):
            assert torch.equal(a, b)
        for a, b in zip(back, runs[0][1]):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_forked_child_compresses_and_decodes_on_its_own_threads(tmp_path):
    """The pool of helper threads does not survive fork(); the child starts its own (rather than
    counting on helpers it does not have, or locks one of them may have held) and gets the same
    bytes."""
    import subprocess
    import sys

    script = tmp_path / "fork.py"
    script.write_text(
        "import os, sys, torch, hvd_lossy\n"
        "hvd_lossy.set_num_threads(2)\n"
        "x = torch.randn(52 * 64, 16)\n"
        "ref, sizes = hvd_lossy.compress_chunks(x, [64] * 52, 0.03)  # the parent's helpers start\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    buf, _ = hvd_lossy.compress_chunks(x, [64] * 52, 0.03)\n"
        "    threads = len(os.listdir('/proc/self/task'))  # the child's own helper has started\n"
        "    same = torch.equal(buf, ref) and torch.equal(torch.cat(hvd_lossy.decompress_chunks(buf)),\n"
        "                                                torch.cat(hvd_lossy.decompress_chunks(ref)))\n"
        "    os.write(w, f'{same} {threads}'.encode())\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "got = os.read(r, 16)\n"
        "os.waitpid(pid, 0)\n"
        "sys.stdout.write(got.decode())\n")
    import os
    import pathlib
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.stdout == "True 2", out.stderr


def _rss():
    import os
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_decode_larger_than_the_cache_limit_gives_its_memory_back():
    """One huge call does not pin its memory for the rest of the run: what the output cache
    may keep is bounded by set_output_cache_bytes (default 256 MiB), and a block over it is
    returned to the system once nothing references it."""
    import gc
    limit, _ = _codec.output_cache_bytes()
    frame = hvd_lossy.compress(torch.ones(1 << 14, 1024), 0.01)  # 64 MiB of one repeated row
    try:
        _codec.set_output_cache_bytes(8 << 20)
        before = _rss()
        y = hvd_lossy.decompress(frame)
        assert _rss() - before >= 60 << 20  # the decode really took its 64 MiB
        del y
        gc.collect()
        assert _rss() - before < 16 << 20 and _codec.output_cache_bytes()[1] <= 8 << 20
    finally:
        _codec.set_output_cache_bytes(limit)


def test_output_cache_lends_a_kept_block_only_to_a_request_of_half_its_size_or_more():
    """A small decode does not take a large kept block: it would stay tied up there while the
    next large decode maps fresh memory (native/cpu/blocks.h's Shelf, which the codec's scratch
    pool uses too)."""
    limit, _ = _codec.output_cache_bytes()
    try:
        _codec.set_output_cache_bytes(0)  # empty the cache
        _codec.set_output_cache_bytes(256 << 20)
        big = _codec.empty([(32 << 20) // 4], torch.float32)
        kept = big.data_ptr()
        del big
        assert _codec.output_cache_bytes()[1] == 32 << 20
        small = _codec.empty([(15 << 20) // 4], torch.float32)
        assert small.data_ptr() != kept and _codec.output_cache_bytes()[1] == 32 << 20
        half = _codec.empty([(16 << 20) // 4], torch.float32)
        assert half.data_ptr() == kept and _codec.output_cache_bytes()[1] == 0
        del small, half
    finally:
        _codec.set_output_cache_bytes(limit)


def _advised_huge(address):
    """Whether the mapping holding `address` is advised MADV_HUGEPAGE (smaps' VmFlags "hg")."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux smaps only")
def test_output_blocks_take_huge_pages_only_from_16_mib():
    """A training's decoded outputs (a few MB a call) are on 4 KiB pages: on a VM a fresh
    transparent huge page cost 5-15 ms to touch first, 55-105 ms on a lossy run's first step.
    Blocks from 16 MiB, beyond the TLB's reach in small pages, are advised huge pages."""
    limit, _ = _codec.output_cache_bytes()
    try:
        _codec.set_output_cache_bytes(0)  # fresh blocks, none from the cache
        small = _codec.empty([(3 << 20) // 4], torch.float32)  # 3 MiB: mapped on its own
        large = _codec.empty([(16 << 20) // 4], torch.float32)
        assert not _advised_huge(small.data_ptr())
        if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):  # a kernel with THP
            assert _advised_huge(large.data_ptr())
    finally:
        _codec.set_output_cache_bytes(limit)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_piece_stats_gives_each_pieces_finite_range_distinct_rows_and_moments(dtype):
    base = torch.randn(30, 24)
    base[15:, :6] = base[0, :6]  # rows that differ only after their first columns are distinct
    x = base[torch.randint(0, 30, (90,), generator=torch.Generator().manual_seed(5))].to(dtype)
    x[3, 2], x[50, 0], x[51, 7] = float("nan"), float("inf"), float("-inf")
    rows = [40, 1, 49, 0]
    got = hvd_lossy.piece_stats(x, rows)
    assert got.shape == (4, hvd_lossy.STATS_PER_PIECE)
    at = 0
    for r, row in zip(rows, got):
        piece = x[at:at + r].double()
        at += r
        finite = piece[torch.isfinite(piece)]
        assert row[hvd_lossy.STAT_UNIQUE] == (torch.unique(x[at - r:at], dim=0).shape[0] if r else 0)
        assert row[hvd_lossy.STAT_FINITE] == finite.numel()
        if finite.numel():
            assert (row[hvd_lossy.STAT_MIN], row[hvd_lossy.STAT_MAX]) == \
                (finite.min().item(), finite.max().item())
        else:
            assert np.isnan(row[[hvd_lossy.STAT_MIN, hvd_lossy.STAT_MAX]]).all()
        assert row[hvd_lossy.STAT_SUM] == pytest.approx(finite.sum().item(), abs=1e-9)
        assert row[hvd_lossy.STAT_SUMSQ] == pytest.approx((finite * finite).sum().item())
    # ranges alone: the same range, nothing else computed
    ranges = hvd_lossy.piece_stats(x, rows, ranges_only=True)
    span = [hvd_lossy.STAT_MIN, hvd_lossy.STAT_MAX]
    np.testing.assert_array_equal(ranges[:, span], got[:, span])
    assert np.isnan(np.delete(ranges, span, axis=1)).all()
