"""The CUDA encoder (native/cuda/) writes the CPU encoder's frames byte for byte on inputs chosen
for each of its paths, and device tensors' all-to-all chunks are those frames. Skipped without a
CUDA device (tests/test_level1_shared.py checks the shared functions on the host)."""
import pytest
import torch

import hvd_lossy
from hvd_lossy import _C
from tests._hooks import hooks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def bits(x):
    x = x.detach().cpu().contiguous()
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def assert_same(cpu, dev, what):
    assert dev.is_cuda, what
    dev = dev.cpu()
    if torch.equal(cpu, dev):
        return
    if cpu.numel() != dev.numel():
        raise AssertionError(f"{what}: CPU frame {cpu.numel()} bytes, CUDA {dev.numel()}: "
                             f"{hvd_lossy.frame_info(cpu)} vs {hvd_lossy.frame_info(dev)}")
    first = int((cpu != dev).nonzero()[0])
    raise AssertionError(f"{what}: frames of {cpu.numel()} bytes first differ at byte {first}")


def rng_tensor(rows, dim, seed, kind):
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(rows, dim, generator=g)
    if kind == "scaled":  # row scales change: short blocks
        return torch.randn(rows, dim, generator=g) * 2.0 ** torch.randint(0, 9, (rows, 1), generator=g)
    if kind == "uniform":  # rel 0.03 codes below 17: radix
        return (torch.rand(rows, dim, generator=g) - 0.5) * 0.1
    if kind == "hot":  # duplicate-heavy lookups: a row map
        table = torch.randn(max(rows // 16, 1), dim, generator=g)
        return table[torch.randint(0, table.shape[0], (rows,), generator=g)]
    if kind == "specials":
        x = torch.randn(rows, dim, generator=g)
        flat = x.view(-1)
        for i, v in zip((0, 7, flat.numel() // 2, flat.numel() - 1),
                        (float("nan"), float("inf"), -float("inf"), 1e30)):
            flat[i] = v
        return x
    raise ValueError(kind)


KINDS = ["normal", "scaled", "uniform", "hot", "specials"]
SPLITS = [([1.0], [0.01]), ([0.3, 0.0, 0.7], [0.03, 0.5, 0.0]), ([0.5, 0.5], [1e-3, 0.2])]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["rel", "abs"])
@pytest.mark.parametrize("dedup", [True, False])
def test_cuda_frames_are_byte_identical_to_cpu_frames(kind, dtype, mode, dedup):
    x = rng_tensor(600, 32, KINDS.index(kind), kind).to(dtype)
    for fractions, ebs in SPLITS:
        rows = [int(f * x.shape[0]) for f in fractions]
        rows[-1] += x.shape[0] - sum(rows)
        what = f"{kind} {dtype} {mode} dedup={dedup} rows={rows} ebs={ebs}"
        cpu, cpu_sizes = hvd_lossy.compress_chunks(x, rows, ebs, mode=mode, level=1, dedup=dedup)
        dev, dev_sizes = hvd_lossy.compress_chunks(x.cuda(), rows, ebs, mode=mode, level=1,
                                                   dedup=dedup)
        assert_same(cpu, dev, what)
        assert dev_sizes == cpu_sizes
        got = hvd_lossy.decompress_chunks(dev)
        ref = hvd_lossy.decompress_chunks(cpu)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref)), what


@pytest.mark.parametrize("shape", [(), (1,), (1000,), (7, 13), (4, 6, 10), (0, 8), (3, 0)])
def test_cuda_frame_of_one_tensor_of_any_shape_is_the_cpus(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    for eb, mode in ((0.01, "rel"), (1e-3, "abs"), (0.0, "rel")):
        cpu = hvd_lossy.compress(x, eb, mode=mode)
        dev = hvd_lossy.compress(x.cuda(), eb, mode=mode)
        assert_same(cpu, dev, f"{shape} eb={eb} {mode}")


def test_mostly_outlier_segments_turn_lossless_as_on_the_cpu():
    # Every element past the quantizer's range, no two rows alike: the outliers outgrow the
    # sections' worst case (lossy_exceeds_bound).
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(3)) * 1e30
    cpu, _ = hvd_lossy.compress_chunks(x, [64], 0.01, mode="abs")
    dev, _ = hvd_lossy.compress_chunks(x.cuda(), [64], 0.01, mode="abs")
    assert_same(cpu, dev, "most outliers")
    assert hvd_lossy.frame_info(cpu)["segments"][0]["lossless"]


def test_every_level1_packing_is_exercised_and_matches():
    # radix (K = 17), short blocks (row scales) and block packing (wide uniform codes)
    cases = [(rng_tensor(512, 32, 1, "uniform"), 0.03, "rel"),
             (rng_tensor(512, 32, 2, "scaled"), 0.5, "abs"),
             (rng_tensor(512, 32, 3, "normal") * 1e4, 1e-3, "abs")]
    for x, eb, mode in cases:
        cpu, _ = hvd_lossy.compress_chunks(x, [512], eb, mode=mode, level=1)
        dev, _ = hvd_lossy.compress_chunks(x.cuda(), [512], eb, mode=mode, level=1)
        assert_same(cpu, dev, f"eb={eb} {mode}")
    radix = hvd_lossy.frame_info(hvd_lossy.compress_chunks(cases[0][0], [512],
                                                           0.03)[0])["segments"][0]["radix"]
    assert radix


def test_grouped_layout_with_prefix_and_extension_matches_and_keeps_the_prefixes():
    x = rng_tensor(700, 16, 4, "hot")
    rows, ebs, groups, prefix = [100, 0, 300, 300], [0.01, 0.02, 0.0, 0.05], [2, 0, 2], 6
    ext = b"\x01protocol"
    cap = hvd_lossy.max_grouped_bytes(rows, [16], groups, prefix)
    out = []
    for t in (x, x.cuda()):
        buf = torch.full((cap,), 0xAB, dtype=torch.uint8, device=t.device)
        got = hvd_lossy.compress_grouped(t, rows, ebs, groups, prefix, buf, 0, level=1,
                                         extension=ext)
        out.append((buf.cpu(), got))
    assert out[0][1] == out[1][1]
    assert torch.equal(out[0][0], out[1][0])


@pytest.mark.parametrize("level,dither", [(2, None), (2, 9)])
def test_level2_device_frames_are_coded_on_the_host_with_the_same_bytes(level, dither):
    x = rng_tensor(300, 16, 5, "normal")
    cpu, sizes = hvd_lossy.compress_chunks(x, [100, 200], 0.02, level=level, dither=dither)
    dev, dev_sizes = hvd_lossy.compress_chunks(x.cuda(), [100, 200], 0.02, level=level,
                                               dither=dither)
    assert_same(cpu, dev, f"level {level} dither {dither}")
    assert sizes == dev_sizes


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["rel", "abs"])
def test_dithered_device_frames_are_the_cpus_and_decode_as_the_cpu_decodes(kind, dtype, mode,
                                                                          monkeypatch):
    monkeypatch.delenv("HVD_LOSSY_HOST_DITHER", raising=False)
    x = rng_tensor(301, 24, 17, kind).to(dtype)
    rows, ebs = [0, 1, 150, 1, 149], [0.02, 0.01, 0.0, 0.05, 1e-3]
    if mode == "abs":
        ebs = [e * 4 for e in ebs]
    cpu, sizes = hvd_lossy.compress_chunks(x, rows, ebs, mode=mode, level=1, dither=77)
    dev, dev_sizes = hvd_lossy.compress_chunks(x.cuda(), rows, ebs, mode=mode, level=1, dither=77)
    assert_same(cpu, dev, f"dithered {kind} {dtype} {mode}")
    assert sizes == dev_sizes
    assert any(s["dither_seed"] is not None for s in hvd_lossy.frame_info(cpu)["segments"])
    want = hvd_lossy.decompress(cpu)
    assert torch.equal(bits(hvd_lossy.decompress(dev)), bits(want))  # the CUDA decoder
    assert torch.equal(bits(hvd_lossy.decompress(cpu.cuda())), bits(want))
    # the host path, kept for comparison, writes and reads the same bytes
    monkeypatch.setenv("HVD_LOSSY_HOST_DITHER", "1")
    host, _ = hvd_lossy.compress_chunks(x.cuda(), rows, ebs, mode=mode, level=1, dither=77)
    assert_same(cpu, host, "host dither")
    assert torch.equal(bits(hvd_lossy.decompress(host)), bits(want))


def test_cuda_encoder_reports_a_bound_overflow_like_the_cpu():
    x = torch.tensor([[-3e38, 3e38]])
    with pytest.raises(ValueError, match="overflows a double") as cpu:
        hvd_lossy.compress_chunks(x, [1], 1e300)
    with pytest.raises(ValueError, match="overflows a double") as dev:
        hvd_lossy.compress_chunks(x.cuda(), [1], 1e300)
    assert str(cpu.value) == str(dev.value)


def test_cuda_decoder_reads_short_block_sections_bit_exactly():
    x = rng_tensor(512, 32, 6, "scaled")
    dev, _ = hvd_lossy.compress_chunks(x.cuda(), [200, 312], [0.5, 0.25], mode="abs")
    y = torch.cat(hvd_lossy.decompress_chunks(dev)).cpu()
    assert y.shape == x.shape
    assert float((y.double() - x.double()).abs().max()) <= 0.5
    ref = hvd_lossy.compress_chunks(x, [200, 312], [0.5, 0.25], mode="abs")[0]
    assert torch.equal(bits(y), bits(torch.cat(hvd_lossy.decompress_chunks(ref))))


def test_device_alltoall_chunk_is_one_frame_with_the_protocol_extension():
    # The transport's pack on a device tensor (one rank: the frames compress_grouped writes)
    x = rng_tensor(256, 16, 7, "hot").cuda()
    cap = hvd_lossy.max_grouped_bytes([128, 128], [16], [1, 1], 0)
    buf = torch.empty(cap, dtype=torch.uint8, device="cuda")
    sizes, frames = hvd_lossy.compress_grouped(x, [128, 128], [0.01, 0.01], [1, 1], 0, buf, 0,
                                               extension=b"\x05ext")
    first = buf[:frames[0]].cpu()
    info = hvd_lossy.frame_info(first)
    assert info["extension"] == b"\x05ext" and len(info["segments"]) == 1
    assert sum(sizes) == sum(frames)  # a piece's size: its segment, the first also the header


def resealed(frame):
    frame = frame.clone()
    c = hooks().crc32c(frame.data_ptr() + 7, frame.numel() - 7, False)
    frame[3:7] = torch.tensor(list(c.to_bytes(4, "little")), dtype=torch.uint8)
    return frame


def verdict(frame):
    try:
        return "ok", bits(torch.cat([y.reshape(-1) for y in hvd_lossy.decompress_chunks(frame)]))
    except ValueError as e:
        return type(e).__name__, None


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_decodes_cpu_short_block_frames_bit_exactly(dtype):
    x = (rng_tensor(400, 32, 8, "specials") * 2.0 ** torch.randint(0, 9, (400, 1))).to(dtype)
    frame, _ = hvd_lossy.compress_chunks(x, [150, 250], [0.5, 0.25], mode="abs", level=1)
    assert any(s["short_blocks"] for s in hvd_lossy.frame_info(frame)["segments"])
    assert verdict(frame.cuda())[0] == "ok"
    assert torch.equal(verdict(frame.cuda())[1], verdict(frame)[1])


def test_cuda_and_cpu_decoders_agree_on_every_tampered_short_block_payload():
    x = rng_tensor(600, 16, 9, "scaled")
    frame, _ = hvd_lossy.compress_chunks(x, [200, 400], [0.5, 1.0], mode="abs", level=1)
    assert all(s["short_blocks"] for s in hvd_lossy.frame_info(frame)["segments"])
    start = hvd_lossy.frame_info(frame)["header_bytes"]
    g = torch.Generator().manual_seed(13)
    for trial in range(200):
        bad = frame.clone()
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            at = int(torch.randint(start, frame.numel(), (1,), generator=g))
            bad[at] = int(torch.randint(0, 256, (1,), generator=g))
        bad = resealed(bad)
        on_cpu, on_gpu = verdict(bad), verdict(bad.cuda())
        assert on_cpu[0] == on_gpu[0], f"trial {trial}: CPU {on_cpu[0]}, CUDA {on_gpu[0]}"
        if on_cpu[0] == "ok":
            assert torch.equal(on_cpu[1], on_gpu[1]), f"trial {trial}: decoded tensors differ"
    torch.cuda.synchronize()


def test_a_device_frame_of_no_segments_decodes_to_no_rows():
    # What a device receiver gets from a sender that sends it no rows (the alltoall's chunk).
    frame = torch.frombuffer(bytearray(_C.empty_frame(0, [16], b"\x01ext")), dtype=torch.uint8)
    out = torch.empty(0, 16, device="cuda")
    assert hvd_lossy.decompress(frame.cuda(), out=out).shape == (0, 16)
    assert hvd_lossy.decompress(frame.cuda()).shape == (0, 16)


def device_activity(fn):
    """(kernels, memcpys, memsets) one call of fn puts on the device, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events()]
    copies = sum("memcpy" in n for n in names)
    sets = sum("memset" in n for n in names)
    return len(names) - copies - sets, copies, sets


@pytest.mark.parametrize("dither", [None, 99])
def test_a_grouped_call_launches_the_same_kernels_for_8_pieces_as_for_208(dither):
    """One launch set per call (native/common/piece_table.h): the pieces share every launch, so
    the device work of a call does not grow with its pieces."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(208 * 64, 32, generator=g)[torch.randint(0, 208 * 64, (208 * 64,), generator=g)]
    x = x.cuda()

    def call(pieces):
        rows, groups = [208 * 64 // pieces] * pieces, [pieces // 8] * 8
        out = torch.empty(hvd_lossy.max_grouped_bytes(rows, [32], groups, 0), dtype=torch.uint8,
                          device="cuda")
        return lambda: hvd_lossy.compress_grouped(x, rows, [0.01] * pieces, groups, 0, out,
                                                  mode="rel", level=1, dither=dither)

    few, many = device_activity(call(8)), device_activity(call(208))
    assert few == many, (few, many)
    kernels, copies, _sets = many
    assert copies <= 3, many  # the table and the heads up, the results down


def test_batched_pieces_of_every_size_match_the_cpu_frames():
    """Pieces of 0, 1 and many rows in one call, next to each other in the device table, each
    coded as the CPU codes it alone in its frame."""
    rows = [0, 1, 300, 2, 0, 1000, 33]
    x = rng_tensor(sum(rows), 24, 8, "scaled")
    x[5, 3] = float("nan")
    x[400, 0] = float("inf")
    groups = [2, 3, 2]
    ebs = [0.01, 0.0, 0.03, 1e-4, 0.02, 0.02, 0.5]
    cap = hvd_lossy.max_grouped_bytes(rows, [24], groups, 2)
    out_cpu = torch.zeros(cap, dtype=torch.uint8)
    out_dev = torch.zeros(cap, dtype=torch.uint8, device="cuda")
    want = hvd_lossy.compress_grouped(x, rows, ebs, groups, 2, out_cpu, mode="abs")
    got = hvd_lossy.compress_grouped(x.cuda(), rows, ebs, groups, 2, out_dev, mode="abs")
    assert got == want
    assert_same(out_cpu, out_dev, "batched grouped layout")
