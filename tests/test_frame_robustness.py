"""Robustness of the decoder: a truncated, corrupted or foreign frame raises ValueError
(hvd_lossy.FrameError), never crashes, hangs or decodes to something its header does not describe.

Most corruptions are caught by the checksum alone. To test the parsers behind it, several tests
re-seal a corrupted frame: they recompute its CRC32C with ``hvd_lossy._hl_test.crc32c`` and write it
into the header (bytes 3..6, uint32 little-endian), fixing up total_bytes where the length
changed, as a frame corrupted before it was sealed, or forged, would arrive. Such a frame must still either raise ValueError or decode to a tensor of the
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
from hvd_lossy import FrameError
import _hl_test  # the test-only native hooks (tests/_hooks.py)
from tests._format_ref import varint
from tests._launch import on_every_kernel_path

PREFIX = 7  # "HV", version 2 and the CRC32C of everything after it
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
CRASHES = pathlib.Path(__file__).resolve().parent.parent / "fuzz" / "crashes"
# A frame whose header announces more output than this is not decoded by these tests (a valid
# frame of duplicate rows may expand that much; allocating it says nothing about the parser).
MAX_OUTPUT_BYTES = 64 << 20

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
    frames["f32_dither"] = hvd_lossy.compress(_specials(_rows(48, 16, torch.float32, 7)), 0.03,
                                              dither=3)
    frames["f16_segments_l2"] = hvd_lossy.compress_chunks(
        _specials(_rows(64, 16, torch.float16, 8, distinct=9)), [20, 0, 30, 14],
        [0.03, 0.01, 0.0, 0.002], level=2)[0]
    out = {name: bytes(f.numpy().tobytes()) for name, f in frames.items()}
    # every golden: radix and short-block sections, coded and bucketed maps, borrowed tables,
    # the transport's extension
    out.update({p.stem: p.read_bytes() for p in sorted(GOLDEN.glob("*.bin"))})
    # The test relies on every kind being what its name says.
    infos = {name: hvd_lossy.frame_info(as_frame(b)) for name, b in out.items()}
    assert all(infos[f"{d}_l2"]["level"] == 2 for d in ("f32", "f16", "bf16"))
    assert all(infos[f"{d}_l1_dedup"]["n_unique"] < 64 for d in ("f32", "f16", "bf16"))
    assert all(infos[f"{d}_l1_outliers"]["n_outliers"] > 0 for d in ("f32", "f16", "bf16"))
    assert infos["f32_l2_escapes"]["level"] == 2
    return out


FRAME_NAMES = sorted(valid_frames())


def body_of(data):
    """Everything after a frame's total_bytes."""
    at = PREFIX
    while data[at] & 0x80:
        at += 1
    return data[at + 1:]


def sealed(body):
    """The frame around `body` (everything after total_bytes), with its total and CRC32C, as an
    encoder would have sealed it."""
    for total_len in range(1, 11):
        total = PREFIX + total_len + len(body)
        if len(varint(total)) == total_len:
            break
    rest = as_frame(varint(total) + body)  # kept alive while the CRC reads it
    crc = _hl_test.crc32c(rest.data_ptr(), rest.numel())
    return b"HV\x02" + struct.pack("<I", crc) + rest.numpy().tobytes()


def seal(data):
    """The bytes with total_bytes and the CRC32C recomputed."""
    return sealed(body_of(data))


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
    body = body_of(valid_frames()[name])
    for n in range(len(body)):
        with pytest.raises(FrameError):
            hvd_lossy.decompress(as_frame(sealed(body[:n])))


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
    frame = bytearray(body_of(valid_frames()[name]))
    # Bias toward the header, the descriptors and the first section bytes: widths, tables, lengths.
    hot = st.integers(0, min(len(frame), 64) - 1)
    anywhere = st.integers(0, len(frame) - 1)
    flips = data.draw(st.lists(st.tuples(st.one_of(hot, anywhere), st.integers(1, 255)),
                               min_size=1, max_size=4), label="flips")
    for pos, xor in flips:
        frame[pos] ^= xor
    raises_or_decodes_as_described(sealed(bytes(frame)))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_resealed_inserted_or_deleted_bytes_raise_or_decode_to_the_header_shape(name, data):
    # Bytes in or out of the header, a descriptor or a section: every varint and section after
    # it read from the wrong place, the total still right.
    frame = bytearray(body_of(valid_frames()[name]))
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(frame)), st.booleans(),
                                         st.integers(0, 255)), min_size=1, max_size=3),
                      label="edits")
    for pos, insert, value in edits:
        pos = min(pos, len(frame))
        if insert:
            frame[pos:pos] = bytes([value])
        elif pos < len(frame):
            del frame[pos]
    raises_or_decodes_as_described(sealed(bytes(frame)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FRAME_NAMES), data=st.data())
def test_resealed_overwritten_varints_raise_or_decode_to_the_header_shape(name, data):
    # A varint of the header or a descriptor (dims, rows, sizes, counts) replaced by another,
    # maybe of another length.
    frame = bytearray(body_of(valid_frames()[name]))
    pos = data.draw(st.integers(0, min(len(frame), 48) - 1), label="pos")
    end = pos
    while end < len(frame) - 1 and frame[end] & 0x80:
        end += 1
    value = data.draw(st.sampled_from([0, 1, 2, 7, 31, 32, 33, 255, 256, 4096, 2**31, 2**32,
                                       2**40, 2**60, 2**64 - 1]) | st.integers(0, 2**64 - 1),
                      label="value")
    frame[pos:end + 1] = varint(value)
    raises_or_decodes_as_described(sealed(bytes(frame)))


def test_a_frame_of_no_rows_decodes_to_its_header_shape_whatever_the_trailing_dims():
    # No element to hold, so any trailing dims decode, even ones whose product overflows int64
    # (a -1 in the view could not be inferred there): found by the test above.
    body = bytearray(body_of(bytes(hvd_lossy.compress(torch.empty(0, 7, 5), 0.01).numpy())))
    at = bytes(body).index(bytes([7, 5]))
    # [26, 2**60]: strides that no torch view or torch.empty can make (found by the test above)
    for dims in ([2**40, 2**30], [0, 2**60], [2**60, 0], [26, 2**60]):
        edited = body[:at] + varint(dims[0]) + varint(dims[1]) + body[at + 2:]
        frame = sealed(bytes(edited))
        assert tuple(raises_or_decodes_as_described(frame).shape) == (0, *dims)
        [chunk] = hvd_lossy.decompress_chunks(as_frame(frame))
        assert tuple(chunk.shape) == (0, *dims)


def test_resealed_valid_frames_still_decode():
    # seal() itself must not break a frame, or every resealed test would pass vacuously.
    for name, data in valid_frames().items():
        assert seal(data) == data, name
        assert raises_or_decodes_as_described(data) is not None, name


# ---- foreign data --------------------------------------------------------------------------------

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00"
       b"\x00\x90\x91h6" + bytes(200))


@pytest.mark.parametrize("data", [b"", b"\0" * 16, b"\0" * 96, b"\0" * 4096, PNG, b"HV\x02",
                                  b"HV\x02" + b"\xff" * 300, b"\xff" * 1000],
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
@given(data=st.binary(max_size=600), magic=st.booleans(), reseal=st.booleans())
def test_random_bytes_raise_frame_error_or_decode_to_the_header_shape(data, magic, reseal):
    if reseal:  # past the magic, the version, the size and the checksum
        raises_or_decodes_as_described(sealed(data))
        return
    if magic:
        data = b"HV\x02" + data  # past the magic and version checks
    with pytest.raises(FrameError):
        hvd_lossy.decompress(as_frame(data))


def test_frame_of_an_unknown_version_raises_frame_error_naming_it():
    data = bytearray(valid_frames()["f32_l1"])
    data[2] = 3
    with pytest.raises(FrameError, match=r"not an hvd_lossy frame: it starts 48 56 03, expected "
                                         r"48 56 02 \(\"HV\", version 2\)"):
        hvd_lossy.decompress(as_frame(bytes(data)))


# ---- back-to-back frames -------------------------------------------------------------------------

def _chunk_buffer():
    x = _rows(40, 8, torch.float32, seed=9, distinct=6)
    frames = [hvd_lossy.compress(p, eb, level=2) for p, eb in zip(x.split([10, 15, 15]),
                                                                   [0.01, 0.02, 0.0])]
    return b"".join(f.numpy().tobytes() for f in frames), [f.numel() for f in frames]


@pytest.mark.parametrize("where", ["checksum", "header", "payload", "last_byte"])
@pytest.mark.parametrize("pass_sizes", [False, True])
def test_decompress_chunks_with_a_corrupted_middle_frame_raises(where, pass_sizes):
    data, sizes = _chunk_buffer()
    assert len(hvd_lossy.decompress_chunks(as_frame(data))) == 3
    start = sizes[0]
    offset = {"checksum": 4, "header": 9, "payload": 30, "last_byte": sizes[1] - 1}[where]
    buf = bytearray(data)
    buf[start + offset] ^= 0x5A
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(bytes(buf)), sizes if pass_sizes else None)


@pytest.mark.parametrize("total", [0, 7, 8, 10**6, 2**64 - 1])
def test_decompress_chunks_with_a_bad_middle_frame_size_raises(total):
    data, sizes = _chunk_buffer()
    middle = data[sizes[0]:sizes[0] + sizes[1]]
    bad = middle[:PREFIX] + varint(total) + body_of(middle)
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data[:sizes[0]] + bad + data[sizes[0] + sizes[1]:]))


def test_decompress_chunks_with_a_truncated_buffer_or_wrong_sizes_raises():
    data, sizes = _chunk_buffer()
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data[:-1]))
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data + bytes(16)))
    with pytest.raises(ValueError):
        hvd_lossy.decompress_chunks(as_frame(data), [sizes[0] + 1, sizes[1] - 1, sizes[2]])


# ---- inputs found by the fuzzers -----------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(CRASHES.glob("*")) if CRASHES.is_dir() else [],
                         ids=lambda p: p.name)
def test_saved_fuzzer_inputs_raise_or_decode_to_the_header_shape(path):
    data = path.read_bytes()
    raises_or_decodes_as_described(data)
    if data[:3] == b"HV\x02" and len(data) > PREFIX:  # as the harness that reseals reads it
        raises_or_decodes_as_described(seal(data))


def test_row_map_over_rows_of_length_zero_decodes_to_empty_rows():
    # Found (in the first frame format) by reading the code: a segment with a row map and
    # row_len 0. Under UBSan the decoder passed a null pointer to memcpy (native/
    # cpu/decode.cc, the row copy of decode()).
    data = (CRASHES / "rowmap_zero_len_rows").read_bytes()
    y = raises_or_decodes_as_described(data)
    assert y is not None and tuple(y.shape) == (5, 0)


def _forged_huge_frame(n):
    """A frame of n x n float32 (n a multiple of 32) stored as one all-zero lossless unique row,
    consistent in every size field but carrying CRC32C 0 (wrong)."""
    blocks = bytes(n // 32)  # block packing, every width 0: all zeros
    body = (bytes([2 << 2]) + varint(n) + varint(1)  # f32, ndim 2, trailing n, one segment
            + bytes([0x02 | 0x04]) + varint(n) + varint(1) + varint(len(blocks))  # lossless, map
            + blocks + blocks)  # the map, then the code section
    frame = bytearray(sealed(body))
    frame[3:7] = bytes(4)
    return bytes(frame)


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
        frame = as_frame(sealed(bytes([2 << 2]) + varint(4) + varint(1) + bytes([level - 1])
                                + varint(1 << 40) + (0x3C0000).to_bytes(3, "little") + varint(1)
                                + b"\x00"))
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


def _row_map_rule(entries, n_unique):
    """A decoded row map's rule, one entry at a time (frame.h): unique rows are numbered by first
    occurrence, so entry r is at most the count of unique rows before it, and every unique row
    occurs. (error, marks of the unique rows that repeat); error '' for a good map."""
    seen, marks = 0, bytearray(n_unique)
    for r, v in enumerate(entries):
        if v > seen or v >= n_unique:
            return (f"frame is corrupted: row map entry {r} is {v}, expected at most {seen}", b"")
        if v == seen:
            seen += 1
        else:
            marks[v] = 1
    if seen != n_unique:
        return f"frame is corrupted: row map uses {seen} of {n_unique} unique rows", b""
    return "", bytes(marks)


def _row_map_cases():
    """Good maps (first occurrences among repeats, short and long: the vector body and its
    tail) and each corrupted at the start, in the body and in the tail: an entry one past the
    count so far, far past it, 2^32 - 1, equal to n_unique; a unique row never used."""
    g = torch.Generator().manual_seed(5)
    cases = []
    for rows in (1, 7, 8, 9, 16, 23, 64, 1000, 4099):
        entries, seen = [], 0
        for _ in range(rows):
            if seen == 0 or torch.rand(1, generator=g).item() < 0.4:
                entries.append(seen)
                seen += 1
            else:
                entries.append(int(torch.randint(0, seen, (1,), generator=g)))
        cases.append((entries, seen))
        for at in sorted({0, rows // 2, rows - 1}):
            for bad in (lambda v, s: s + 1, lambda v, s: s + 1000, lambda v, s: 2**32 - 1,
                        lambda v, s: seen):
                e = list(entries)
                e[at] = bad(e[at], max(entries[:at], default=-1) + 1)
                cases.append((e, seen))
        cases.append((entries, seen + 1))  # a unique row no entry uses
    return cases


def test_row_map_check_is_the_rule_one_entry_at_a_time_on_every_kernel_path(tmp_path):
    """The decoder's row-map check accepts exactly the good maps, names the first bad entry as
    the rule does, and marks the rows that repeat, on every kernel path."""
    cases = _row_map_cases()
    script = tmp_path / "row_map.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parents[1])!r})\n"
        "from tests._hooks import hooks\n"
        "h = hooks()\n"
        f"cases = {cases!r}\n"
        "print(repr([h.check_row_map(e, n) for e, n in cases]))\n")
    want = [_row_map_rule(e, n) for e, n in cases]
    assert sum(1 for err, _ in want if err) > len(cases) // 2  # mostly bad maps
    for run in on_every_kernel_path(script):
        got = [(err, bytes(marks)) for err, marks in run]
        assert got == want
