"""The frame format (native/frame.h): one compact frame whose row segments each keep their own
bound, level, mode, map and outliers. Golden frames pin its bytes."""
import pathlib
import struct
import sys

import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)
from tests._format_ref import varint

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "golden"))
from cases import HERE, lookups, specials  # noqa: E402
from frame_cases import FRAME_CASES, LEGACY_CASES, encode  # noqa: E402


def golden(name):
    return torch.frombuffer(bytearray((HERE / f"{name}.bin").read_bytes()), dtype=torch.uint8)


def crc32c(data, portable=False):
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return _hl_test.crc32c(buf.data_ptr(), len(data), portable)


def segments_of(x, rows):
    out, at = [], 0
    for r in rows:
        out.append(x[at:at + r])
        at += r
    return out


def assert_within_segment_bounds(x, y, info, rows):
    for seg, xs, ys in zip(info["segments"], segments_of(x, rows), segments_of(y, rows)):
        finite = torch.isfinite(xs)
        if finite.any():
            err = (xs[finite].double() - ys[finite].double()).abs().max().item()
            assert err <= seg["eb_abs"], (err, seg)
        assert torch.equal(torch.isnan(xs), torch.isnan(ys))
        inf = torch.isinf(xs)
        assert torch.equal(xs[inf], ys[inf])


@pytest.mark.parametrize("name", sorted(FRAME_CASES))
def test_encoder_reproduces_golden_frame(name):
    assert torch.equal(encode(name), golden(name)), f"{name}: frame bytes changed"


@pytest.mark.parametrize("name", sorted(FRAME_CASES) + sorted(LEGACY_CASES))
def test_golden_frame_decodes_every_segment_within_its_bound(name):
    make, rows, _kwargs = {**FRAME_CASES, **LEGACY_CASES}[name]
    x = make()
    frame = golden(name)
    info = hvd_lossy.frame_info(frame)
    y = hvd_lossy.decompress(frame)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert [s["rows"] for s in info["segments"]] == rows
    assert_within_segment_bounds(x, y, info, rows)


def test_the_header_is_magic_version_crc32c_then_varints():
    frame = golden("f32_rel003_level2_3seg").numpy().tobytes()
    assert frame[:3] == b"HV\x02"
    (crc,) = struct.unpack_from("<I", frame, 3)
    assert crc == crc32c(frame[7:])
    info = hvd_lossy.frame_info(torch.frombuffer(bytearray(frame), dtype=torch.uint8))
    assert info["format"] == 2 and info["checksum"] == crc and info["frame_bytes"] == len(frame)
    assert info["header_bytes"] <= 16
    for seg in info["segments"]:
        descriptor = seg["segment_bytes"] - seg["map_bytes"] - seg["code_bytes"] - seg["outlier_bytes"]
        assert descriptor <= 8  # flags, rows, 24-bit bound, code size (+ n_unique with a map)


def test_segments_keep_their_own_bound_mode_and_dither_seed():
    info = hvd_lossy.frame_info(golden("f32_rel003_level2_3seg"))
    x = lookups()
    for seg, xs, rel in zip(info["segments"], segments_of(x, [40, 32, 24]), [0.03, 0.01, 0.05]):
        want = rel * (xs.max() - xs.min()).item()
        assert seg["mode"] == "rel" and seg["level"] in (1, 2)  # 2 only where it is smaller
        assert want * (1 - 2 ** -15) <= seg["eb_abs"] <= want  # rounded down to 24 bits
    dithered = hvd_lossy.frame_info(golden("f16_abs001_dither_2seg"))["segments"]
    assert [s["dither_seed"] for s in dithered] == [77, 78]
    mixed = hvd_lossy.frame_info(golden("bf16_specials_lossless_mix"))["segments"]
    assert mixed[0]["lossless"] and not mixed[1]["lossless"]


def test_hot_repeated_rows_get_an_entropy_coded_map_smaller_than_block_packing():
    info = hvd_lossy.frame_info(golden("f32_coded_map_level2"))
    for seg in info["segments"]:
        assert seg["map_coded"] and 1 < seg["n_unique"] < seg["rows"]
        width = (seg["n_unique"] - 1).bit_length()
        packed = (seg["rows"] + 31) // 32 * (1 + 4 * width)  # block packing, all blocks full width
        assert seg["map_bytes"] < packed


def test_many_distinct_skewed_repeats_get_a_bucketed_map_smaller_than_the_plain_coded_one():
    for seg in hvd_lossy.frame_info(golden("f32_bucketed_map_level2"))["segments"]:
        assert seg["map_coded"] and seg["map_bucketed"] and 32 < seg["n_unique"] < seg["rows"]
        width = (seg["n_unique"] - 1).bit_length()
        assert seg["map_bytes"] < (seg["rows"] + 31) // 32 * (1 + 4 * width)
    # the frame the encoder wrote before bucketed maps: its coded map is larger, same rows
    old = golden("f32_coded_map_level2_before_buckets")
    new = golden("f32_coded_map_level2")
    old_maps = [s["map_bytes"] for s in hvd_lossy.frame_info(old)["segments"]]
    new_maps = [s["map_bytes"] for s in hvd_lossy.frame_info(new)["segments"]]
    assert sum(new_maps) < sum(old_maps)
    assert torch.equal(hvd_lossy.decompress(old), hvd_lossy.decompress(new))


def test_crc32c_hardware_and_portable_agree_with_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283 == crc32c(b"123456789", portable=True)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (300,), generator=g, dtype=torch.uint8).numpy().tobytes()
    for n in (0, 1, 7, 8, 9, 63, 64, 65, 300):
        assert crc32c(data[:n]) == crc32c(data[:n], portable=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("level", [1, 2])
def test_random_segments_decode_within_bounds_with_specials(dtype, level):
    g = torch.Generator().manual_seed(level)
    x = (torch.randn(200, 24, generator=g) * 0.1).to(dtype)
    x[torch.randint(0, 200, (150,), generator=g)] = x[:150].clone()  # repeated rows: maps
    flat = x.view(-1)
    flat[5], flat[900], flat[3000], flat[4000] = float("nan"), float("inf"), -float("inf"), 60000
    rows = [0, 64, 1, 100, 35]
    buf, sizes = hvd_lossy.compress_chunks(x, rows, [0.02, 0.05, 0.0, 0.001, 0.1], level=level)
    assert sizes == [buf.numel()]
    info = hvd_lossy.frame_info(buf)
    assert_within_segment_bounds(x, hvd_lossy.decompress(buf), info, rows)
    assert sum(s["n_outliers"] for s in info["segments"]) >= 3


def test_every_corrupted_byte_or_truncation_raises_frame_error():
    frame = golden("bf16_specials_lossless_mix").numpy().tobytes()
    for i in range(len(frame)):
        bad = bytearray(frame)
        bad[i] ^= 0x5A
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(torch.frombuffer(bad, dtype=torch.uint8))
    for n in range(1, len(frame)):
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(torch.frombuffer(bytearray(frame[:n]), dtype=torch.uint8))


def _sealed(body):
    """A frame around `body` (everything after total_bytes), with a correct CRC."""
    for total_len in range(1, 11):
        total = 7 + total_len + len(body)
        if len(varint(total)) == total_len:
            break
    rest = varint(total) + body
    return b"HV\x02" + struct.pack("<I", crc32c(rest)) + rest


def test_a_frame_claiming_2_pow_40_rows_is_refused_before_allocating():
    # f32, ndim 2, trailing 32; one lossless level-1 segment of 2^40 rows and a 1-byte code section.
    body = bytes([0 | (2 << 2)]) + varint(32) + varint(1) + bytes([0x02]) + varint(1 << 40) \
        + varint(1) + b"\x00"
    frame = torch.frombuffer(bytearray(_sealed(body)), dtype=torch.uint8)
    with pytest.raises(hvd_lossy.FrameError, match="too small"):
        hvd_lossy.frame_info(frame)
    with pytest.raises(hvd_lossy.FrameError):
        hvd_lossy.decompress(frame)


def test_a_sealed_frame_with_a_bad_field_names_it():
    body = bytes([3 | (2 << 2)]) + varint(4) + varint(0)  # dtype code 3 does not exist
    with pytest.raises(hvd_lossy.FrameError, match="info byte"):
        hvd_lossy.frame_info(torch.frombuffer(bytearray(_sealed(body)), dtype=torch.uint8))


def test_one_frame_a_group_and_no_frame_for_an_empty_group():
    x = lookups(rows=96, dim=32)
    rows, groups, prefix = [30, 10, 56], [2, 0, 1], 5
    out = torch.zeros(hvd_lossy.max_grouped_bytes(rows, [32], groups, prefix),
                      dtype=torch.uint8)
    sizes = hvd_lossy.compress_grouped(x, rows, [0.03, 0.02, 0.01], groups, prefix, out, level=2)
    assert len(sizes) == 3
    first = out[prefix:prefix + sizes[0] + sizes[1]]
    assert hvd_lossy.frame_info(first)["shape"] == (40, 32)
    at = prefix + sizes[0] + sizes[1] + 2 * prefix  # the empty group: its prefix only
    last = out[at:at + sizes[2]]
    assert hvd_lossy.frame_info(last)["shape"] == (56, 32)
    assert torch.equal(hvd_lossy.decompress(last), hvd_lossy.decompress(
        hvd_lossy.compress_chunks(x[40:], [56], 0.01, level=2)[0]))


def test_sources_of_several_back_to_back_frames_decode_into_one_output():
    x = lookups(rows=96, dim=32)
    a, _ = hvd_lossy.compress_chunks(x[:20], [20], 0.03)
    b, _ = hvd_lossy.compress_chunks(x[20:50], [12, 18], 0.03, level=2)
    c, _ = hvd_lossy.compress_chunks(x[50:], [16, 30], 0.03)
    buffer = torch.cat([a, b, c])
    first = a.numel() + b.numel()
    out = torch.empty(96, 32)
    errors = hvd_lossy.decompress_into(buffer, [(0, first, 50), (first, c.numel(), 46)], out)
    assert errors == [None, None]
    assert torch.equal(out[:50], torch.cat(hvd_lossy.decompress_chunks(torch.cat([a, b]))))
    assert torch.equal(out[50:], hvd_lossy.decompress(c))


def test_a_source_with_rows_other_than_announced_is_a_mismatch():
    x = lookups(rows=96, dim=32)
    frame, _ = hvd_lossy.compress_chunks(x, [40, 56], 0.03)
    errors = hvd_lossy.decompress_into(frame, [(0, frame.numel(), 95)], torch.empty(95, 32))
    assert errors[0] is not None and errors[0].mismatch


def _grouped_stats(x, rows, **kw):
    stats = np.full((len(rows), hvd_lossy.STATS_PER_PIECE), -1.0)
    out = torch.zeros(hvd_lossy.max_grouped_bytes(rows, list(x.shape[1:]), [len(rows)], 0),
                      dtype=torch.uint8)
    hvd_lossy.compress_grouped(x, rows, [0.03] * len(rows), [len(rows)], 0, out, stats=stats, **kw)
    return stats


@pytest.mark.parametrize("mode", ["rel", "abs"])
def test_the_codec_reports_each_pieces_exact_finite_range_and_distinct_rows(mode):
    # Rows that agree in their first 8 columns and differ later are distinct rows.
    base = torch.randn(40, 32)
    base[20:, :8] = base[0, :8]
    x = base[torch.randint(0, 40, (120,), generator=torch.Generator().manual_seed(3))].contiguous()
    x[7, 5], x[70, 1] = float("nan"), float("-inf")
    rows = [50, 70]
    stats = _grouped_stats(x, rows, mode=mode)
    for piece, got in zip(segments_of(x, rows), stats):
        finite = piece[torch.isfinite(piece)]
        assert got[hvd_lossy.STAT_MIN] == finite.min().item()
        assert got[hvd_lossy.STAT_MAX] == finite.max().item()
        assert got[hvd_lossy.STAT_UNIQUE] == torch.unique(piece, dim=0).shape[0]


def test_codec_stats_are_nan_where_the_codec_did_not_compute_them():
    x = torch.randn(64, 16)
    x[32:] = float("nan")
    stats = _grouped_stats(x, [32, 32], dither=11)
    assert np.isnan(stats[:, hvd_lossy.STAT_UNIQUE]).all()  # dithered pieces skip dedup
    assert stats[0, hvd_lossy.STAT_MIN] == x[:32].min().item()
    assert np.isnan(stats[1, [hvd_lossy.STAT_MIN, hvd_lossy.STAT_MAX]]).all()  # nothing finite


def test_a_stats_array_of_the_wrong_shape_or_dtype_is_refused():
    x = torch.randn(8, 4)
    out = torch.zeros(hvd_lossy.max_grouped_bytes([8], [4], [1], 0), dtype=torch.uint8)
    for bad in (np.empty((2, hvd_lossy.STATS_PER_PIECE)), np.empty((1, 3), dtype=np.float32)):
        with pytest.raises(ValueError, match="stats must be"):
            hvd_lossy.compress_grouped(x, [8], [0.03], [1], 0, out, stats=bad)


def test_frame_bytes_breakdown_accounts_for_every_byte_of_the_wire_benchmarks_chunk():
    from hvd_lossy.bench import frame_bytes
    r = frame_bytes.breakdown(64)
    assert sum(r["parts"].values()) == r["frame_bytes"] and r["segments"] == 13
    assert r["entropy_own_tables"] < r["parts"]["rans_bytes"] + r["parts"]["stream_states"]


def _code_tables(frame):
    """(own table?) of each level-2 segment's code section: its w byte is 0 when borrowed."""
    data, info = frame.numpy().tobytes(), hvd_lossy.frame_info(frame)
    at, out = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                         - s["outlier_bytes"] for s in info["segments"]), []
    for s in info["segments"]:
        at += s["map_bytes"]
        if s["level"] == 2:
            out.append(data[at + 1] != 0)
            assert s["table_borrowed"] == (data[at + 1] == 0)  # frame_info says so too
        at += s["code_bytes"] + s["outlier_bytes"]
    return out


def test_small_segments_of_one_distribution_share_one_table_the_first_carries():
    new = golden("f16_abs001_dither_2seg")
    old = golden("f16_abs001_dither_2seg_before_shared_table")
    assert _code_tables(new) == [True, False] and _code_tables(old) == [True, True]
    assert new.numel() < old.numel()
    # the same bounds and seeds, so the same decoded values
    assert torch.equal(hvd_lossy.decompress(new), hvd_lossy.decompress(old))


def test_segments_of_different_bounds_keep_their_own_tables_where_sharing_costs_more():
    assert _code_tables(golden("f32_rel003_level2_3seg")) == [True, True]  # one is level 1


def test_a_section_borrowing_a_table_with_none_before_it_is_refused():
    # the dithered golden with its first (table-carrying) segment's w byte zeroed, resealed
    frame = bytearray(golden("f16_abs001_dither_2seg").numpy().tobytes())
    info = hvd_lossy.frame_info(torch.frombuffer(bytearray(frame), dtype=torch.uint8))
    at = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                    - s["outlier_bytes"] for s in info["segments"])
    frame[at] = frame[at + 1] = 0
    frame[3:7] = struct.pack("<I", crc32c(bytes(frame[7:])))
    with pytest.raises(hvd_lossy.FrameError, match="borrows a table"):
        hvd_lossy.decompress(torch.frombuffer(frame, dtype=torch.uint8))


def test_frames_of_many_small_segments_stay_within_their_bounds_with_shared_tables():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(13 * 64, 32, generator=g) * 0.05
    rows = [64] * 13
    frame, _ = hvd_lossy.compress_chunks(x, rows, 0.03, level=2)
    assert _code_tables(frame).count(True) == 1
    info = hvd_lossy.frame_info(frame)
    assert_within_segment_bounds(x, hvd_lossy.decompress(frame), info, rows)
