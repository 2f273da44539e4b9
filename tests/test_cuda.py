"""Specification of the CUDA codec: device tensors' frames are the CPU codec's byte for byte
(coded on the device at level 1, on the host at level 2), each side decodes the
other's frames, the bound holds on every element, and bad frames raise ValueError before any
device memory is sized from them. tests/test_cuda_encoder.py holds the encoder's own paths.

Skips without a CUDA device. On a machine with one, the extension must have been built with CUDA
(HVD_LOSSY_WITH_CUDA=ON or AUTO with nvcc present): a device without the CUDA build fails.
"""
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hvd_lossy
from hvd_lossy import _C, FrameError
from strategies import DTYPES, SPECIALS, tensors
from tests._hooks import hooks
from tests._format_ref import varint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def bits(x):
    """The raw bit patterns of a float tensor (NaN payloads included), on the CPU."""
    return x.detach().cpu().contiguous().view(torch.int16 if x.element_size() == 2 else torch.int32)


def assert_same_frame(cpu, gpu, what=""):
    gpu = gpu.cpu()
    if torch.equal(cpu, gpu):
        return
    if cpu.numel() != gpu.numel():
        info_c, info_g = hvd_lossy.frame_info(cpu), hvd_lossy.frame_info(gpu)
        keys = [k for k in info_c if info_c[k] != info_g.get(k)]
        raise AssertionError(f"{what}: CPU frame {cpu.numel()} bytes, CUDA frame {gpu.numel()} bytes; "
                             f"fields differ: {[(k, info_c[k], info_g.get(k)) for k in keys]}")
    first = int((cpu != gpu).nonzero()[0])
    raise AssertionError(f"{what}: frames of {cpu.numel()} bytes first differ at byte {first} "
                         f"(header {hvd_lossy.frame_info(cpu)['header_bytes']} bytes): "
                         f"CPU {int(cpu[first])}, CUDA {int(gpu[first])}")


def assert_compress_matches(x, eb, mode="rel", level=1, dedup=True):
    """The CUDA frame equals the CPU frame, and both decoders give the CPU's bits."""
    what = f"{tuple(x.shape)} {x.dtype} eb={eb} {mode} L{level} dedup={dedup}"
    cpu = hvd_lossy.compress(x, eb, mode=mode, level=level, dedup=dedup)
    gpu = hvd_lossy.compress(x.cuda(), eb, mode=mode, level=level, dedup=dedup)
    assert gpu.is_cuda
    assert_same_frame(cpu, gpu, what)
    y_cpu = hvd_lossy.decompress(cpu)
    y_gpu = hvd_lossy.decompress(gpu)
    assert y_gpu.is_cuda and y_gpu.dtype == x.dtype and y_gpu.shape == x.shape
    assert torch.equal(bits(y_cpu), bits(y_gpu)), what
    return cpu, y_cpu


def max_error(x, y):
    x64, y64 = x.double().cpu(), y.double().cpu()
    finite = torch.isfinite(x64)
    return (x64[finite] - y64[finite]).abs().max().item() if finite.any() else 0.0


def lookups(rows, dim, dtype=torch.float32, distinct=None, seed=0):
    """Embedding-lookup-like rows: DLRM uniform init, rows drawn from `distinct` table rows."""
    g = torch.Generator().manual_seed(seed)
    distinct = distinct or rows
    table = (torch.rand(distinct, dim, generator=g) * 2 - 1) / math.sqrt(distinct)
    ids = torch.randint(0, distinct, (rows,), generator=g)
    return table[ids].to(dtype)


# ---- frames identical to the CPU codec ------------------------------------------------------

def test_module_was_built_with_cuda():
    assert _C.WITH_CUDA, "a CUDA device is present but hvd_lossy._C was built without CUDA"


CASES = {
    "random normal": lambda dt: torch.randn(257, 33, generator=torch.Generator().manual_seed(1)).to(dt),
    "lookups with duplicates": lambda dt: lookups(1000, 32, dt, distinct=120),
    "all rows equal": lambda dt: lookups(300, 16, dt, distinct=1),
    "specials": lambda dt: torch.tensor(SPECIALS * 8).reshape(8, len(SPECIALS)).to(dt),
    "wide range (outliers)": lambda dt: (torch.randn(64, 40, generator=torch.Generator().manual_seed(2))
                                         * torch.logspace(-30, 30, 40)).to(dt),
    "one long row": lambda dt: torch.randn(10000, generator=torch.Generator().manual_seed(3)).to(dt),
    "3-d": lambda dt: lookups(6 * 50, 24, dt, distinct=40).reshape(6, 50, 24),
    "0-d": lambda dt: torch.tensor(1.5).to(dt),
    "no rows": lambda dt: torch.empty(0, 32, dtype=dt),
    "empty rows": lambda dt: torch.empty(12, 0, dtype=dt),
    "constant": lambda dt: torch.full((40, 8), 0.25, dtype=dt),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eb,mode", [(0.0, "rel"), (1e-3, "rel"), (0.03, "rel"), (0.5, "rel"),
                                     (1e-2, "abs"), (1e-30, "abs")])
@pytest.mark.parametrize("level", [1, 2])
def test_cuda_frames_are_byte_identical_to_cpu_frames(case, dtype, eb, mode, level):
    x = CASES[case](dtype)
    for dedup in (True, False):
        assert_compress_matches(x, eb, mode, level, dedup)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=tensors(max_dim=40, max_specials=6), eb=st.sampled_from([0.0, 1e-6, 1e-3, 0.01, 0.05, 0.3, 1.0]),
       mode=st.sampled_from(["rel", "abs"]), level=st.sampled_from([1, 2]), dedup=st.booleans())
def test_cuda_matches_cpu_on_any_tensor(x, eb, mode, level, dedup):
    assert_compress_matches(x, eb, mode, level, dedup)


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_lookup_batch_matches_cpu(level, dtype):
    # Many blocks, many rANS streams, long hash runs: the grid-stride and scan paths.
    x = lookups(40000, 32, dtype, distinct=5000, seed=7)
    x[123, 5] = float("nan")
    x[999, 0] = 1e30
    assert_compress_matches(x, 0.01, "rel", level, True)


def test_lossless_fallback_when_most_elements_are_outliers_matches_cpu():
    # A bound far below the float spacing makes every element an outlier: the lossy frame would
    # exceed the worst-case size, so both encoders store the tensor losslessly.
    x = torch.randn(500, 16, generator=torch.Generator().manual_seed(4)) * 1e6 + 1e7
    for level in (1, 2):
        cpu, y = assert_compress_matches(x, 1e-12, "abs", level)
        assert hvd_lossy.frame_info(cpu)["lossless"]
        assert torch.equal(bits(y), bits(x))


def test_rows_differing_only_in_an_outlier_value_are_not_merged_on_cuda():
    x = lookups(64, 8, distinct=1)
    x[10, 3] = float("nan")
    x[20, 3] = float("inf")
    x[30, 3] = float("inf")
    cpu, y = assert_compress_matches(x, 0.01)
    info = hvd_lossy.frame_info(cpu)
    assert info["n_unique"] == 3 and info["n_outliers"] == 2
    assert torch.isinf(y[20, 3]) and torch.isinf(y[30, 3]) and torch.isnan(y[10, 3])


# ---- chunks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [1, 2])
def test_compress_chunks_on_cuda_matches_cpu_buffer_and_sizes(level):
    x = lookups(2600, 32, distinct=300, seed=5)
    rows = [1000, 0, 7, 1, 592, 1000]
    ebs = [0.03, 0.0, 0.01, 0.5, 1e-12, 0.03]
    buf_c, sizes_c = hvd_lossy.compress_chunks(x, rows, ebs, level=level)
    buf_g, sizes_g = hvd_lossy.compress_chunks(x.cuda(), rows, ebs, level=level)
    assert sizes_g == sizes_c == [buf_c.numel()]  # one frame, its pieces the segments
    assert_same_frame(buf_c, buf_g, "compress_chunks buffer")
    for a, b in zip(hvd_lossy.decompress_chunks(buf_c, sizes_c), hvd_lossy.decompress_chunks(buf_g)):
        assert b.is_cuda and torch.equal(bits(a), bits(b))


def test_compress_chunks_of_a_1d_tensor_on_cuda_matches_cpu():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(8))
    buf_c, sizes_c = hvd_lossy.compress_chunks(x, [10, 990], 0.01, level=2)
    buf_g, sizes_g = hvd_lossy.compress_chunks(x.cuda(), [10, 990], 0.01, level=2)
    assert sizes_g == sizes_c
    assert_same_frame(buf_c, buf_g, "1-d chunks")


# ---- the bound, streams, devices ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eb", [1e-4, 0.01, 0.05])
def test_cuda_roundtrip_respects_error_bound_on_every_element(dtype, eb):
    x = torch.randn(3000, 64, generator=torch.Generator().manual_seed(9)).to(dtype).cuda()
    x[0, :8] = torch.tensor(SPECIALS[:8], dtype=dtype)
    frame = hvd_lossy.compress(x, eb)
    y = hvd_lossy.decompress(frame)
    assert max_error(x, y) <= hvd_lossy.frame_info(frame)["eb_abs"]
    assert torch.equal(torch.isnan(x), torch.isnan(y))
    inf = torch.isinf(x)
    assert torch.equal(x[inf], y[inf])


def test_cuda_codec_runs_on_the_callers_stream():
    x = lookups(5000, 32, distinct=700).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        frame = hvd_lossy.compress(x, 0.01, level=2)
        y = hvd_lossy.decompress(frame)
    torch.cuda.current_stream().wait_stream(side)
    cpu = hvd_lossy.compress(x.cpu(), 0.01, level=2)
    assert_same_frame(cpu, frame, "side stream")
    assert torch.equal(bits(y), bits(hvd_lossy.decompress(cpu)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_codec_uses_the_tensors_device_not_the_current_one():
    x = lookups(500, 16, distinct=50).to("cuda:1")
    with torch.cuda.device(0):
        frame = hvd_lossy.compress(x, 0.01)
        y = hvd_lossy.decompress(frame)
    assert frame.device == x.device and y.device == x.device
    assert_same_frame(hvd_lossy.compress(x.cpu(), 0.01), frame, "second device")


# ---- bad input ------------------------------------------------------------------------------

def test_bound_overflow_raises_like_the_cpu():
    x = torch.tensor([[-3e38, 3e38]])
    with pytest.raises(ValueError, match="overflows") as cpu_err:
        hvd_lossy.compress(x, 1e300)
    with pytest.raises(ValueError, match="overflows") as gpu_err:
        hvd_lossy.compress(x.cuda(), 1e300)
    assert str(gpu_err.value) == str(cpu_err.value)
    with pytest.raises(ValueError, match="overflows") as cpu_err:
        hvd_lossy.compress_chunks(x, [1], 1e300)
    with pytest.raises(ValueError, match="overflows") as gpu_err:
        hvd_lossy.compress_chunks(x.cuda(), [1], 1e300)
    assert type(gpu_err.value) is type(cpu_err.value) and str(gpu_err.value) == str(cpu_err.value)
    assert type(gpu_err.value) is ValueError  # not CodecError: a bad argument, not a codec fault


def resealed(frame):
    """The frame with its CRC32C recomputed (so that deeper checks are reached)."""
    frame = frame.clone()
    c = hooks().crc32c(frame.data_ptr() + 7, frame.numel() - 7, False)
    frame[3:7] = torch.tensor(list(c.to_bytes(4, "little")), dtype=torch.uint8)
    return frame


@pytest.mark.parametrize("level", [1, 2])
def test_corrupted_cuda_frames_raise_value_error(level):
    x = lookups(600, 16, distinct=60)
    x[5, 5] = float("nan")
    frame = hvd_lossy.compress(x.cuda(), 0.01, level=level)
    info = hvd_lossy.frame_info(frame)
    assert info["map_bytes"] and info["n_outliers"]
    for pos in (7, info["header_bytes"], frame.numel() // 2, frame.numel() - 1):
        bad = frame.clone()
        bad[pos] ^= 0x40
        with pytest.raises(FrameError, match="CRC32C"):
            hvd_lossy.decompress(bad)
    with pytest.raises(FrameError, match="truncated"):
        hvd_lossy.decompress(frame[:-1])
    with pytest.raises(FrameError, match="truncated"):
        hvd_lossy.decompress(frame[:5])
    bad = frame.clone()
    bad[0] ^= 1
    with pytest.raises(FrameError, match="not an hvd_lossy frame"):
        hvd_lossy.decompress(bad)


def decode_verdict(frame):
    try:
        return "ok", bits(hvd_lossy.decompress(frame))
    except ValueError as e:
        return "error", str(e).split(":")[0]


def assert_decoders_agree_on_tampered_payloads(frame, trials, seed):
    """Payload bytes changed and the CRC32C made valid again: the decoders must reach the same
    verdict (the same tensor, or a ValueError), and the CUDA one must stay in bounds."""
    start = hvd_lossy.frame_info(frame)["header_bytes"]
    rng = random.Random(seed)
    for trial in range(trials):
        bad = frame.clone()
        for _ in range(rng.choice([1, 1, 2, 5])):
            bad[rng.randrange(start, frame.numel())] = rng.randrange(256)
        bad = resealed(bad)
        on_cpu, on_gpu = decode_verdict(bad), decode_verdict(bad.cuda())
        assert on_cpu[0] == on_gpu[0], f"trial {trial}: CPU {on_cpu[0]}, CUDA {on_gpu[0]}"
        if on_cpu[0] == "ok":
            assert torch.equal(on_cpu[1], on_gpu[1]), f"trial {trial}: decoded tensors differ"
    torch.cuda.synchronize()  # a fault from an out-of-bounds access would surface here


@pytest.mark.parametrize("level", [1, 2])
def test_cuda_and_cpu_decoders_agree_on_every_tampered_payload(level):
    x = lookups(3000, 16, distinct=200, seed=11)
    x[7, 3] = float("inf")
    x[50, 0] = 1e20
    frame, _ = hvd_lossy.compress_chunks(x, [1000, 2000], [1e-3, 0.01], mode="abs", level=level)
    segs = hvd_lossy.frame_info(frame)["segments"]
    assert all(s["level"] == level and s["map_bytes"] for s in segs)
    assert sum(s["n_outliers"] for s in segs) == 2
    assert_decoders_agree_on_tampered_payloads(frame, 200, level)


def test_dithered_device_tensors_take_the_cpu_codec_and_stay_on_the_device():
    # No CUDA dither kernel yet: the frame must still be the CPU's, on the tensor's device, and a
    # dithered device frame must decode on the device's side of the API (through the CPU).
    x = torch.randn(300, 16)
    cpu = hvd_lossy.compress(x, 0.02, level=2, dither=99)
    gpu = hvd_lossy.compress(x.cuda(), 0.02, level=2, dither=99)
    assert gpu.is_cuda
    assert_same_frame(cpu, gpu, "dithered")
    y = hvd_lossy.decompress(gpu)
    assert y.is_cuda and torch.equal(bits(y), bits(hvd_lossy.decompress(cpu)))
    buf, sizes = hvd_lossy.compress_chunks(x.cuda(), [100, 200], 0.02, dither=7)
    ref, ref_sizes = hvd_lossy.compress_chunks(x, [100, 200], 0.02, dither=7)
    assert buf.is_cuda and sizes == ref_sizes
    assert_same_frame(ref, buf, "dithered chunks")
    with pytest.raises(ValueError, match="no CUDA decoder"):
        _C.decompress_cuda(gpu.data_ptr(), gpu.numel(), y.data_ptr(), y.numel() * 4,
                           torch.cuda.current_stream().cuda_stream)


# ---- checks before anything is allocated for a device frame (issue #12) -------------------------

def crc32c_on(data, start, n):
    if data.is_cuda:
        return _C.crc32c_cuda(data.data_ptr() + start, n, torch.cuda.current_stream().cuda_stream)
    return hooks().crc32c(data.data_ptr() + start, n, False)


def test_cuda_crc32c_equals_the_cpu_crc32c_at_any_length_and_alignment():
    data = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    dev = data.cuda()
    for start, n in [(0, 0), (0, 1), (1, 1023), (3, 1024), (5, 1025), (7, 65539), (0, 3 << 20)]:
        assert crc32c_on(dev, start, n) == crc32c_on(data, start, n), (start, n)


def forged_frame(n, sealed):
    """A frame (native/frame.h) of n x n float32 (n a multiple of 32) in one lossy level-1
    segment whose rows are all one unique row of zeros: consistent in every size field, a few
    KiB announcing 4 * n * n bytes of output. Its CRC32C is right when sealed, else 0 (wrong)."""
    blocks = bytes(n // 32)  # map and code sections: all blocks of width 0
    body = (bytes([2 << 2]) + varint(n) + varint(1)  # f32, ndim 2, trailing n; one segment
            + bytes([0x04]) + varint(n) + bytes([0, 0, 0x3C])  # HL_SEG_MAP, rows, bound
            + varint(1) + varint(len(blocks)) + blocks + blocks)  # n_unique, code_bytes
    size = 7 + 1 + len(body)
    size += len(varint(size)) - 1
    frame = torch.frombuffer(bytearray(b"HV\x02" + bytes(4) + varint(size) + body),
                             dtype=torch.uint8)
    assert frame.numel() == size
    return resealed(frame) if sealed else frame


def device_memory_growth(call):
    """Peak growth of torch's device memory and drop of the device's free memory during call()."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before, free_before = torch.cuda.max_memory_allocated(), torch.cuda.mem_get_info()[0]
    try:
        call()
    finally:
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, free_before - torch.cuda.mem_get_info()[0]


def test_corrupt_device_frame_announcing_64_gib_raises_crc32c_error_without_allocating():
    # 64 GiB fits an H200 and the limit is raised past it: only the CRC stands in the way.
    frame = forged_frame(1 << 17, sealed=False).cuda()
    assert hvd_lossy.frame_info(frame)["raw_bytes"] == 64 << 30
    limit = 1 << 40
    for call in (lambda: hvd_lossy.decompress(frame, max_output_bytes=limit),
                 lambda: hvd_lossy.decompress_chunks(frame, max_output_bytes=limit)):
        def refused():
            with pytest.raises(FrameError, match="CRC32C"):
                call()
        torch_growth, free_drop = device_memory_growth(refused)
        assert torch_growth < 1 << 20 and free_drop < 256 << 20, (torch_growth, free_drop)


def test_corrupt_device_frame_is_refused_by_its_crc32c_before_its_announced_size():
    frame = forged_frame(1 << 20, sealed=False).cuda()  # 4 TiB announced, over the limit
    with pytest.raises(FrameError, match="CRC32C"):
        hvd_lossy.decompress(frame)
    with pytest.raises(FrameError, match="CRC32C"):
        _C.verify_cuda(frame.data_ptr(), frame.numel(), torch.cuda.current_stream().cuda_stream)


def test_sealed_device_frame_announcing_4_tib_is_refused_without_allocating():
    frame = forged_frame(1 << 20, sealed=True).cuda()  # valid CRC, 2^20 x 2^20 float32
    _C.verify_cuda(frame.data_ptr(), frame.numel(), torch.cuda.current_stream().cuda_stream)
    for call in (lambda: hvd_lossy.decompress(frame), lambda: hvd_lossy.decompress_chunks(frame)):
        def refused():
            with pytest.raises(FrameError, match="max_output_bytes") as info:
                call()
            assert type(info.value) is FrameError
        torch_growth, free_drop = device_memory_growth(refused)
        assert torch_growth < 1 << 20 and free_drop < 256 << 20, (torch_growth, free_drop)


# ---- the CUDA decoder on frames of many segments (issue #10) ------------------------------------

def assert_decodes_alike_on_cuda(x, rows, ebs, mode="rel", level=1, dedup=True):
    """The CPU's frame, decoded by the CUDA decoder, gives the CPU decoder's bits."""
    what = f"{tuple(x.shape)} {x.dtype} rows={rows} ebs={ebs} {mode} L{level} dedup={dedup}"
    frame, _ = hvd_lossy.compress_chunks(x, rows, ebs, mode=mode, level=level, dedup=dedup)
    ref = hvd_lossy.decompress_chunks(frame)[0]
    got = hvd_lossy.decompress(frame.cuda())
    assert got.is_cuda and got.dtype == x.dtype and tuple(got.shape) == tuple(ref.shape), what
    assert torch.equal(bits(got), bits(ref)), what
    return hvd_lossy.frame_info(frame)


@pytest.mark.parametrize("case", sorted(c for c in CASES if c not in ("0-d",)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level", [1, 2])
def test_cuda_decodes_cpu_frames_of_many_segments_bit_exactly(case, dtype, level):
    x = CASES[case](dtype)
    n = x.shape[0]
    for rows, ebs in (([n], [0.01]), ([n // 3, n - n // 3], [0.0, 0.03]), ([0, n, 0], [0.5, 1e-3, 0.0])):
        for dedup in (True, False):
            assert_decodes_alike_on_cuda(x, rows, ebs, "rel", level, dedup)


def test_cuda_decodes_segments_with_coded_maps_outliers_and_escapes():
    # Segments: level 2 with an outlier; lossless; a rANS-coded map (3 distinct rows); level 2
    # with codes past 255 (escapes). The CPU codec's choices checked below make it so.
    x = torch.cat([lookups(1000, 32, distinct=300, seed=5), lookups(64, 32, seed=6),
                   lookups(3000, 32, distinct=3, seed=7), lookups(500, 32, seed=8) * torch.logspace(-3, 0, 32)])
    x[10, 3] = float("nan")
    x[1500, 1] = 1e30
    rows = [1000, 64, 3000, 500]
    info = assert_decodes_alike_on_cuda(x, rows, [0.01, 0.0, 1e-3, 1e-4], "abs", 2, True)
    segs = info["segments"]
    assert any(s["map_coded"] for s in segs) and any(s["n_outliers"] for s in segs)
    assert any(s["lossless"] for s in segs) and any(s["level"] == 2 for s in segs)


# ---- radix-packed level-1 codes (frame.h "Radix section") ---------------------------------------

def uniform_rows(rows, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(rows, dim, generator=g) - 0.5) * 0.1  # rel 0.03: codes below K = 17


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_decodes_radix_segments_bit_exactly(dtype):
    x = torch.cat([uniform_rows(64, 32, 1), uniform_rows(40, 32, 2)[torch.arange(200) % 40],
                   uniform_rows(1, 32, 3)]).to(dtype)
    x[70, 5] = float("nan")
    x[80, 6] = float("inf")
    for rows, ebs in (([64, 200, 1], [0.03, 0.03, 0.05]), ([265], [0.012])):
        info = assert_decodes_alike_on_cuda(x, rows, ebs, "rel", 1, True)
        assert any(s["radix"] for s in info["segments"])


def test_cuda_and_cpu_decoders_agree_on_every_tampered_radix_payload():
    x = uniform_rows(1000, 16, seed=12)
    frame, _ = hvd_lossy.compress_chunks(x, [600, 400], [0.03, 0.05], level=1)
    assert all(s["radix"] for s in hvd_lossy.frame_info(frame)["segments"])
    assert_decoders_agree_on_tampered_payloads(frame, 200, 5)
