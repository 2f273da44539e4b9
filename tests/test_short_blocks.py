"""Short-block level-1 code sections (native/frame.h "Short-block section"): blocks of 16 codes
with 4-bit widths, chosen when smaller than block and radix packing. Lossless on the codes: a
frame with them decodes to exactly what the level-2 frame of the same codes (entropy coded, never
in short blocks) decodes to.
"""
import numpy as np
import pytest
import torch

import hvd_lossy
from tests._format_ref import block_packed, level1_section, short_packed
from tests.test_radix import (assert_flips_raise_and_resealed_ones_raise_or_decode, code_section,
                              codes_of, sealed_frame, level1_frame)


def scaled_codes(n_blocks, seed, widest=6):
    """Codes whose width changes from one block of 16 to the next (0..widest bits), as the rows
    of trained lookups and gradients change scale; returns (rows of 16 at abs bound 0.5, codes)."""
    rng = np.random.default_rng(seed)
    widths = rng.integers(0, widest + 1, size=n_blocks)
    z = np.concatenate([rng.integers(0, 1 << w, size=16) if w else np.zeros(16, np.int64)
                        for w in widths]) if n_blocks else np.zeros(0, np.int64)
    return codes_of(z, 16), z


def level2_decoded(x):
    return hvd_lossy.decompress(hvd_lossy.compress(x, 0.5, mode="abs", level=2, dedup=False))


# ---- the encoder ------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 2, 3, 31, 64, 65, 1000])
def test_codes_of_changing_scale_are_in_short_blocks_the_bytes_frame_h_describes(rows):
    x, z = scaled_codes(rows, seed=rows)
    frame = level1_frame(x, 0.5, dedup=False)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    kind, section = level1_section(z.tolist())
    assert code_section(frame) == section and seg["short_blocks"] == (kind == "short")
    if rows >= 31:
        assert kind == "short" and len(section) < 0.9 * len(block_packed(z.tolist()))
    assert torch.equal(hvd_lossy.decompress(frame), x)  # integers at step 1: exact
    assert torch.equal(hvd_lossy.decompress(frame), level2_decoded(x))


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 1000, 1001])
def test_a_short_section_of_any_length_pads_its_last_block_and_nibble_with_zeros(n):
    rng = np.random.default_rng(n)
    z = rng.integers(0, 2, size=n) << rng.integers(0, 12, size=n)  # one wide code in many
    section = short_packed(z.tolist())
    frame = sealed_frame(section, rows=1, dim=n)
    assert hvd_lossy.decompress(frame).flatten().tolist() == codes_of(z).flatten().tolist()
    if -(-n // 16) % 2:  # an odd number of blocks: the last byte's high nibble is padding
        assert section[1 + n // 32] >> 4 == 0


def test_short_blocks_are_chosen_only_when_smaller_than_block_and_radix_packing():
    # uniform 4-bit codes: a nibble a 16 costs what a byte a 32 does, plus the mark: block packing
    z = np.arange(64 * 32) % 16
    frame = level1_frame(codes_of(z, 32), 0.5, dedup=False)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    assert not seg["short_blocks"] and seg["radix"] is None
    assert code_section(frame) == block_packed(z.tolist())
    # uniform codes below 17 over long sections: radix packing
    rng = np.random.default_rng(0)
    z = rng.integers(0, 17, size=64 * 32)
    frame = level1_frame(codes_of(z, 32), 0.5, dedup=False)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    assert seg["radix"] == 17 and not seg["short_blocks"]


def test_codes_of_2_pow_15_or_more_are_never_in_short_blocks():
    x, z = scaled_codes(64, seed=3)
    x[5, 3] = 2 ** 14  # zigzag 2^15: 16 bits in one block, the rest as narrow as before
    frame = level1_frame(x, 0.5, dedup=False)
    seg = hvd_lossy.frame_info(frame)["segments"][0]
    assert not seg["short_blocks"]
    assert torch.equal(hvd_lossy.decompress(frame), x)


def test_level2_and_lossless_segments_never_carry_short_blocks():
    x, _ = scaled_codes(64, seed=4)
    for frame in (hvd_lossy.compress_chunks(x, [64], 0.5, mode="abs", level=2)[0],
                  hvd_lossy.compress_chunks(x, [64], 0.0, level=1)[0]):
        assert not any(s["short_blocks"] for s in hvd_lossy.frame_info(frame)["segments"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(dedup=True), dict(dedup=False), dict(dither=4242)],
                         ids=["dedup", "nodedup", "dither"])
def test_rows_of_changing_scale_with_nan_inf_and_outliers_decode_bit_exact_like_level2(dtype, kw):
    g = torch.Generator().manual_seed(5)
    rows = [64, 100, 37]
    x = torch.randn(sum(rows), 16, generator=g) * torch.rand(sum(rows), 1, generator=g) ** 4
    if "dither" not in kw:
        x = x[torch.randint(0, 120, (sum(rows),), generator=g)]
    x = x.to(dtype)
    flat = x.view(-1)
    for i, v in enumerate([float("nan"), float("inf"), -float("inf")]):
        flat[(131 * i + 5) % flat.numel()] = v
    frame = hvd_lossy.compress_chunks(x, rows, 0.003, mode="abs", level=1, **kw)[0]
    info = hvd_lossy.frame_info(frame)
    assert all(s["short_blocks"] for s in info["segments"]), info["segments"]
    eb = info["segments"][0]["eb_abs"]
    ref = hvd_lossy.decompress_chunks(*hvd_lossy.compress_chunks(x, rows, eb, mode="abs", level=2,
                                                                 **kw))
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    y = hvd_lossy.decompress(frame)
    assert torch.equal(y.view(bits), torch.cat(ref).view(y.shape).view(bits))
    finite = torch.isfinite(x)
    assert (x[finite].double() - y[finite].double()).abs().max().item() <= eb
    assert torch.equal(torch.isnan(x), torch.isnan(y))


@pytest.mark.parametrize("rows", [2, 3, 4, 31, 64, 65, 257])
@pytest.mark.parametrize("widest", [3, 8])
def test_the_pair_writer_leaves_every_byte_past_its_frame_as_it_was(rows, widest):
    # A pair's planes go out 16 bytes at a time, past the pair's own (the next pair writes over
    # them), so the writer must stop in time where its section ends: here the frame's last.
    x, _ = scaled_codes(rows, seed=rows + widest, widest=widest)
    cap = hvd_lossy.max_grouped_bytes([x.shape[0]], [16], [1], 0)
    out = torch.full((cap + 64,), 0xAB, dtype=torch.uint8)
    n, = hvd_lossy.compress_grouped(x, [x.shape[0]], [0.5], [1], 0, out, 0, mode="abs", level=1,
                                    dedup=False)
    seg = hvd_lossy.frame_info(out[:n])["segments"][0]
    assert seg["short_blocks"] and seg["n_outliers"] == 0, seg  # the code section ends the frame
    assert out[n:].tolist() == [0xAB] * (cap + 64 - n)
    assert torch.equal(hvd_lossy.decompress(out[:n]), x)


@pytest.mark.parametrize("widest", [6, 8])  # codes held as bytes, 8 bits: the byte writer's widest
def test_a_segment_too_large_for_one_thread_codes_and_decodes_alike_on_many(widest):
    x, z = scaled_codes(20000, seed=9, widest=widest)  # 320,000 codes: 10,000 pairs, > 4096
    old = hvd_lossy._codec._threads
    try:
        frames = []
        for threads in (1, 2, 4):
            hvd_lossy.set_num_threads(threads)
            frames.append(level1_frame(x, 0.5, dedup=False))
            assert torch.equal(hvd_lossy.decompress(frames[0]), x)
    finally:
        hvd_lossy.set_num_threads(old)
    assert all(torch.equal(f, frames[0]) for f in frames)
    assert code_section(frames[0]) == level1_section(z.tolist())[1]


# ---- corrupt short-block sections -------------------------------------------------------------

def test_a_nonzero_padding_nibble_raises():
    z = [3] * 16 + [1] * 16 + [7] * 16  # three blocks: the second byte's high nibble is padding
    good = short_packed(z)
    assert torch.equal(hvd_lossy.decompress(sealed_frame(good, rows=6, dim=8)).flatten(),
                       torch.tensor([-2.0] * 16 + [-1.0] * 16 + [-4.0] * 16))
    bad = bytearray(good)
    bad[2] |= 0x30  # a padding width of 3, and the planes that width would take
    with pytest.raises(hvd_lossy.FrameError, match="nonzero padding nibble 3"):
        hvd_lossy.decompress(sealed_frame(bytes(bad) + bytes(6), rows=6, dim=8))


def test_a_section_of_other_than_its_blocks_bytes_raises():
    good = short_packed(list(range(32)))
    for bad in (good[:-1], good + b"\x00", good[:-2], good[:2]):
        with pytest.raises(hvd_lossy.FrameError, match="short blocks of 32 codes|too small"):
            hvd_lossy.decompress(sealed_frame(bad))


def test_every_truncation_of_a_short_section_raises():
    x, _ = scaled_codes(8, seed=1)
    frame = level1_frame(x, 0.5, dedup=False)
    code = code_section(frame)
    assert code[0] == 0xFD
    for n in range(len(code)):
        with pytest.raises(hvd_lossy.FrameError):
            hvd_lossy.decompress(sealed_frame(code[:n], rows=8, dim=16))
    assert torch.equal(hvd_lossy.decompress(sealed_frame(code, rows=8, dim=16)), x)


def test_every_byte_flip_of_a_short_frame_raises_and_resealed_ones_raise_or_decode():
    x, _ = scaled_codes(8, seed=2)
    frame = level1_frame(x, 0.5, dedup=False)
    assert code_section(frame)[0] == 0xFD
    assert_flips_raise_and_resealed_ones_raise_or_decode(frame, x)


def test_a_lossless_segment_with_a_short_mark_raises():
    with pytest.raises(hvd_lossy.FrameError):
        hvd_lossy.decompress(sealed_frame(short_packed([0] * 32), flags=0x02))


# ---- golden frames ----------------------------------------------------------------------------

def _golden(name):
    from pathlib import Path
    path = Path(__file__).resolve().parent / "golden" / f"{name}.bin"
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)


def test_short_goldens_report_short_blocks_in_frame_info():
    for name in ("f32_short_level1_2seg", "f32_short_dither_2seg"):
        segs = hvd_lossy.frame_info(_golden(name))["segments"]
        assert all(s["short_blocks"] and s["radix"] is None for s in segs), name


@pytest.mark.parametrize("name", ["f32_1d_2seg", "bf16_specials_lossless_mix"])
def test_goldens_from_before_short_blocks_decode_exactly_as_their_successors(name):
    old, new = _golden(name + "_before_short"), _golden(name)
    old_segs = hvd_lossy.frame_info(old)["segments"]
    new_segs = hvd_lossy.frame_info(new)["segments"]
    assert not any(s["short_blocks"] for s in old_segs) and any(s["short_blocks"] for s in new_segs)
    assert sum(s["code_bytes"] for s in new_segs) < sum(s["code_bytes"] for s in old_segs)
    assert torch.equal(hvd_lossy.decompress(old).view(torch.int16 if "bf16" in name else torch.int32),
                       hvd_lossy.decompress(new).view(torch.int16 if "bf16" in name else torch.int32))


# ---- CUDA: the device paths, chosen on the host ---------------------------------------------

def test_device_frames_with_short_blocks_decode_on_the_device_and_level1_codes_there(monkeypatch):
    from hvd_lossy import _codec, _decode
    monkeypatch.delenv(_codec.HOST_DITHER_VARIABLE, raising=False)

    def way(frame):  # the decoder a device frame of these bytes goes to
        (head,) = _decode.frame_heads(frame, [(0, frame.numel())])
        return _decode.route(head)

    x, _ = scaled_codes(8, seed=6)
    frame = level1_frame(x, 0.5, dedup=False)
    assert hvd_lossy.frame_info(frame)["segments"][0]["short_blocks"]
    assert way(frame) == "batched"  # the batched CUDA decoder reads short-block sections
    dithered = hvd_lossy.compress(x, 0.5, mode="abs", dither=5)
    assert hvd_lossy.frame_info(dithered)["segments"][0]["dither_seed"] == 5
    assert way(dithered) == "batched"  # ... and dithered ones
    # level 1, dithered or not: the CUDA encoder; level 2: the CPU encoder through a host copy
    assert _codec._on_device_encoder(-1, 1) and _codec._on_device_encoder(5, 1)
    assert not _codec._on_device_encoder(-1, 2) and not _codec._on_device_encoder(5, 2)
    # HVD_LOSSY_HOST_DITHER=1: dithered tensors and frames take the host codec, as before
    monkeypatch.setenv(_codec.HOST_DITHER_VARIABLE, "1")
    assert not _codec._on_device_encoder(5, 1) and _codec._on_device_encoder(-1, 1)
    assert way(dithered) == "host" and way(frame) == "batched"
