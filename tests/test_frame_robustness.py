"""Robustness of the decoder: a truncated, corrupted or foreign frame raises ValueError
(hvd_lossy.FrameError), never crashes, hangs or decodes to something its header does not describe.

Most corruptions are caught by the checksum alone. To test the parsers behind it, several tests
re-seal a corrupted frame: they recompute the checksum with ``hvd_lossy._C.checksum`` and write it
into the header (offset 12, uint32 little-endian), as a frame corrupted before it was sealed, or
forged, would arrive. Such a frame must still either raise ValueError or decode to a tensor of the
dtype and shape its header states. Inputs the fuzzers in fuzz/ found are replayed from
fuzz/crashes/.
"""
import functools
import pathlib
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hvd_lossy
from hvd_lossy import FrameError, _C

HEADER_BYTES = 96
CHECKSUM_OFFSET = 12
CRASHES = pathlib.Path(__file__).resolve().parent.parent / "fuzz" / "crashes"
# A frame whose header announces more output than this is not decoded by these tests (a valid
# frame of duplicate rows may expand that much; allocating it says nothing about the parser).
MAX_OUTPUT_BYTES = 64 << 20

# HlFrameHeader (native/frame.h): name -> (offset, struct format).
HEADER_FIELDS = {
    "magic": (0, "<I"), "version": (4, "<B"), "dtype": (5, "<B"), "level": (6, "<B"),
    "flags": (7, "<B"), "ndim": (8, "<B"), "reserved": (9, "<B"), "eb_param": (16, "<d"),
    "eb_abs": (24, "<d"), "n_rows": (32, "<Q"), "row_len": (40, "<Q"), "n_unique": (48, "<Q"),
    "n_outliers": (56, "<Q"), "map_bytes": (64, "<Q"), "code_bytes": (72, "<Q"),
    "outlier_bytes": (80, "<Q"), "total_bytes": (88, "<Q"),
}
SECTION_FIELDS = ("map_bytes", "code_bytes", "outlier_bytes")


def as_frame(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(
        0, dtype=torch.uint8)


def _rows(n, d, dtype, seed, distinct=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 0.05
    if distinct:
        x = x[torch.randint(0, distinct, (n,), generator=g)]
    return x.to(dtype)


def _specials(x):
    x = x.clone()
    flat = x.view(-1)
    for i, v in enumerate([float("nan"), float("inf"), -float("inf"), 1e30, -1e-40]):
        flat[(13 * i + 5) % flat.numel()] = v
    return x


@functools.lru_cache(maxsize=None)
def valid_frames():
    """name -> bytes of a valid frame, one for each kind of section and header the decoder reads."""
    frames = {}
    for dname, dtype in {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}.items():
        for level in (1, 2):
            x = _rows(48, 16, dtype, seed=level)
            dup = _rows(64, 16, dtype, seed=10 + level, distinct=5)
            frames[f"{dname}_l{level}"] = hvd_lossy.compress(x, 0.03, level=level)
            frames[f"{dname}_l{level}_dedup"] = hvd_lossy.compress(dup, 0.01, level=level)
            frames[f"{dname}_l{level}_outliers"] = hvd_lossy.compress(
                _specials(x), 0.002, mode="abs", level=level)
            frames[f"{dname}_l{level}_lossless"] = hvd_lossy.compress(x[:6], 0.0, level=level)
        frames[f"{dname}_1d"] = hvd_lossy.compress(_rows(1, 40, dtype, seed=3).view(-1), 0.02)
        frames[f"{dname}_0d"] = hvd_lossy.compress(torch.tensor(1.5, dtype=dtype), 0.1)
        frames[f"{dname}_empty"] = hvd_lossy.compress(torch.empty(0, 16, dtype=dtype), 0.01)
    frames["f32_3d_l2"] = hvd_lossy.compress(_rows(24, 8, torch.float32, seed=4).view(3, 8, 8),
                                             0.02, level=2)
    frames["f32_zero_len_rows"] = hvd_lossy.compress(torch.empty(5, 0), 0.01)
    frames["f32_dedup_lossless"] = hvd_lossy.compress(torch.full((16, 8), 2.0), 0.01)
    sparse = torch.zeros(32, 64)
    sparse.view(-1)[::53] = 10.0  # a few codes above 255: level-2 escapes
    frames["f32_l2_escapes"] = hvd_lossy.compress(sparse, 0.005, mode="abs", level=2)
    out = {name: bytes(f.numpy().tobytes()) for name, f in frames.items()}
    # The test relies on every kind being what its name says.
    infos = {name: hvd_lossy.frame_info(as_frame(b)) for name, b in out.items()}
    assert all(infos[f"{d}_l2"]["level"] == 2 for d in ("f32", "f16", "bf16"))
    assert all(infos[f"{d}_l1_dedup"]["n_unique"] < 64 for d in ("f32", "f16", "bf16"))
    assert all(infos[f"{d}_l1_outliers"]["n_outliers"] > 0 for d in ("f32", "f16", "bf16"))
    assert infos["f32_l2_escapes"]["level"] == 2
    return out


FRAME_NAMES = sorted(valid_frames())


def seal(data):
    """The bytes with the checksum recomputed and stored, as an encoder would have sealed them."""
    buf = bytearray(data)
    t = as_frame(buf)
    struct.pack_into("<I", buf, CHECKSUM_OFFSET, _C.checksum(t.data_ptr(), len(buf)))
    return bytes(buf)


def with_field(data, name, value):
    offset, fmt = HEADER_FIELDS[name]
    buf = bytearray(data)
    size = struct.calcsize(fmt)
    if fmt == "<d":
        struct.pack_into(fmt, buf, offset, value)
    else:
        struct.pack_into(fmt, buf, offset, value % (1 << (8 * size)))
    return bytes(buf)


def field(data, name):
    offset, fmt = HEADER_FIELDS[name]
    return struct.unpack_from(fmt, data, offset)[0]


def raises_or_decodes_as_described(data):
    """Decodes data; a rejection must be a ValueError, from frame_info and decompress alike, and
    a success must have the dtype and shape frame_info reads from the header. Returns the
    tensor or None."""
    frame = as_frame(data)
    try:
        info = hvd_lossy.frame_info(frame)
    except ValueError:
        with pytest.raises(ValueError):
            hvd_lossy.decompress(frame)
        return None
    if info["raw_bytes"] > MAX_OUTPUT_BYTES:
        return None
    try:
        y = hvd_lossy.decompress(frame)
    except ValueError:
        return None
    assert y.dtype == info["dtype"] and tuple(y.shape) == info["shape"]
    return y


# ---- truncation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FRAME_NAMES)
def test_every_truncation_raises_frame_error(name):
    data = valid_frames()[name]
    for n in range(len(data)):
        with pytest.raises(FrameError):
            hvd_lossy.decompress(as_frame(data[:n]))
    with pytest.raises(FrameError, match="trailing bytes"):
        hvd_lossy.decompress(as_frame(data + b"\0"))


@pytest.mark.parametrize("name", FRAME_NAMES)
def test_truncation_with_a_resealed_header_raises_frame_error(name):
    # total_bytes and the checksum fixed up to the cut length: the sections no longer fill it.
    data = valid_frames()[name]
    for n in range(HEADER_BYTES, len(data)):
        cut = seal(with_field(data[:n], "total_bytes", n))
        with pytest.raises(FrameError):
            hvd_lossy.decompress(as_frame(cut))


# ---- corruption ----------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_any_byte_flip_without_resealing_raises_frame_error(name, data):
    frame = bytearray(valid_frames()[name])
    pos = data.draw(st.integers(0, len(frame) - 1), label="pos")
    frame[pos] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(FrameError):
        hvd_lossy.decompress(as_frame(bytes(frame)))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_resealed_random_byte_flips_raise_or_decode_to_the_header_shape(name, data):
    frame = bytearray(valid_frames()[name])
    # Bias toward the header, the shape and the first section bytes: widths, tables, lengths.
    hot = st.integers(0, min(len(frame), 200) - 1)
    anywhere = st.integers(CHECKSUM_OFFSET + 4, len(frame) - 1)
    flips = data.draw(st.lists(st.tuples(st.one_of(hot, anywhere), st.integers(1, 255)),
                               min_size=1, max_size=4), label="flips")
    for pos, xor in flips:
        if not CHECKSUM_OFFSET <= pos < CHECKSUM_OFFSET + 4:
            frame[pos] ^= xor
    raises_or_decodes_as_described(seal(bytes(frame)))


def _interesting_values(data):
    size = len(data)
    return st.one_of(
        st.sampled_from([0, 1, 2, 3, 7, 31, 32, 33, 255, 256, 4095, 4096, 4097, 2**31, 2**32 - 1,
                         2**32, 2**60, 2**63 - 1, 2**63, 2**64 - 1, size, size - 1, size + 1,
                         size - HEADER_BYTES]),
        st.sampled_from([field(data, f) + d for f in ("n_rows", "row_len", "n_unique",
                                                      "n_outliers", *SECTION_FIELDS)
                         for d in (-1, 0, 1)]),
        st.integers(0, 2**64 - 1),
    )


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_resealed_overwritten_header_fields_raise_or_decode_to_the_header_shape(name, data):
    frame = valid_frames()[name]
    names = data.draw(st.lists(st.sampled_from(sorted(HEADER_FIELDS)), min_size=1, max_size=3,
                               unique=True), label="fields")
    for f in names:
        if HEADER_FIELDS[f][1] == "<d":
            value = data.draw(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
                [0.0, -0.0, 5e-324, 1e-300, 1e300, 1.7976931348623157e308]), label=f)
        else:
            value = data.draw(_interesting_values(frame), label=f)
        frame = with_field(frame, f, value)
    raises_or_decodes_as_described(seal(frame))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_resealed_moved_section_boundaries_raise_or_decode_to_the_header_shape(name, data):
    # Sizes that still add up to the frame, so the parsers read the wrong bytes as each section.
    frame = valid_frames()[name]
    body = sum(field(frame, f) for f in SECTION_FIELDS)
    map_bytes = data.draw(st.integers(0, body), label="map_bytes")
    n_outliers = data.draw(st.integers(0, (body - map_bytes) // 12), label="n_outliers")
    code_bytes = body - map_bytes - 12 * n_outliers
    for f, v in (("map_bytes", map_bytes), ("code_bytes", code_bytes),
                 ("n_outliers", n_outliers), ("outlier_bytes", 12 * n_outliers)):
        frame = with_field(frame, f, v)
    if data.draw(st.booleans(), label="toggle identity flag"):
        frame = with_field(frame, "flags", field(frame, "flags") ^ 0x04)
    raises_or_decodes_as_described(seal(frame))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_resealed_overwritten_shape_dims_raise_or_decode_to_the_header_shape(name, data):
    frame = bytearray(valid_frames()[name])
    ndim = field(frame, "ndim")
    if ndim == 0:
        frame = bytearray(with_field(frame, "ndim", data.draw(st.integers(1, 9), label="ndim")))
        ndim = 0
    for i in range(ndim):
        if data.draw(st.booleans(), label=f"overwrite dim {i}"):
            v = data.draw(st.sampled_from([-1, 0, 1, 2, 2**32, 2**62, -(2**63)])
                          | st.integers(-(2**63), 2**63 - 1), label=f"dim {i}")
            struct.pack_into("<q", frame, HEADER_BYTES + 8 * i, v)
    raises_or_decodes_as_described(seal(bytes(frame)))


def test_resealed_valid_frames_still_decode():
    # seal() itself must not break a frame, or every resealed test would pass vacuously.
    for name, data in valid_frames().items():
        assert seal(data) == data, name
        assert raises_or_decodes_as_described(data) is not None, name


# ---- foreign data --------------------------------------------------------------------------------

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00"
       b"\x00\x90\x91h6" + bytes(200))


@pytest.mark.parametrize("data", [b"", b"\0" * 16, b"\0" * 96, b"\0" * 4096, PNG, b"HVDL",
                                  b"HVDL" + b"\xff" * 300, b"\xff" * 1000],
                         ids=["empty", "zeros16", "zeros96", "zeros4096", "png", "magic_only",
                              "magic_then_ff", "ff"])
def test_foreign_bytes_raise_frame_error(data):
    frame = as_frame(data)
    for decode in (hvd_lossy.decompress, hvd_lossy.frame_info):
        with pytest.raises(FrameError):
            decode(frame)
    if data:
        with pytest.raises(ValueError):
            hvd_lossy.decompress_chunks(frame)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), magic=st.booleans(), sealed=st.booleans())
def test_random_bytes_raise_frame_error(data, magic, sealed):
    if magic:
        data = b"HVDL\x01" + data  # get past the magic and version checks
    if sealed and len(data) >= 16:
        data = seal(data)
    with pytest.raises(FrameError):
        hvd_lossy.decompress(as_frame(data))


def test_frame_of_an_unknown_version_raises_frame_error_naming_it():
    data = seal(with_field(valid_frames()["f32_l1"], "version", 2))
    with pytest.raises(FrameError, match="unsupported frame version 2"):
        hvd_lossy.decompress(as_frame(data))


# ---- back-to-back frames -------------------------------------------------------------------------

def _chunk_buffer():
    x = _rows(40, 8, torch.float32, seed=9, distinct=6)
    buf, sizes = hvd_lossy.compress_chunks(x, [10, 15, 15], [0.01, 0.02, 0.0], level=2)
    return bytes(buf.numpy().tobytes()), sizes


@pytest.mark.parametrize("where", ["header", "shape", "payload", "last_byte"])
@pytest.mark.parametrize("pass_sizes", [False, True])
def test_decompress_chunks_with_a_corrupted_middle_frame_raises(where, pass_sizes):
    data, sizes = _chunk_buffer()
    assert len(hvd_lossy.decompress_chunks(as_frame(data))) == 3
    start = sizes[0]
    offset = {"header": 20, "shape": HEADER_BYTES, "payload": HEADER_BYTES + 20,
              "last_byte": sizes[1] - 1}[where]
    buf = bytearray(data)
    buf[start + offset] ^= 0x5A
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(bytes(buf)), sizes if pass_sizes else None)


@pytest.mark.parametrize("total", [0, 95, 96, 10**6, 2**64 - 1])
def test_decompress_chunks_with_a_bad_middle_frame_size_raises(total):
    data, sizes = _chunk_buffer()
    buf = bytearray(data)
    struct.pack_into("<Q", buf, sizes[0] + 88, total)
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(bytes(buf)))


def test_decompress_chunks_with_a_truncated_buffer_or_wrong_sizes_raises():
    data, sizes = _chunk_buffer()
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data[:-1]))
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data + bytes(HEADER_BYTES)))
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data), [sizes[0] + 1, sizes[1] - 1, sizes[2]])


# ---- inputs found by the fuzzers -----------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(CRASHES.glob("*")) if CRASHES.is_dir() else [],
                         ids=lambda p: p.name)
def test_saved_fuzzer_inputs_raise_or_decode_to_the_header_shape(path):
    data = path.read_bytes()
    raises_or_decodes_as_described(data)
    if len(data) >= 16:  # as found by the harness that reseals (fuzz_decode_patched)
        resealed = seal(with_field(data, "total_bytes", len(data)) if len(data) >= 96 else data)
        raises_or_decodes_as_described(resealed)


def test_row_map_over_rows_of_length_zero_decodes_to_empty_rows():
    # Found by fuzz/fuzz_decode_patched: a frame with a row map and row_len 0. Under UBSan the
    # decoder passed a null pointer to memcpy (native/codec_cpu_decode.cc, the row copy of decode()).
    data = (CRASHES / "rowmap_zero_len_rows").read_bytes()
    y = raises_or_decodes_as_described(data)
    assert y is not None and tuple(y.shape) == (5, 0)


def _forged_huge_frame(n):
    """A frame of n x n float32 (n must be a multiple of 32) stored as one all-zero unique row,
    consistent in every size field but carrying checksum 0 (wrong)."""
    shape = struct.pack("<qq", n, n)
    map_sec, code_sec = bytes(n // 32), bytes(n // 32)  # all blocks of width 0: all zeros
    total = HEADER_BYTES + len(shape) + len(map_sec) + len(code_sec)
    head = struct.pack("<IBBBBB3xIddQQQQQQQQ", 0x4C445648, 1, 0, 1, 0, 2, 0, 0.01, 0.01, n, n, 1,
                       0, len(map_sec), len(code_sec), 0, total)
    return head + shape + map_sec + code_sec


def test_corrupted_frame_claiming_a_huge_shape_raises_frame_error_before_allocating():
    data = _forged_huge_frame(1 << 20)  # 64 KiB frame, 4 TiB of float32
    assert hvd_lossy.frame_info(as_frame(data))["raw_bytes"] == 4 << 40
    with pytest.raises(FrameError, match="checksum"):
        hvd_lossy.decompress(as_frame(data))


# ---- limits on what a frame may announce -------------------------------------------------------

def _decoders(frame):
    """Every public way to decode frames of untrusted bytes into new memory."""
    return {"decompress": lambda: hvd_lossy.decompress(frame),
            "decompress_chunks": lambda: hvd_lossy.decompress_chunks(frame),
            "decompress_chunks sizes": lambda: hvd_lossy.decompress_chunks(frame, [frame.numel()])}


def test_sealed_frame_claiming_4_tib_raises_frame_error_not_an_allocation_failure():
    frame = as_frame(seal(_forged_huge_frame(1 << 20)))  # valid checksum, 64 KiB, 4 TiB of output
    assert hvd_lossy.frame_info(frame)["raw_bytes"] == 4 << 40 > hvd_lossy.max_output_bytes()
    for what, call in _decoders(frame).items():
        with pytest.raises(FrameError, match="4398046511104 bytes of output, more than "
                                             "max_output_bytes") as info:
            call()
        assert type(info.value) is FrameError, what  # not CodecError (a RuntimeError)


def test_frame_claiming_2_pow_40_rows_is_refused_without_allocating():
    x = torch.zeros(32, 4)
    for level in (1, 2):
        data = hvd_lossy.compress(x, 0.01, level=level).numpy().tobytes()
        shape_at = HEADER_BYTES  # dim 0 of the shape, after the fixed header
        forged = with_field(data, "n_rows", 1 << 40)
        forged = forged[:shape_at] + struct.pack("<q", 1 << 40) + forged[shape_at + 8:]
        frame = as_frame(seal(forged))
        for what, call in _decoders(frame).items():
            with pytest.raises(FrameError) as info:
                call()
            assert type(info.value) is FrameError, (what, info.value)
        out = torch.empty(32, 4)
        assert hvd_lossy.decompress_into(frame, [(0, frame.numel(), 32)], out)[0] is not None


def test_decode_limit_refuses_a_valid_expanding_frame_per_call_and_when_set():
    x = torch.ones(4096, 64)  # 1 MiB of one repeated row: a frame of a few hundred bytes
    frame = hvd_lossy.compress(x, 0.01)
    assert frame.numel() * 1000 < 1 << 20  # over 1,000x
    assert torch.equal(hvd_lossy.decompress(frame, max_output_bytes=1 << 20), x)
    for call in (lambda: hvd_lossy.decompress(frame, max_output_bytes=(1 << 20) - 1),
                 lambda: hvd_lossy.decompress_chunks(frame, max_output_bytes=(1 << 20) - 1)):
        with pytest.raises(FrameError, match="1048576 bytes of output"):
            call()
    default = hvd_lossy.max_output_bytes()
    hvd_lossy.set_max_output_bytes(1 << 19)
    try:
        with pytest.raises(FrameError, match=f"max_output_bytes \\({1 << 19};"):
            hvd_lossy.decompress(frame)
    finally:
        hvd_lossy.set_max_output_bytes(default)
    assert torch.equal(hvd_lossy.decompress(frame), x)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="max_output_bytes must be an int >= 0"):
            hvd_lossy.set_max_output_bytes(bad)


@pytest.mark.parametrize("offset", [6, 9, 32, 48, 56, 64])  # level, reserved, rows, unique, outliers, sections
def test_a_header_field_damaged_after_sealing_names_the_checksum_first(offset):
    frame = hvd_lossy.compress(torch.randn(64, 16, generator=torch.Generator().manual_seed(3)), 0.03)
    damaged = frame.clone()
    damaged[offset] ^= 0x55
    with pytest.raises(hvd_lossy.FrameError, match=r"^frame is corrupted: checksum 0x[0-9a-f]{8}, "
                                                   r"its header says 0x[0-9a-f]{8} \(and .+\)$"):
        hvd_lossy.decompress(damaged)
