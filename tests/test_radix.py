"""Radix-packed level-1 code sections (native/frame.h "Radix section"): codes in [0, K) with K
not a power of two stored as base-K digits, g codes a value. Lossless on the codes: a radix frame
decodes to exactly what the level-2 frame of the same codes (entropy coded, never radix packed)
decodes to.
"""
import math
import struct

import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)
from tests._format_ref import (block_packed, level1_section, radix_section, reference_group,
                               varint)
from tests._launch import on_every_kernel_path


def zigzag(q):
    return np.where(q >= 0, 2 * q, -2 * q - 1)


def codes_of(z, dim=1):
    """float32 rows of `dim` integers whose codes at abs bound 0.5 (step 1) are the zigzag codes z."""
    q = np.where(z % 2 == 0, z // 2, -(z + 1) // 2)
    return torch.from_numpy(q.astype(np.float32).reshape(-1, dim))


def integer_rows(k, n, dim=8, seed=0):
    """Rows of integers whose codes at abs bound 0.5 (step 1) are zigzag(q) in [0, k), k - 1 present."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, k, size=n * dim)
    z[rng.integers(0, n * dim)] = k - 1
    return codes_of(z, dim), z


def level1_frame(x, bound, **kw):
    return hvd_lossy.compress_chunks(x, [x.shape[0]], bound, mode="abs", level=1,
                                     **kw)[0]


def code_section(frame, seg=0):
    info = hvd_lossy.frame_info(frame)
    segs = info["segments"]
    at = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                    - s["outlier_bytes"] for s in segs)
    for s in segs[:seg]:
        at += s["map_bytes"] + s["code_bytes"] + s["outlier_bytes"]
    at += segs[seg]["map_bytes"]
    return frame.numpy().tobytes()[at:at + segs[seg]["code_bytes"]]


def power_of_two(k):
    return k & (k - 1) == 0


# ---- the rule and the division ---------------------------------------------------------------

def test_group_size_is_the_integer_rule_of_frame_h_for_every_k():
    ks = [k for k in range(3, 65536) if not power_of_two(k)]
    for k in ks[:300] + ks[300::211] + [65535]:
        for n in (1, 7, 100, 2048, 12345, 10 ** 7):
            assert _hl_test.radix_group(k, n) == reference_group(k, n), (k, n)
    assert _hl_test.radix_group(17, 2048) == 4  # 512 values of 17 bits: 16 whole blocks
    assert _hl_test.radix_group(17, 10 ** 7) == 7  # long sections: 29 bits for 7 codes, 4.18 bits a code


def test_group_size_is_refused_for_k_that_radix_packing_never_uses():
    for k in (0, 1, 2, 4, 64, 65536, 65537):
        with pytest.raises(ValueError, match="expected 3 <= K <= 65535"):
            _hl_test.radix_group(k, 100)


def test_division_by_k_is_exact_at_the_top_of_the_uint32_range_for_every_k():
    top = 2 ** 32 - 1
    for k in range(3, 65536):
        if power_of_two(k):
            continue
        q = top // k
        values = [0, 1, k - 1, k, k + 1, top, q * k - 1, q * k, top - 1, (q - 1) * k + k - 1,
                  (q // 2) * k + k - 1]
        assert _hl_test.radix_divmod(k, values) == [divmod(v, k) for v in values], k


def test_division_by_k_is_exact_on_random_values():
    rng = np.random.default_rng(1)
    for k in rng.integers(3, 65536, size=200).tolist():
        if power_of_two(k):
            continue
        values = rng.integers(0, 2 ** 32, size=2000, dtype=np.uint64).tolist()
        assert _hl_test.radix_divmod(k, values) == [divmod(v, k) for v in values], k


# ---- the encoder ------------------------------------------------------------------------------

@pytest.mark.parametrize("k", list(range(2, 301)))
def test_codes_below_k_not_a_power_of_two_are_radix_packed_when_smaller_and_decode_like_level2(k):
    x, z = integer_rows(k, n=40 + k % 29, seed=k)  # n * 8 codes: the last group partial
    frame = level1_frame(x, 0.5, dedup=False)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    kind, section = level1_section(z.tolist())
    assert code_section(frame) == section
    if kind == "radix":
        assert (seg["radix"], seg["radix_group"]) == (k, reference_group(k, z.size))
    else:
        assert seg["radix"] is None and seg["radix_group"] is None
    if power_of_two(k):
        assert kind != "radix"
    elif kind != "radix":  # radix packing applied, and another packing was smaller
        assert len(radix_section(z.tolist())) >= len(section)
    y = hvd_lossy.decompress(frame)
    assert torch.equal(y, x)  # integers at step 1: exact
    assert torch.equal(y, hvd_lossy.decompress(hvd_lossy.compress(x, 0.5, mode="abs", level=2,
                                                                  dedup=False)))


def test_deduplicated_radix_segments_decode_through_the_row_sweep_alike_on_every_kernel_path(
        tmp_path):
    """A segment with a row map decodes its radix values lane by lane straight into the output
    rows (native/cpu/radix_sweep.cc): sixteen lanes and a two-register table with AVX-512, eight
    and four registers with AVX2, one at a time without. Every K from 3 to 32 not a power of two
    (one to four table registers), sections of several spans, rows repeated: every path must
    give back exactly the integers coded."""
    script = tmp_path / "sweep.py"
    script.write_text(
        "import zlib, numpy as np, torch, hvd_lossy\n"
        "hvd_lossy.set_num_threads(1)  # the sweep is the one-thread decoder's\n"
        "out = []\n"
        "for k in [k for k in range(3, 33) if k & (k - 1)]:\n"
        "    rng = np.random.default_rng(k)\n"
        "    z = rng.integers(0, k, size=(3000 + 37 * k) * 24)\n"
        "    z[0] = k - 1\n"
        "    q = np.where(z % 2 == 0, z // 2, -(z + 1) // 2)  # zigzag codes z at step 1\n"
        "    x = torch.from_numpy(q.astype(np.float32).reshape(-1, 24))\n"
        "    x = x[torch.from_numpy(rng.integers(0, x.shape[0], size=2 * x.shape[0]))]\n"
        "    frame = hvd_lossy.compress_chunks(x, [x.shape[0]], 0.5, mode='abs', level=1)[0]\n"
        "    seg = hvd_lossy.frame_info(frame)['segments'][0]\n"
        "    y = hvd_lossy.decompress(frame)\n"
        "    out.append((k, seg['radix'], seg['n_unique'] < seg['n_rows'], torch.equal(y, x),\n"
        "                zlib.crc32(y.numpy().tobytes())))\n"
        "print(repr(out))\n")
    runs = on_every_kernel_path(script)
    for k, radix, mapped, exact, _crc in runs[0]:
        assert radix == k and mapped and exact, (k, radix, mapped, exact)
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_most_k_not_a_power_of_two_pay_on_a_64_row_segment():
    used = []
    for k in range(3, 301):
        if not power_of_two(k):
            x, _ = integer_rows(k, n=64, dim=32, seed=k)
            used.append(hvd_lossy.frame_info(level1_frame(x, 0.5))["segments"][0]["radix"] == k)
    assert sum(used) >= 0.9 * len(used), sum(used)


@pytest.mark.parametrize("n", [1, 2, 6, 7, 8, 13, 14, 42, 43, 48, 224, 225, 1000,
                               2048 * 7, 2048 * 7 + 1, 40000])
def test_radix_section_is_the_bytes_frame_h_describes(n):
    x, z = integer_rows(17, n=n, dim=1, seed=n)  # 2048 * 7 + 1 and up: several spans
    frame = level1_frame(x, 0.5, dedup=False)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    kind, section = level1_section(z.tolist())
    assert code_section(frame) == section
    if kind == "radix":
        assert seg["radix"] == 17 and section == radix_section(z.tolist())
    else:  # a few codes: the head and a whole value's bits cost more than they save
        assert seg["radix"] is None
    if n >= 1000:  # long sections of codes filling [0, 17): radix packing
        assert kind == "radix"
    assert torch.equal(hvd_lossy.decompress(frame), x)


@pytest.mark.parametrize("k", [17, 300])  # codes held as bytes; codes of 256 and more
@pytest.mark.parametrize("spans, short", [(2, 0), (2, 1), (2, 2), (3, 0)])
def test_sections_of_whole_spans_and_a_padded_last_span_are_the_reference_bytes(k, spans, short):
    # The encoder builds a span whose g lanes are all whole codes in registers, and any other
    # span digit by digit (frame.h: only the last span's last lanes carry padding). `short`
    # codes fewer than spans * 2048 * g leave the last span 2048 values long, yet padded: it
    # must not be taken for a whole one.
    n = spans * 2048 * reference_group(k, 10 ** 6) - short
    g = reference_group(k, n)
    assert -(-n // g) == spans * 2048 and (n % g == 0) == (short == 0)
    x, z = integer_rows(k, n=n, dim=1, seed=k + short)
    frame = level1_frame(x, 0.5, dedup=False)
    assert hvd_lossy.frame_info(frame)["segments"][0]["radix"] == k
    assert code_section(frame) == radix_section(z.tolist())
    assert torch.equal(hvd_lossy.decompress(frame), x)


def patterned_codes(k, n, pattern, rng):
    """n codes below k (k - 1 among them): uniform; small (geometric) but for one eighth of the
    segment that is uniform ("hot i"); or uniform but for one eighth that is zero ("cold i")."""
    z = rng.integers(0, k, size=n)
    if pattern != "uniform":
        kind, region = pattern.split()
        lo, hi = int(region) * n // 8, (int(region) + 1) * n // 8
        if kind == "hot":
            z = np.where((np.arange(n) >= lo) & (np.arange(n) < hi), z,
                         np.minimum(rng.geometric(0.5, size=n) - 1, k - 1))
        else:
            z[lo:hi] = 0
    z[rng.integers(0, n)] = k - 1
    return z


def test_the_packing_is_the_smallest_whichever_part_of_the_segment_holds_the_large_codes():
    # The encoder skips building radix values where the values' top digits alone (a value is at
    # least its top digit times K^(g-1)) show the section cannot beat short blocks. The choice
    # must stay the reference's: large codes in each eighth of the segment in turn (each radix
    # lane covers a part of every span: frame.h), whole segments uniform (K just below a power of
    # two: radix wins narrowly), several spans and partial last groups. A bound from the wrong
    # lane, the wrong power of K or the padding digits would drop sections the reference keeps.
    rng = np.random.default_rng(0)
    kinds = {}
    patterns = ["uniform"] + [f"{kind} {r}" for kind in ("hot", "cold") for r in (0, 3, 7)]
    for k in (5, 17, 31, 63, 255, 300, 4095):
        for n in (999, 2048 * 9 + 13):
            for pattern in patterns:
                z = patterned_codes(k, n, pattern, rng)
                frame = level1_frame(codes_of(z), 0.5, dedup=False)
                kind, section = level1_section(z.tolist())
                assert code_section(frame) == section, (k, n, pattern, kind)
                kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds.get("radix", 0) >= 10 and kinds.get("short", 0) >= 10, kinds


def test_radix_is_chosen_only_when_smaller_than_block_packing_and_short_blocks():
    x, _ = integer_rows(17, n=1, dim=1)
    assert hvd_lossy.frame_info(level1_frame(x, 0.5))["segments"][0]["radix"] is None
    x, z = integer_rows(17, n=64, dim=32)
    seg = hvd_lossy.frame_info(level1_frame(x, 0.5))["segments"][0]
    assert seg["radix"] == 17 and seg["code_bytes"] < len(block_packed(z.tolist()))
    assert seg["code_bytes"] <= math.ceil(2048 / 4 / 32) * (1 + 4 * 17) + 3


def test_level2_and_lossless_segments_never_carry_radix_sections():
    x, _ = integer_rows(17, n=64, dim=32)
    for frame in (hvd_lossy.compress_chunks(x, [64], 0.5, mode="abs", level=2)[0],
                  hvd_lossy.compress_chunks(x, [64], 0.0, level=1)[0]):
        seg = hvd_lossy.frame_info(frame)["segments"][0]
        assert seg["radix"] is None


def lookups_with_specials(rows, dim, dtype, seed, distinct=None):
    """Rows uniform in [-0.05, 0.05) (codes of K = 17 at abs bound 0.003), with NaN, +-Inf and
    a value beyond the quantizer's range: outliers."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(rows, dim, generator=g) - 0.5) * 0.1
    if distinct:
        x = x[torch.randint(0, distinct, (rows,), generator=g)]
    x = x.to(dtype)
    flat = x.view(-1)
    beyond = [] if dtype == torch.float16 else [3e38]  # float16 has none beyond the quantizer
    for i, v in enumerate([float("nan"), float("inf"), -float("inf")] + beyond):
        flat[(131 * i + 5) % flat.numel()] = v
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(dedup=True), dict(dedup=False), dict(dither=4242)],
                             ids=["dedup", "nodedup", "dither"])
def test_rows_with_outliers_nan_and_inf_decode_bit_exact_like_block_packing(dtype, kw):
    rows = [64, 100, 37]
    x = lookups_with_specials(sum(rows), 32, dtype, seed=3, distinct=None if "dither" in kw else 80)
    frame = hvd_lossy.compress_chunks(x, rows, 0.003, mode="abs", level=1, **kw)[0]
    info = hvd_lossy.frame_info(frame)
    assert all(s["radix"] for s in info["segments"]), info["segments"]
    assert info["n_outliers"] > 0
    y = hvd_lossy.decompress(frame)
    eb = info["segments"][0]["eb_abs"]
    # the level-2 frame of the same bound (rounded to 24 bits already) and the same pieces
    ref = hvd_lossy.decompress_chunks(*hvd_lossy.compress_chunks(x, rows, eb, mode="abs", level=2,
                                                                 **kw))
    assert torch.equal(y.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       torch.cat(ref).view(y.shape).view(torch.int16 if dtype != torch.float32
                                                         else torch.int32))
    finite = torch.isfinite(x)
    assert (x[finite].double() - y[finite].double()).abs().max().item() <= eb
    assert torch.equal(torch.isnan(x), torch.isnan(y)) and torch.equal(x[torch.isinf(x)],
                                                                       y[torch.isinf(x)])


def test_a_segment_too_large_for_one_thread_decodes_on_many():
    x, _ = integer_rows(17, n=40000, dim=32, seed=9)  # 1.28M codes: > 4096 blocks of values
    frame = level1_frame(x, 0.5, dedup=False)
    assert hvd_lossy.frame_info(frame)["segments"][0]["radix"] == 17
    old = hvd_lossy._codec._threads
    try:
        for threads in (1, 2, 4):
            hvd_lossy.set_num_threads(threads)
            assert torch.equal(hvd_lossy.decompress(frame), x)
    finally:
        hvd_lossy.set_num_threads(old)


# ---- corrupt radix sections -------------------------------------------------------------------

BOUND_HALF = bytes([0x00, 0x00, 0x3F])  # the 24-bit bound 0.5 (float32 0x3f000000 >> 8)


def sealed_frame(code, rows=4, dim=8, flags=0x00):
    """An f32 frame of one lossy level-1 segment (abs bound 0.5) of rows x dim codes whose
    code section is `code`, with its CRC32C."""
    body = bytes([0 | (2 << 2)]) + varint(dim) + varint(1) + bytes([flags]) + varint(rows) \
        + BOUND_HALF + varint(len(code)) + code
    for total_len in range(1, 11):
        total = 7 + total_len + len(body)
        if len(varint(total)) == total_len:
            break
    rest = varint(total) + body
    buf = torch.frombuffer(bytearray(rest), dtype=torch.uint8)
    crc = _hl_test.crc32c(buf.data_ptr(), len(rest), False)
    return torch.frombuffer(bytearray(b"HV\x02" + struct.pack("<I", crc) + rest), dtype=torch.uint8)


def radix_code(k, g, values):
    return b"\xff" + varint(k) + varint(g) + block_packed(values)


def test_the_hand_built_reference_frame_decodes():
    codes = list(range(17)) * 2  # 34 codes, rows 4 x 8 = 32 of them
    codes = codes[:32]
    frame = sealed_frame(radix_section(codes))
    q = [c // 2 if c % 2 == 0 else -(c + 1) // 2 for c in codes]
    assert hvd_lossy.decompress(frame).flatten().tolist() == q


@pytest.mark.parametrize("k,g,match", [(0, 7, "K = 0"), (1, 7, "K = 1"), (2, 7, "K = 2"),
                                       (16, 4, "K = 16"), (65536, 1, "K = 65536"),
                                       (70000, 1, "K = 70000"), (17, 0, "g = 0"),
                                       (17, 8, "g = 8"), (3, 21, "g = 21"), (65535, 3, "g = 3")])
def test_a_radix_head_with_k_or_g_out_of_range_raises(k, g, match):
    frame = sealed_frame(b"\xff" + varint(k) + varint(g) + block_packed([0] * -(-32 // max(g, 1))))
    for call in (hvd_lossy.frame_info, hvd_lossy.decompress):
        with pytest.raises(hvd_lossy.FrameError, match=match):
            call(frame)


def test_a_value_of_k_pow_g_or_more_raises():
    values = [0] * 5
    values[2] = 17 ** 7  # one past the largest 7-digit value
    with pytest.raises(hvd_lossy.FrameError, match="410338673 or more"):
        hvd_lossy.decompress(sealed_frame(radix_code(17, 7, values)))


def test_a_nonzero_padding_digit_raises():
    # 32 codes, g = 7: G = 5 values, digit 6 of value 2 is code 32, past the end
    values = [0] * 5
    values[2] = 17 ** 6
    with pytest.raises(hvd_lossy.FrameError, match="past its 32 codes"):
        hvd_lossy.decompress(sealed_frame(radix_code(17, 7, values)))
    values[2] = 17 ** 6 - 1  # digits 0..5 all 16: codes, fine
    hvd_lossy.decompress(sealed_frame(radix_code(17, 7, values)))


def test_a_value_section_of_other_than_its_blocks_bytes_raises():
    good = radix_code(17, 7, [1, 2, 3, 4, 5])
    for bad in (good[:-1], good + b"\x00", good[:-4], good[:4]):
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(sealed_frame(bad))


def test_every_truncation_of_a_radix_section_raises():
    x, _ = integer_rows(17, n=16, dim=8)
    frame = level1_frame(x, 0.5, dedup=False)
    code = code_section(frame)
    assert code[0] == 0xFF
    for n in range(len(code)):
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(sealed_frame(code[:n], rows=16))
    assert torch.equal(hvd_lossy.decompress(sealed_frame(code, rows=16)), x)


def assert_flips_raise_and_resealed_ones_raise_or_decode(frame, x):
    """Every byte flip of a one-segment level-1 frame of x (rows x dim) fails its CRC; the code
    section's flips, resealed (sealed_frame), either raise FrameError or decode to x's shape."""
    data = frame.numpy().tobytes()
    code = code_section(frame)
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(torch.frombuffer(bad, dtype=torch.uint8))
    for i in range(len(code)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(code)
            bad[i] ^= flip
            try:
                y = hvd_lossy.decompress(sealed_frame(bytes(bad), rows=x.shape[0], dim=x.shape[1]))
            except hvd_lossy.FrameError:
                continue
            assert y.shape == x.shape and y.dtype == x.dtype


def test_every_byte_flip_of_a_radix_frame_raises_and_resealed_ones_raise_or_decode():
    x, _ = integer_rows(17, n=16, dim=8)
    frame = level1_frame(x, 0.5, dedup=False)
    assert code_section(frame)[0] == 0xFF
    assert_flips_raise_and_resealed_ones_raise_or_decode(frame, x)


def test_a_lossless_segment_with_a_radix_mark_raises():
    with pytest.raises(hvd_lossy.FrameError):
        hvd_lossy.decompress(sealed_frame(radix_code(17, 7, [0] * 5), flags=0x02))


# ---- golden frames ----------------------------------------------------------------------------

def _golden(name):
    from pathlib import Path
    path = Path(__file__).resolve().parent / "golden" / f"{name}.bin"
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)


@pytest.mark.parametrize("name", ["f32_1d_2seg", "f32_rel003_level1_3seg"])
def test_block_packed_goldens_from_before_radix_decode_exactly_as_their_radix_successors(name):
    old, new = _golden(name + "_before_radix"), _golden(name)
    old_segs = hvd_lossy.frame_info(old)["segments"]
    new_segs = hvd_lossy.frame_info(new)["segments"]
    assert all(s["radix"] is None for s in old_segs) and any(s["radix"] for s in new_segs)
    assert sum(s["code_bytes"] for s in new_segs) < sum(s["code_bytes"] for s in old_segs)
    assert torch.equal(hvd_lossy.decompress(old).view(torch.int32),
                       hvd_lossy.decompress(new).view(torch.int32))


def test_radix_goldens_report_their_radix_and_group_in_frame_info():
    segs = hvd_lossy.frame_info(_golden("f32_radix_level1_2seg"))["segments"]
    assert [(s["radix"], s["radix_group"]) for s in segs] == [(17, 4), (11, 8)]
    segs = hvd_lossy.frame_info(_golden("f32_radix_dither_2seg"))["segments"]
    assert [(s["radix"], s["radix_group"]) for s in segs] == [(19, 4), (11, 8)]
    assert all(s["dither_seed"] is not None for s in segs)
