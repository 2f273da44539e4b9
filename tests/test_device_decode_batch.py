"""The batched CUDA decoder reads every level-1 segment of a received buffer's frames from one
table (native/common/segment_table.h: headers parsed on the host, payloads addressed by offset,
each stage one pass over all segments). That decomposition, run on the host
(native/testing/decode_batch_ref.h, through _hl_test.decompress_batched_hd: the per-item
functions the kernels are to call, a few blocks a segment with strided items, one call-wide
scan of the blocks' widths), must decode CPU-encoded frames bit for bit as the CPU decoder does:
every dtype, abs and rel bounds, dither, dedup on and off, block-packed, radix and short-block
code sections, empty and one-row segments, NaN and Inf outliers, lossless segments, several
frames back to back. Level 2 and entropy-coded maps have no batched decoder: the table refuses
them by name and they keep the per-segment path. No GPU is needed."""
import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)
from tests.test_device_batch import D, INT_VIEW, rows_for

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Frames of a call: the rows of each segment of each frame, and the segments' bounds (abs mode;
# "rel" scales them by each frame's range). 0 is lossless.
CALLS = {
    "one frame of one segment": [([300], [0.03])],
    "empty and one-row segments": [([0, 1, 37, 1, 64, 0], [0.02, 0.05, 0.01, 0.0, 1e-3, 0.02])],
    "a DLRM exchange in small": [([16] * 6, [0.02] * 6)] * 4,
    "frames of no rows between others": [([0], [0.1]), ([40, 3], [1e-4, 0.3]), ([0, 0], [0.1, 0.1]),
                                         ([90], [0.0])],
}


def encode_call(frames, dtype, mode, dedup, dither, level=1, seed=0, spread=10.0):
    """The CPU encoder's frames of a call, back to back: (buffer bytes, sizes)."""
    parts = []
    for k, (rows, ebs) in enumerate(frames):
        x = rows_for(sum(rows), seed + k, dtype, specials=k % 2 == 0, spread=spread)
        d = None if dither is None else dither + 7 * k
        buf, sizes = hvd_lossy.compress_chunks(x, rows, ebs, mode=mode, level=level, dedup=dedup,
                                               dither=d)
        parts.append(buf.numpy().tobytes()[:sizes[0]])
    return b"".join(parts), [len(p) for p in parts]


def cpu_decoded(buffer, sizes):
    """The CPU decoder's raw bits of every frame, concatenated."""
    out = hvd_lossy.decompress_chunks(torch.frombuffer(bytearray(buffer), dtype=torch.uint8),
                                      sizes)
    return b"".join(t.contiguous().view(INT_VIEW[t.dtype]).numpy().tobytes() for t in out)


def assert_decodes_as_the_cpu(buffer, sizes):
    want = cpu_decoded(buffer, sizes)
    got = _hl_test.decompress_batched_hd(buffer, sizes)
    assert len(got) == len(want)
    if got != want:
        first = next(i for i in range(len(want)) if got[i] != want[i])
        pytest.fail(f"batched decode differs from the CPU decoder's first at byte {first} of "
                    f"{len(want)}")


def packings(buffer, sizes):
    """The code-section packing of every lossy level-1 segment with codes."""
    seen, at = set(), 0
    for s in sizes:
        info = hvd_lossy.frame_info(torch.frombuffer(bytearray(buffer[at:at + s]),
                                                     dtype=torch.uint8))
        for seg in info["segments"]:
            if not seg["lossless"] and seg["n_unique"]:
                seen.add("radix" if seg["radix"] else "short" if seg["short_blocks"] else "block")
        at += s
    return seen


CASES = [(name, dtype, mode, dither, dedup)
         for name in sorted(CALLS)
         for dtype in DTYPES
         for mode in ("abs", "rel")
         for dither, dedup in ((None, True), (None, False), (4321, True))]


@pytest.mark.parametrize("name,dtype,mode,dither,dedup", CASES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_batched_decoder_reads_cpu_frames_bit_for_bit(name, dtype, mode, dither, dedup):
    buffer, sizes = encode_call(CALLS[name], dtype, mode, dedup, dither, seed=len(name))
    assert_decodes_as_the_cpu(buffer, sizes)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spread,eb,packing", [(10.0, 1e-5, "block"), (None, 0.5, "radix"),
                                               (1.0, 0.01, "short")])
def test_every_code_packing_decodes_as_on_the_cpu(dtype, spread, eb, packing):
    frames = [([50, 1, 200], [eb] * 3), ([120], [eb])]
    buffer, sizes = encode_call(frames, dtype, "abs", False, None, seed=3, spread=spread)
    assert packing in packings(buffer, sizes)
    assert_decodes_as_the_cpu(buffer, sizes)


@pytest.mark.parametrize("seed", range(10))
def test_batched_decoder_matches_the_cpu_decoder_on_random_calls(seed):
    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(1, 8))
        frames.append(([int(r) for r in rng.choice([0, 1, 2, 5, 33, 70], size=n)],
                       [float(b) for b in rng.choice([0.0, 1e-4, 0.01, 0.2], size=n)]))
    dither = None if seed % 3 else int(rng.integers(0, 2 ** 24 - 100))
    spread = [10.0, None, 1.0][seed % 3]  # block-packed, radix and short-block codes
    buffer, sizes = encode_call(frames, DTYPES[seed % 3], "rel" if seed % 2 else "abs",
                                bool(seed % 4), dither, seed=seed, spread=spread)
    assert_decodes_as_the_cpu(buffer, sizes)


def test_level2_frames_have_no_batched_decoder_and_keep_the_per_segment_path():
    frames = [([4], [0.1]), ([800, 800], [0.01, 0.01])]
    buffer, sizes = encode_call(frames, torch.float32, "abs", False, None, level=2, spread=1.0)
    info = hvd_lossy.frame_info(torch.frombuffer(bytearray(buffer[sizes[0]:]), dtype=torch.uint8))
    assert [s["level"] for s in info["segments"]] == [2, 2]
    with pytest.raises(ValueError, match="frame 1, segment 0: a level-2 segment .rANS codes. "
                                         "has no batched device decoder; expected level 1"):
        _hl_test.decompress_batched_hd(buffer, sizes)
    # the path that reads them (on the device: decompress_cuda, segment by segment) decodes
    # them as the CPU does; here the CPU decoder stands for it
    assert len(cpu_decoded(buffer, sizes)) == 1604 * D * 4


def resealed(frame):
    """The frame's bytes with the CRC32C recomputed, so that the payload checks are reached."""
    t = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
    c = _hl_test.crc32c(t.data_ptr() + 7, t.numel() - 7)
    return frame[:3] + c.to_bytes(4, "little") + frame[7:]


def a_frame_with_a_wrong_width():
    """(frame, sizes, its code section's bytes): a block-packed frame whose first block's width
    is one less than written, its CRC32C made valid again."""
    buffer, sizes = encode_call([([64], [1e-5])], torch.float32, "abs", False, None, seed=5)
    info = hvd_lossy.frame_info(torch.frombuffer(bytearray(buffer), dtype=torch.uint8))
    assert packings(buffer, sizes) == {"block"}
    width_at = sizes[0] - info["outlier_bytes"] - info["code_bytes"]
    bad = bytearray(buffer)
    assert bad[width_at] > 0
    bad[width_at] -= 1
    return resealed(bytes(bad)), sizes, info["code_bytes"]


def test_a_code_section_whose_widths_do_not_add_up_raises_frame_error():
    frame, sizes, code_bytes = a_frame_with_a_wrong_width()
    with pytest.raises(hvd_lossy.FrameError, match="the code section's blocks do not match its "
                                                   f"{code_bytes} bytes .frame 0, segment 0."):
        _hl_test.decompress_batched_hd(frame, sizes)


def test_a_row_map_not_numbered_by_first_occurrence_raises_frame_error_naming_its_frame():
    buffer, sizes = encode_call([([30], [0.01]), ([200, 64], [0.01, 0.01])], torch.float32, "abs",
                                True, None, seed=11)
    second = bytearray(buffer[sizes[0]:])
    info = hvd_lossy.frame_info(torch.frombuffer(second, dtype=torch.uint8))
    seg = info["segments"][0]
    assert seg["n_unique"] < seg["n_rows"] and not seg["map_coded"] and not seg["map_bucketed"]
    # the payloads (map, code, outliers a segment) follow all descriptors, back to back; the map
    # opens segment 0's: its block widths, then the planes. Bit 0 of a block's top plane is the
    # top bit of the block's entry 0, which must be 0
    payloads = sum(g["map_bytes"] + g["code_bytes"] + g["outlier_bytes"] for g in info["segments"])
    map_at = len(second) - payloads
    width = second[map_at]
    assert width > 0
    at = map_at + (seg["n_rows"] + 31) // 32 + 4 * (width - 1)
    assert at < map_at + seg["map_bytes"]
    second[at] ^= 1
    bad = buffer[:sizes[0]] + resealed(bytes(second))
    with pytest.raises(hvd_lossy.FrameError):
        cpu_decoded(bad, sizes)
    with pytest.raises(hvd_lossy.FrameError, match="the row map does not number rows by first "
                                                   "occurrence .frame 1, segment 0."):
        _hl_test.decompress_batched_hd(bad, sizes)


def test_frames_running_past_the_buffer_are_refused():
    buffer, sizes = encode_call([([4], [0.1])], torch.float32, "abs", True, None)
    with pytest.raises(ValueError, match=f"frame 0 of {sizes[0] + 1} bytes at 0 runs past the "
                                         f"buffer's {len(buffer)} bytes"):
        _hl_test.decompress_batched_hd(buffer, [sizes[0] + 1])


def device_batched(buffer, sizes):
    """The frames decoded on the device by _C.decompress_batched_cuda, their raw bits."""
    from hvd_lossy import _C
    frames = torch.frombuffer(bytearray(buffer), dtype=torch.uint8)
    starts = np.cumsum([0] + sizes)
    n = sum(hvd_lossy.frame_info(frames[a:b])["raw_bytes"] for a, b in zip(starts, starts[1:]))
    frames = frames.cuda()
    out = torch.empty(n, dtype=torch.uint8, device="cuda")
    _C.decompress_batched_cuda(frames.data_ptr(), frames.numel(), sizes, out.data_ptr(),
                               out.numel(), torch.cuda.current_stream().cuda_stream)
    return out.cpu().numpy().tobytes()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or
                                not hasattr(hvd_lossy._C, "decompress_batched_cuda"),
                                reason="needs a CUDA device and the CUDA build")


@needs_cuda
@pytest.mark.parametrize("name,dtype,mode,dither,dedup", CASES[::5],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_device_batched_decoder_reads_cpu_frames_bit_for_bit(name, dtype, mode, dither, dedup):
    buffer, sizes = encode_call(CALLS[name], dtype, mode, dedup, dither, seed=len(name))
    assert device_batched(buffer, sizes) == cpu_decoded(buffer, sizes)


@needs_cuda
def test_device_batched_decoder_names_a_corrupt_code_section():
    frame, sizes, code_bytes = a_frame_with_a_wrong_width()
    with pytest.raises(hvd_lossy.FrameError, match="the code section's blocks do not match its "
                                                   f"{code_bytes} bytes .frame 0, segment 0."):
        device_batched(frame, sizes)
