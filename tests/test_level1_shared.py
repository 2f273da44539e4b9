"""The functions the CUDA encoder runs (native/level1_sections.h), run on the host in the
GPU's decomposition (native/level1_ref.h, through _hl_test.segment_payload_hd), must write the CPU
encoder's segment bytes: map, code section (block, radix or short-block packing, picked by
level1_packing) and outlier records. No GPU is needed: this is the part of the CUDA encoder's
byte identity that a CPU-only machine can check (tests/test_cuda.py compares real device frames
where a GPU is present)."""
import struct

import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)
from tests._format_ref import block_packed, level1_section, short_packed

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def cpu_frame(x, bound, **kw):
    kw.setdefault("dedup", True)
    buf, _sizes = hvd_lossy.compress_chunks(x, [x.shape[0]], bound, mode="abs", level=1,
                                            **kw)
    return buf


def payload_of(frame):
    """Segment 0's payload (map, code, outliers) and its info, from the CPU encoder's frame."""
    info = hvd_lossy.frame_info(frame)
    segs = info["segments"]
    at = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                    - s["outlier_bytes"] for s in segs)
    s = segs[0]
    n = s["map_bytes"] + s["code_bytes"] + s["outlier_bytes"]
    return frame.numpy().tobytes()[at:at + n], s


def raw_bits(x):
    flat = x.contiguous().reshape(-1)
    if flat.dtype == torch.float32:
        return flat.view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    return flat.view(torch.int16).numpy().astype(np.int64) & 0xFFFF


def zigzag(q):
    return np.where(q >= 0, 2 * q, -2 * q - 1)


def expected_inputs(x, lossless, keep_map):
    """What a GPU encoder holds after quantizing and deduplicating x at abs bound 0.5 (step 1,
    exact on integer data): the row map, the unique rows' codes and the outliers."""
    rows, d = x.shape
    bits = raw_bits(x).reshape(rows, d)
    v = x.double().numpy()
    finite_small = np.isfinite(v) & (np.abs(v) <= 2 ** 30 - 1)
    if lossless:
        codes = bits
        out_mask = np.zeros_like(finite_small)
    else:
        codes = np.where(finite_small, zigzag(np.rint(np.where(finite_small, v, 0))), 0)
        out_mask = ~finite_small
    # rows are the same when codes and outlier bits agree, numbered by first occurrence
    keys = [tuple(codes[r]) + tuple(np.where(out_mask[r], bits[r], -1)) for r in range(rows)]
    first, row_map = {}, []
    for k in keys:
        row_map.append(first.setdefault(k, len(first)))
    firsts = {}
    for r, u in enumerate(row_map):
        firsts.setdefault(u, r)
    uniq = [firsts[u] for u in range(len(firsts))] if keep_map else list(range(rows))
    ucodes = codes[uniq].reshape(-1)
    umask = out_mask[uniq].reshape(-1)
    ubits = bits[uniq].reshape(-1)
    outliers = [(int(i), int(ubits[i])) for i in np.flatnonzero(umask)]
    return (row_map if keep_map else []), [int(c) for c in ucodes], outliers


def scaled_rows(rows, d, seed, dtype=torch.float32):
    """Rows of integers whose scale changes from row to row (lookups, gradients): short blocks
    follow it where blocks of 32 carry the wider neighbour's width."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(0, 9, size=(rows, 1))
    return torch.from_numpy(np.rint(rng.standard_normal((rows, d)) * scale)).to(dtype)


def radix_rows(k, rows, d, seed):
    """Codes uniform in [0, k): radix packing's case (K = 17 is 4.09 bits a code)."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, k, size=rows * d)
    z[0] = k - 1
    q = np.where(z % 2 == 0, z // 2, -(z + 1) // 2)
    return torch.from_numpy(q.astype(np.float32).reshape(rows, d))


def duplicate_rows(rows, d, seed):
    rng = np.random.default_rng(seed)
    hot = np.rint(rng.standard_normal((max(rows // 8, 1), d)) * 20)
    return torch.from_numpy(hot[rng.integers(0, hot.shape[0], size=rows)]).float()


def with_specials(x):
    x = x.clone()
    flat = x.view(-1)
    flat[3] = float("nan")
    flat[10] = float("inf")
    flat[-1] = -float("inf")
    flat[len(flat) // 2] = 3e9  # |t| > 2^30 - 1: an outlier although finite
    return x


CASES = {
    "block_uniform_power_of_two": lambda: radix_rows(16, 64, 32, 1),
    "radix_k17": lambda: radix_rows(17, 128, 16, 2),
    "radix_k3_long": lambda: radix_rows(3, 300, 24, 3),
    "short_friendly_scales": lambda: scaled_rows(96, 32, 4),
    "duplicates_with_map": lambda: duplicate_rows(256, 16, 5),
    "outliers_nan_inf": lambda: with_specials(scaled_rows(40, 24, 6)),
    "odd_sizes": lambda: scaled_rows(7, 13, 7),
    "one_row": lambda: scaled_rows(1, 5, 8),
    "float16": lambda: scaled_rows(64, 32, 9, torch.float16),
    "bfloat16_radix": lambda: radix_rows(5, 64, 32, 10).to(torch.bfloat16),
    "wide_codes_no_short": lambda: scaled_rows(32, 32, 11) * 4096,
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("lossless", [False, True])
def test_cuda_encoder_functions_write_the_cpu_encoders_segment_bytes(name, lossless):
    x = CASES[name]()
    frame = cpu_frame(x, 0.0 if lossless else 0.5)
    payload, seg = payload_of(frame)
    assert seg["lossless"] == lossless
    keep_map = seg["n_unique"] < seg["n_rows"]
    row_map, codes, outliers = expected_inputs(x, lossless, keep_map)
    assert len(codes) == seg["n_unique"] * seg["row_len"]
    assert len(outliers) == seg["n_outliers"]
    got, packing, code_bytes = _hl_test.segment_payload_hd(row_map, codes, outliers,
                                                     DTYPE_CODE[x.dtype], not lossless)
    assert code_bytes == seg["code_bytes"]
    assert got == payload
    # each writer, not only block packing, is held against the CPU encoder's
    if name.startswith("radix") and not lossless:
        assert packing == _hl_test.PACK_RADIX
    if name.startswith("short") and not lossless:
        assert packing == _hl_test.PACK_SHORT


def test_short_block_writer_is_frame_h_byte_for_byte():
    rng = np.random.default_rng(0)
    for n in (1, 15, 16, 17, 33, 100, 1000):
        scale = 2 ** rng.integers(0, 15, size=(n + 15) // 16).repeat(16)[:n]
        codes = [int(c) for c in rng.integers(0, 1 << 15, size=n) % np.maximum(scale, 1)]
        codes[0] = max(codes[0], 1)
        got, packing, size = _hl_test.segment_payload_hd([], codes, [], 0, True)
        if packing == _hl_test.PACK_SHORT:
            assert got == short_packed(codes)
            assert size == len(got)


def test_code_sections_are_frame_h_reference_sections_for_random_codes():
    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(1, 700))
        top = int(rng.choice([2, 3, 5, 17, 100, 1 << 12, (1 << 15) - 1, 1 << 15, 1 << 20]))
        scale = rng.integers(1, top + 1, size=(n + 15) // 16).repeat(16)[:n]
        codes = [int(c) for c in rng.integers(0, top, size=n) % scale]
        kind, want = level1_section(codes)
        got, packing, size = _hl_test.segment_payload_hd([], codes, [], 0, True)
        assert (packing, got) == (getattr(_hl_test, "PACK_" + kind.upper()), want), (trial, n, top)
        assert size == len(got)


def test_short_blocks_are_taken_where_blocks_of_32_carry_a_wider_neighbour():
    codes = ([1] * 16 + [300] * 16) * 8
    got, packing, _n = _hl_test.segment_payload_hd([], codes, [], 0, True)
    assert packing == _hl_test.PACK_SHORT
    assert len(got) < len(block_packed(codes))
    assert got == short_packed(codes)


def test_uniform_widths_keep_block_packing_since_short_blocks_cost_their_mark_more():
    codes = [int(c) for c in np.random.default_rng(1).integers(0, 1 << 12, size=512)]
    codes[0] = (1 << 12) - 1
    got, packing, _n = _hl_test.segment_payload_hd([], codes, [], 0, True)
    assert packing == _hl_test.PACK_BLOCK
    assert got == block_packed(codes)


def test_codes_of_2_pow_15_or_more_never_get_short_blocks():
    codes = ([1] * 16 + [1 << 15] * 16) * 4
    _got, packing, _n = _hl_test.segment_payload_hd([], codes, [], 0, True)
    assert packing != _hl_test.PACK_SHORT


def test_lossless_segments_are_always_block_packed():
    codes = ([1] * 16 + [300] * 16) * 8
    got, packing, _n = _hl_test.segment_payload_hd([], codes, [], 0, False)
    assert packing == _hl_test.PACK_BLOCK and got == block_packed(codes)


def test_outlier_records_take_the_fewest_position_bytes_and_the_dtypes_width():
    codes = [0] * 300
    got, _p, code_bytes = _hl_test.segment_payload_hd([], codes, [(257, 0x7FC0)], 1, True)
    assert got[code_bytes:] == struct.pack("<HH", 257, 0x7FC0)
    got, _p, code_bytes = _hl_test.segment_payload_hd([], codes[:200], [(7, 0x7F800000)], 0, True)
    assert got[code_bytes:] == struct.pack("<BI", 7, 0x7F800000)


# ---- the CUDA encoder's frame assembly (native/device_frames.h) -------------------------------------

LAYOUTS = {
    "one group": ([300], [0.01], [1], 0, None),
    "groups with an empty one and a prefix": ([100, 0, 250, 250], [0.01, 0.02, 0.0, 0.05],
                                              [2, 0, 2], 5, None),
    "protocol extension, empty groups get a frame": ([120, 80, 0, 400], [0.03, 0.0, 0.01, 1e-3],
                                                     [0, 2, 2, 0], 3, b"\x01proto"),
    "many small pieces": ([7] * 40 + [20], [0.02] * 41, [10, 10, 10, 11], 0, b"\x09"),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("mode", ["rel", "abs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_encoders_frame_assembly_writes_the_cpu_encoders_layout(name, mode, dtype):
    rows, ebs, groups, prefix, ext = LAYOUTS[name]
    x = with_specials(duplicate_rows(sum(rows), 16, 12)).to(dtype)
    cap = hvd_lossy.max_grouped_bytes(rows, [16], groups, prefix)
    out = torch.full((cap,), 0xAB, dtype=torch.uint8)
    got = hvd_lossy.compress_grouped(x, rows, ebs, groups, prefix, out, 0, mode=mode, level=1,
                                     extension=ext)
    sizes, group_bytes = got if ext is not None else (got, None)
    end = len(groups) * prefix + (sum(group_bytes) if ext is not None else sum(sizes))
    cpu = out.numpy().tobytes()[:end]
    mode_code = 1 if mode == "rel" else 0
    again, hd_sizes, hd_groups = _hl_test.device_frames_hd(cpu, rows, [16], groups, prefix, ext or b"",
                                                 mode_code, DTYPE_CODE[dtype])
    assert hd_sizes == sizes
    if ext is not None:
        assert hd_groups == group_bytes
    assert again == cpu
