"""The device receive path's host half (hvd_lossy/_decode.py): what it copies to the host and
the batched call it builds. A received buffer's frames are read from bounded prefixes (header
and descriptors, never the payloads) in one copy; every level-1 frame of the call goes to ONE
decompress_batched_cuda call, each frame at its offset in the buffer and its first element in
the output (an all-to-all's own rows lie between and stay untouched); level-2 segments and
entropy-coded maps go to the per-frame CUDA decoder, bucketed maps (and dithered segments
with HVD_LOSSY_HOST_DITHER=1) to the host. Here the device is stood in for by the batched
decoder's host emulation (_hl_test.decompress_placed_hd: the table and per-item steps the
kernels run) and the CPU decoder, on CPU tensors, so the Python side's sizes, offsets and
routes are checked against the CPU decoder without a GPU; the last tests (skipped without
one) run the same calls on the device."""
import gc
import weakref

import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)
from hvd_lossy import _codec, _decode
from tests.test_device_batch import D, INT_VIEW, rows_for
from tests.test_device_decode_batch import resealed

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
EXT = b"\x01\x02proto"  # a transport extension, as the all-to-all's frames carry


def sender_frame(kind, rows, dtype, seed, dither=None, mode="abs", ebs=None):
    """One sender's chunk: a frame of segments of these rows (x D), the decoder it must take
    checked. kind: "level1", "level2" (rANS codes), "bucketed" (a bucketed row map) or
    "empty" (a frame of no segments, what a rank sends where it has no rows)."""
    if kind == "empty":
        return torch.frombuffer(bytearray(_codec.empty_frame(dtype, [D], EXT)), dtype=torch.uint8)
    if kind == "bucketed":  # 40 distinct rows in 200: a map whose rANS table stays small
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(40, D, generator=g)[torch.randint(0, 40, (200,), generator=g)]
        frame = hvd_lossy.compress(x.to(dtype), 0.01, mode="abs", level=2)
    else:
        x = rows_for(sum(rows), seed, dtype, specials=seed % 2 == 0,
                     spread=1.0 if kind == "level2" else 10.0)
        ebs = ebs or [0.01 if kind == "level2" else 0.02 * (1 + k % 3) for k in range(len(rows))]
        cap = hvd_lossy.max_grouped_bytes(rows, [D], [len(rows)], 0)
        out = torch.empty(cap, dtype=torch.uint8)
        _, frames = hvd_lossy.compress_grouped(x, rows, ebs, [len(rows)], 0, out, mode=mode,
                                               level=2 if kind == "level2" else 1,
                                               dedup=kind != "level2",  # no map to bucket
                                               dither=dither, extension=EXT)
        frame = out[:frames[0]].clone()
    segs = hvd_lossy.frame_info(frame)["segments"]
    want = {"level1": all(s["level"] == 1 and not s["map_coded"] for s in segs),
            "level2": any(s["level"] == 2 for s in segs) and not any(s["map_bucketed"]
                                                                       for s in segs),
            "bucketed": any(s["map_bucketed"] for s in segs)}[kind]
    assert want, f"the {kind} recipe made {segs}"
    return frame


def received(kinds_rows, dtype, seed, dither=None, mode="abs"):
    """An all-to-all's received buffer: one chunk a sender (kind, rows a segment), back to
    back; -> (recv, [(offset, bytes, rows)])."""
    frames = [sender_frame(kind, rows, dtype, seed + s, None if dither is None else dither + s,
                           mode)
              for s, (kind, rows) in enumerate(kinds_rows)]
    recv = torch.cat(frames) if frames else torch.empty(0, dtype=torch.uint8)
    chunks, at = [], 0
    for f, (_kind, rows) in zip(frames, kinds_rows):
        chunks.append((at, f.numel(), sum(rows)))
        at += f.numel()
    return recv, chunks


class StandIn:
    """The device's decoders stood in for on CPU tensors, each call recorded: the batched
    decoder by its host emulation (which writes only its frames' elements, as the kernels
    do), the per-frame CUDA decoder by the CPU decoder."""

    def __init__(self, monkeypatch):
        self.batched, self.per_frame = [], []
        monkeypatch.setattr(_codec, "decompress_batched_cuda", self.batched_call)
        monkeypatch.setattr(_codec, "decompress_cuda", self.frame_call)

    def batched_call(self, buffer, frames, out):
        self.batched.append(list(frames))
        raw = _hl_test.decompress_placed_hd(buffer.numpy().tobytes(), frames)
        target, es = out.view(-1).view(torch.uint8), out.element_size()
        for offset, nbytes, first in frames:
            n = hvd_lossy.frame_info(buffer[offset:offset + nbytes])["raw_bytes"]
            target[first * es:first * es + n].copy_(
                torch.frombuffer(bytearray(raw[first * es:first * es + n]), dtype=torch.uint8))

    def frame_call(self, frame, out):
        self.per_frame.append(frame.numel())
        out.copy_(hvd_lossy.decompress(frame).reshape(-1))


def bits(t):
    return t.contiguous().view(INT_VIEW[t.dtype]).numpy()


def receive(recv, chunks, own, dtype, prefix_bytes=_decode.PREFIX_BYTES):
    """What the all-to-all does with a device buffer (alltoall.Alltoall.decode): heads from
    the prefixes, an output whose rows are every sender's (own rows: `own` rows of 0x7e7e,
    chunk `own` gives none), one decode of every other sender around them. -> (out, starts)."""
    rows = [r if s != own[0] else own[1] for s, (_o, _n, r) in enumerate(chunks)]
    starts = [sum(rows[:s]) for s in range(len(rows))]
    out = torch.empty(sum(rows), D, dtype=dtype)
    out.view(-1).view(torch.uint8).fill_(0x7e)
    senders = [s for s in range(len(chunks)) if s != own[0]]
    heads = _decode.frame_heads(recv, [(o, n) for o, n, _r in chunks], prefix_bytes)
    frames, taken = _decode.place_chunks([chunks[s] for s in senders],
                                         [heads[s] for s in senders],
                                         [starts[s] for s in senders], D)
    _decode.decode_into(recv, frames, [heads[senders[i]] for i in taken], out, trailing=(D,))
    return out, starts, rows


def assert_received_as_the_cpu_decodes(recv, chunks, own, out, starts, rows):
    for s, (offset, nbytes, _r) in enumerate(chunks):
        got = out[starts[s]:starts[s] + rows[s]]
        if s == own[0]:
            assert (got.view(-1).view(torch.uint8) == 0x7e).all(), "the own rows were written"
        elif rows[s]:
            want = hvd_lossy.decompress(recv[offset:offset + nbytes])
            assert np.array_equal(bits(got), bits(want)), f"sender {s} decodes otherwise"


# ---- the heads: bounded prefixes, never the payloads ------------------------------------------

CALLS = {
    "a DLRM exchange in small": [("level1", [16] * 6)] * 3 + [("empty", [])] + [("level1",
                                                                                 [16] * 6)] * 3,
    "empty and one-row segments": [("level1", [0, 1, 37, 1, 64, 0]), ("empty", []),
                                   ("level1", [1]), ("level1", [0, 0, 5])],
    "every route": [("level2", [400, 300]), ("level1", [30, 2]), ("empty", []),
                    ("bucketed", [200]), ("level1", [90]), ("level2", [500])],
    "many segments": [("level1", [3] * 120), ("empty", []), ("level1", [1] * 40)],
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("prefix_bytes", [8, 256, 300, _decode.PREFIX_BYTES, 1 << 24])
def test_heads_from_bounded_prefixes_are_the_full_parse_of_each_chunk(name, prefix_bytes,
                                                                      monkeypatch):
    recv, chunks = received(CALLS[name], torch.float32, seed=len(name))
    copied = []
    gather = _decode.prefixes
    monkeypatch.setattr(_decode, "prefixes",
                        lambda *a: copied.append(gather(*a)) or copied[-1])
    heads = _decode.frame_heads(recv, [(o, n) for o, n, _r in chunks], prefix_bytes)
    full = _codec.chunk_heads(recv, [(o, n) for o, n, _r in chunks])
    assert [tuple(h[:7]) for h in heads] == [tuple(h) for h in full]
    for head, (o, n, _r) in zip(heads, chunks):
        assert head.segments == len(hvd_lossy.frame_info(recv[o:o + n])["segments"])
    # one copy when the prefix holds the header and descriptors; else up to two more, of at
    # most the 256 bytes of a header and what the descriptors (54 bytes at most) may need
    most = sum(min(n, prefix_bytes) + 2 * min(n, max(256, h.header_bytes + 54 * h.segments))
               for h, (_o, n, _r) in zip(heads, chunks))
    assert len(copied) <= 3 and sum(host.numel() for host, _ in copied) <= most
    if prefix_bytes >= 256 and all(h.header_bytes + 54 * h.segments <= prefix_bytes
                                   for h in heads):
        assert len(copied) == 1


def test_a_dlrm_sized_receive_copies_its_prefixes_once_and_no_payload(monkeypatch):
    # 7 senders, a frame each of 26 segments (tables) of 64 rows
    recv, chunks = received([("level1", [64] * 26)] * 7, torch.float32, seed=8)
    copied = []
    gather = _decode.prefixes
    monkeypatch.setattr(_decode, "prefixes", lambda *a: copied.append(gather(*a)) or copied[-1])
    heads = _decode.frame_heads(recv, [(o, n) for o, n, _r in chunks])
    assert all(h.segments == 26 and _decode.route(h) == "batched" for h in heads)
    assert len(copied) == 1
    host, places = copied[0]
    assert places == [(k * _decode.PREFIX_BYTES, _decode.PREFIX_BYTES, n)
                      for k, (_o, n, _r) in enumerate(chunks)]
    assert host.numel() == 7 * _decode.PREFIX_BYTES < recv.numel() // 10
    for (o, _n, _r), (at, avail, _size) in zip(chunks, places):
        assert torch.equal(host[at:at + avail], recv[o:o + avail])


def test_a_prefix_of_a_corrupt_header_gives_the_parsers_message():
    recv, chunks = received([("level1", [4])], torch.float32, seed=1)
    bad = recv.clone()
    bad[0] = ord("X")
    (head,) = _decode.frame_heads(bad, [(0, bad.numel())])
    assert isinstance(head, str) and head.startswith("not an hvd_lossy frame")
    # a chunk shorter than its frame says: the header's total is checked against the chunk
    (head,) = _decode.frame_heads(recv, [(0, recv.numel() - 1)])
    assert isinstance(head, str) and "its header says" in head


def test_routes_follow_the_segments_the_batched_decoder_takes(monkeypatch):
    monkeypatch.delenv(_codec.HOST_DITHER_VARIABLE, raising=False)
    cases = {"level1": "batched", "level2": "frame", "bucketed": "host"}
    for kind, way in cases.items():
        frame = sender_frame(kind, [200, 3], torch.float32, seed=3)
        (head,) = _decode.frame_heads(frame, [(0, frame.numel())])
        assert _decode.route(head) == way
        if way == "frame":
            assert "a level-2 segment (rANS codes)" in head.refusal
    dithered = sender_frame("level1", [20], torch.float16, seed=2, dither=9)
    (head,) = _decode.frame_heads(dithered, [(0, dithered.numel())])
    assert head.dithered and _decode.route(head) == "batched"
    monkeypatch.setenv(_codec.HOST_DITHER_VARIABLE, "1")
    assert _decode.route(head) == "host"


# ---- the batched call: one a receive, frames placed, against the CPU decoder ------------------

CASES = [(name, dtype, dither, mode)
         for name in sorted(CALLS) for dtype in DTYPES
         for dither, mode in ((None, "abs"), (None, "rel"), (1234, "abs"))]


@pytest.mark.parametrize("name,dtype,dither,mode", CASES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_one_batched_call_decodes_a_receive_as_the_cpu_does(name, dtype, dither, mode,
                                                            monkeypatch):
    monkeypatch.delenv(_codec.HOST_DITHER_VARIABLE, raising=False)
    kinds_rows = CALLS[name]
    if dither is not None:  # dithered segments have no row map, so no bucketed one
        kinds_rows = [(k if k != "bucketed" else "level1", r) for k, r in kinds_rows]
    recv, chunks = received(kinds_rows, dtype, seed=len(name), dither=dither, mode=mode)
    own = ([k for k, _ in kinds_rows].index("empty"), 5)
    device = StandIn(monkeypatch)
    out, starts, rows = receive(recv, chunks, own, dtype)
    assert_received_as_the_cpu_decodes(recv, chunks, own, out, starts, rows)
    batched = [(o, n, starts[s] * D) for s, (o, n, r) in enumerate(chunks)
               if s != own[0] and r and kinds_rows[s][0] == "level1"]
    assert device.batched == ([batched] if batched else [])
    assert device.per_frame == [n for s, (o, n, r) in enumerate(chunks)
                                if kinds_rows[s][0] == "level2"]


@pytest.mark.parametrize("seed", range(12))
def test_random_receives_decode_as_the_cpu_does(seed, monkeypatch):
    monkeypatch.delenv(_codec.HOST_DITHER_VARIABLE, raising=False)
    rng = np.random.default_rng(seed)
    kinds_rows = []
    for _ in range(int(rng.integers(1, 7))):
        kind = str(rng.choice(["level1"] * 4 + ["level2", "bucketed", "empty"]))
        n = int(rng.integers(1, 6))
        rows = [int(r) for r in rng.choice([0, 1, 2, 17, 64], size=n)]
        if kind == "level2":
            rows[0] = 300  # enough codes for the entropy coder to pay
        kinds_rows.append((kind, {"empty": [], "bucketed": [200]}.get(kind, rows)))
    own = (int(rng.integers(0, len(kinds_rows))), int(rng.integers(0, 4)))
    kinds_rows[own[0]] = ("empty", [])
    recv, chunks = received(kinds_rows, DTYPES[seed % 3], seed=seed,
                            mode="rel" if seed % 2 else "abs")
    StandIn(monkeypatch)
    out, starts, rows = receive(recv, chunks, own, DTYPES[seed % 3],
                                prefix_bytes=[8, 300, _decode.PREFIX_BYTES][seed % 3])
    assert_received_as_the_cpu_decodes(recv, chunks, own, out, starts, rows)


# ---- refusals name the chunk ------------------------------------------------------------------

def with_a_wrong_width(frame):
    """The frame with its first code block's width one less, CRC32C made valid again."""
    info = hvd_lossy.frame_info(frame)
    assert len(info["segments"]) == 1 and not info["segments"][0]["short_blocks"]
    at = frame.numel() - info["outlier_bytes"] - info["code_bytes"]
    bad = bytearray(frame.numpy().tobytes())
    assert bad[at] > 0
    bad[at] -= 1
    return torch.frombuffer(bytearray(resealed(bytes(bad))), dtype=torch.uint8)


def refusal(recv, chunks, monkeypatch, dtype=torch.float32):
    StandIn(monkeypatch)
    with pytest.raises(_decode.FrameRefusal) as e:
        receive(recv, chunks, (len(chunks), 0), dtype)
    return e.value


def test_a_corrupt_frame_is_refused_as_its_chunk_not_its_place_in_the_batch(monkeypatch):
    good = [sender_frame("level2", [400], torch.float32, seed=1),
            sender_frame("level1", [30], torch.float32, seed=2)]
    bad = with_a_wrong_width(sender_frame("level1", [64], torch.float32, seed=5, ebs=[1e-5]))
    frames = good + [bad]
    recv = torch.cat(frames)
    offsets = np.cumsum([0] + [f.numel() for f in frames])
    chunks = [(int(o), f.numel(), r) for o, f, r in zip(offsets, frames, (400, 30, 64))]
    e = refusal(recv, chunks, monkeypatch)
    # the batched call holds chunks 1 and 2 as its frames 0 and 1
    assert e.index == 2 and not e.mismatch and e.error is hvd_lossy.FrameError
    assert "the code section's blocks do not match" in str(e) and "(frame 1, segment 0)" in str(e)
    flipped = recv.clone()
    flipped[chunks[1][0] + chunks[1][1] - 1] ^= 1  # chunk 1's last byte: its CRC32C fails
    e = refusal(flipped, chunks, monkeypatch)
    assert e.index == 1 and "checksum (CRC32C)" in str(e) and str(e).endswith("(frame 0)")


def test_frames_of_another_dtype_or_row_count_are_mismatches(monkeypatch):
    recv, chunks = received([("level1", [8]), ("level1", [3, 4])], torch.float16, seed=4)
    e = refusal(recv, chunks, monkeypatch, dtype=torch.float32)
    assert e.mismatch and e.index == 0 and "torch.float16" in str(e)
    (o, n, r), rest = chunks[1], chunks[:1]
    e = refusal(recv, rest + [(o, n, r + 1)], monkeypatch, dtype=torch.float16)
    assert e.mismatch and e.index == 1 and "holds 7 rows, its header announced 8" in str(e)


# ---- the batched decoder's scratch: PyTorch's allocator, alive through the call -------------

class ScratchSpy:
    """Records every scratch tensor _codec._device_scratch makes (weakly, so that holding
    them here does not keep them alive)."""

    def __init__(self, monkeypatch):
        self.made, make = [], _codec._device_scratch
        monkeypatch.setattr(_codec, "_device_scratch",
                            lambda n, like: self.record(make(n, like)))

    def record(self, t):
        self.made.append(weakref.ref(t))
        return t

    def alive(self):
        gc.collect()
        return [r() for r in self.made if r() is not None]


def test_the_batched_decoders_scratch_is_torchs_and_lives_until_the_call_returns(monkeypatch):
    """The native call asks for its scratch as its host parse sizes it: every pointer the
    Python side hands it is a tensor's, on the buffer's device, big enough, still alive when
    the call asks for the next one and until it returns, and released after. (The native call
    is stood in for: without a GPU, only the Python side's contract can be checked.)"""
    spy = ScratchSpy(monkeypatch)
    buffer, out = torch.zeros(64, dtype=torch.uint8), torch.empty(8)
    monkeypatch.setattr(_codec, "_stream", lambda t: 1234)
    seen = []

    def native(buf, size, frames, out_ptr, out_bytes, stream, verify, alloc):
        assert (buf, size, out_ptr, out_bytes, stream, verify) == (
            buffer.data_ptr(), 64, out.data_ptr(), 32, 1234, True)
        for n in (0, 300, 4096):
            seen.append((n, alloc(n)))
            live = spy.alive()
            assert [t.data_ptr() for t in live] == [p for _n, p in seen], "scratch was freed"
            for t, (n_asked, _p) in zip(live, seen):
                assert t.device == buffer.device and t.dtype == torch.uint8
                assert t.numel() >= n_asked

    monkeypatch.setattr(_codec._C, "decompress_batched_cuda", native, raising=False)
    _codec.decompress_batched_cuda(buffer, [(0, 64, 0)], out)
    assert len(seen) == 3
    assert spy.alive() == [], "scratch outlived the call"


# ---- on a device (skipped without one) --------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or
                                not getattr(hvd_lossy._C, "WITH_CUDA", False),
                                reason="needs a CUDA device and the CUDA build")


@needs_cuda
@pytest.mark.parametrize("name", sorted(CALLS))
def test_device_receive_decodes_as_the_cpu(name):
    recv, chunks = received(CALLS[name], torch.float32, seed=len(name))
    own = ([k for k, _ in CALLS[name]].index("empty"), 3)
    out, starts, rows = receive(recv.cuda(), chunks, own, torch.float32)
    assert_received_as_the_cpu_decodes(recv, chunks, own, out.cpu(), starts, rows)


@needs_cuda
@pytest.mark.parametrize("name", sorted(CALLS))
def test_device_decompress_chunks_and_decompress_read_every_route(name):
    recv, chunks = received(CALLS[name], torch.bfloat16, seed=2)
    sizes = [n for _o, n, _r in chunks]
    for got, want in zip(hvd_lossy.decompress_chunks(recv.cuda(), sizes),
                         hvd_lossy.decompress_chunks(recv, sizes)):
        assert got.is_cuda and np.array_equal(bits(got.cpu()), bits(want))
    o, n, _r = chunks[-1]
    got = hvd_lossy.decompress(recv[o:o + n].cuda())
    assert np.array_equal(bits(got.cpu()), bits(hvd_lossy.decompress(recv[o:o + n])))


@needs_cuda
def test_device_batched_decode_takes_its_scratch_from_torch(monkeypatch):
    spy = ScratchSpy(monkeypatch)
    recv, chunks = received(CALLS["a DLRM exchange in small"], torch.float32, seed=5)
    sizes = [n for _o, n, _r in chunks]
    got = hvd_lossy.decompress_chunks(recv.cuda(), sizes)
    # the prefixes' gather, the walk and the decode: one workspace each
    assert len(spy.made) >= 3 and spy.alive() == []
    for g, want in zip(got, hvd_lossy.decompress_chunks(recv, sizes)):
        assert np.array_equal(bits(g.cpu()), bits(want))
