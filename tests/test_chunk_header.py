"""One header a chunk (hvd_lossy/chunk_header.py): the collectives' protocol fields travel in the
frame's extension (HL_FRAME_EXT), under the frame's CRC32C; a chunk is one frame. Golden chunks
pin the bytes."""
import pathlib
import sys

import numpy as np
import pytest
import torch

import hvd_lossy
from hvd_lossy import _codec
from hvd_lossy import chunk_header as C
from hvd_lossy import protocol as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "golden"))
from cases import HERE, lookups  # noqa: E402
from frame_cases import FRAME_CASES, EMPTY_FRAME, encode  # noqa: E402


def golden(name):
    return torch.frombuffer(bytearray((HERE / f"{name}.bin").read_bytes()), dtype=torch.uint8)


def fields(status=0, a=0, b=0, grank=3, dtype=0, ndim=3, rows=0, payload=0,
           pending=(0, 0, 0), settings=0x5EED1234, dims=(26, 32)):
    return ([status, a, b, grank, dtype, ndim, rows, payload, *pending, settings]
            + (list(dims) + [-1] * P.MAX_NDIM)[:P.MAX_NDIM] + [None])  # REUSE: not reusing


def head_of(frame):
    (head,) = _codec.chunk_heads(frame, [(0, frame.numel())])
    return head


@pytest.mark.parametrize("name", sorted(EMPTY_FRAME))
def test_encoder_reproduces_the_golden_chunks_of_no_segments(name):
    assert torch.equal(encode(name), golden(name)), f"{name}: frame bytes changed"


def test_golden_chunk_pins_the_protocol_fields_and_the_frame_fields():
    frame = golden("ext_f32_rel003_level2_3seg")
    want = fields(rows=96, payload=frame.numel(), ndim=2, dims=(32,), pending=(10, 1, 7))
    assert C.fields_of(head_of(frame), 0) == want
    assert C.extension(want) == FRAME_CASES["ext_f32_rel003_level2_3seg"][2]["extension"]
    # the same frame as without the extension, but for the extension block in its header
    plain = golden("f32_rel003_level2_3seg")
    assert frame.numel() == plain.numel() + C.block_bytes(C.extension(want))
    assert torch.equal(hvd_lossy.decompress(frame), hvd_lossy.decompress(plain))


def test_golden_failure_chunk_carries_status_and_the_senders_dtype_code():
    got = C.fields_of(head_of(golden("ext_empty_failure")), 0)
    assert got[P._STATUS] == 3 and got[P._A] == 2 ** 40 and got[P._B] == -5
    assert got[P.GRANK] == 1 and got[P._DTYPE] == -1 and got[P.ROWS] == 0
    assert P.check_headers([got]).code == 3


def test_frame_info_reports_the_extension_and_counts_it_in_the_header():
    info = hvd_lossy.frame_info(golden("ext_f32_rel003_level2_3seg"))
    plain = hvd_lossy.frame_info(golden("f32_rel003_level2_3seg"))
    assert info["extension"] == bytes.fromhex("02063412ed5e14020e") and plain["extension"] is None
    assert info["header_bytes"] == plain["header_bytes"] + 10
    empty = hvd_lossy.frame_info(golden("ext_empty_bf16_3d"))
    assert empty["segments"] == [] and empty["shape"] == (0, 26, 32)
    assert empty["frame_bytes"] == 19


@pytest.mark.parametrize("f", [
    fields(),
    fields(status=3, a=2 ** 40, b=-5, dtype=-1, ndim=-1, dims=()),
    fields(status=5, dtype=3),  # a dtype the frame cannot hold travels in the extension
    fields(pending=(10, 3, 12345)),
    fields(grank=2 ** 20, settings=0x7FFFFFFF, ndim=8, dims=(1, 2, 3, 4, 5, 6, 7)),
])
def test_failure_frames_round_trip_every_protocol_field(f):
    t = torch.zeros(0, *[d for d in f[P._DIMS:P._DIMS + P.MAX_NDIM] if d >= 0])
    frame = C.header_frame(t, f)
    got = C.fields_of(head_of(frame), 0)
    for i in (P._STATUS, P._A, P._B, P.GRANK, P._PENDING, P._PENDING_A, P._PENDING_SEQ,
              P._SETTINGS):
        assert got[i] == f[i], i
    if f[P._STATUS]:
        assert got[P._DTYPE] == f[P._DTYPE]
    else:
        assert P.like_of(got) == (torch.float32, tuple(t.shape[1:]))


def test_one_destination_carries_one_header_of_about_twenty_bytes():
    ext = C.extension(fields(grank=1, pending=(0, 0, 0), settings=0x7FFFFFFF))
    frame = golden("ext_f32_rel003_level2_3seg")
    assert C.block_bytes(ext) <= 8  # the protocol's share: flags, rank, digest
    # the frame's header with the protocol fields in it
    assert hvd_lossy.frame_info(frame)["header_bytes"] - 10 + C.block_bytes(ext) <= 20


@pytest.mark.parametrize("t", [torch.zeros(5, 3, 2, dtype=torch.bfloat16), torch.tensor(2.0),
                               torch.zeros(7, dtype=torch.float16)])
def test_a_sized_header_frame_announces_a_tensor_and_a_frame_that_travel_apart(t):
    # broadcast's header round: a frame of no segments that announces the root's tensor
    f = fields(grank=4, ndim=t.dim(), rows=t.shape[0] if t.dim() else 1, payload=12345,
               dims=t.shape[1:], dtype=P.dtype_code(t))
    frame = C.header_frame(t, f, sized=True)
    assert hvd_lossy.frame_info(frame)["segments"] == []
    got = C.fields_of(head_of(frame), 0)
    assert got == f
    assert P.like_of(got) == (t.dtype, tuple(t.shape[1:]))


def test_every_group_gets_a_frame_with_the_extension_an_empty_one_none_of_segments():
    x = lookups(rows=96, dim=32)
    rows, groups, ext = [30, 10, 56], [2, 0, 1], C.extension(fields())
    out = torch.zeros(hvd_lossy.max_grouped_bytes(rows, [32], groups, 0),
                      dtype=torch.uint8)
    sizes, frames = hvd_lossy.compress_grouped(x, rows, [0.03, 0.02, 0.01], groups, 0, out,
                                               level=2, extension=ext)
    assert len(sizes) == 3 and len(frames) == 3 and sizes[0] + sizes[1] == frames[0]
    at = [0, frames[0], frames[0] + frames[1]]
    heads = _codec.chunk_heads(out, list(zip(at, frames)), verify=True)
    assert [h[3] for h in heads] == [40, 0, 56] and all(h[6] == ext for h in heads)
    last = out[at[2]:at[2] + frames[2]]
    assert torch.equal(hvd_lossy.decompress(last), hvd_lossy.decompress(
        hvd_lossy.compress_chunks(x[40:], [56], 0.01, level=2)[0]))


def test_every_corrupted_byte_or_truncation_of_a_chunk_is_caught():
    frame = golden("ext_f32_rel003_level2_3seg")
    data = frame.numpy().tobytes()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        t = torch.frombuffer(bad, dtype=torch.uint8)
        head = _codec.chunk_heads(t, [(0, len(bad))], verify=True)[0]
        assert isinstance(head, str), f"byte {i}"
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(t)
    for n in range(1, len(data)):
        assert isinstance(_codec.chunk_heads(frame, [(0, n)])[0], str)


def test_chunks_that_are_not_the_protocols_are_a_receive_failure():
    plain = golden("f32_rel003_level2_3seg")  # a frame without the extension
    with pytest.raises(P._LocalError, match="without the protocol's extension") as e:
        C.parse_chunks(plain, [plain.numel()])
    assert e.value.code == 10
    bad_flags = torch.frombuffer(bytearray(_codec.empty_frame(
        torch.float32, [4], b"\x80\x02\x00\x00\x00\x00")), dtype=torch.uint8)
    with pytest.raises(P._LocalError, match="unknown flags"):
        C.parse_chunks(bad_flags, [bad_flags.numel()])
    stray = torch.frombuffer(bytearray(_codec.empty_frame(
        torch.float32, [4], C.extension(fields()) + b"\x00")), dtype=torch.uint8)
    with pytest.raises(P._LocalError, match="stray"):
        C.parse_chunks(stray, [stray.numel()])
    with pytest.raises(P._LocalError) as e:
        C.parse_chunks(torch.zeros(40, dtype=torch.uint8), [40])
    assert e.value.code == 10 and e.value.a == 0


def test_an_extension_holding_an_overlong_varint_is_a_receive_failure():
    # grank 1 as the two bytes 0x82 0x00 instead of 0x02: the same value, not the writer's form
    overlong = torch.frombuffer(bytearray(_codec.empty_frame(
        torch.float32, [4], b"\x00\x82\x00\x34\x12\xed\x5e")), dtype=torch.uint8)
    with pytest.raises(P._LocalError, match="overlong") as e:
        C.parse_chunks(overlong, [overlong.numel()])
    assert e.value.code == 10


def test_a_corrupted_chunk_is_caught_by_verify_naming_its_sender():
    frame = golden("ext_f32_rel003_level2_3seg")
    recv = torch.cat([frame, frame])
    counts = [frame.numel()] * 2
    assert [h[P.GRANK] for h in C.parse_chunks(recv, counts, verify=True)] == [3, 3]
    recv[counts[0] + frame.numel() - 3] ^= 1  # the second frame's last code byte
    C.parse_chunks(recv, counts)  # its header still parses: only the checksum sees it
    with pytest.raises(P._LocalError, match="CRC32C") as e:
        C.parse_chunks(recv, counts, verify=True)
    assert e.value.a == 1


def test_an_allgathers_frames_split_into_one_chunk_a_rank():
    frame = golden("ext_f32_rel003_level2_3seg")
    empty = C.header_frame(torch.zeros(0, 32), fields(dims=(32,)))
    recv = torch.cat([frame, empty, frame])
    assert C.split_chunks(recv, 3) == [frame.numel(), empty.numel(), frame.numel()]
    with pytest.raises(P._LocalError, match="3 frames received from 4 ranks"):
        C.split_chunks(recv, 4)
    with pytest.raises(P._LocalError, match="do not split"):
        C.split_chunks(recv[:-1], 3)


def test_an_extension_past_the_limit_or_empty_is_refused():
    x = lookups(rows=8, dim=4)
    out = torch.zeros(4096, dtype=torch.uint8)
    with pytest.raises(ValueError, match="at most 127"):
        hvd_lossy.compress_grouped(x, [8], [0.03], [1], 0, out, extension=b"x" * 128)
    with pytest.raises(ValueError, match="empty"):
        hvd_lossy.compress_grouped(x, [8], [0.03], [1], 0, out, extension=b"")
    assert np.frombuffer(_codec.empty_frame(torch.float16, [], b"x" * 127), np.uint8).size < 150
