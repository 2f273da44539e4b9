"""The byte format is pinned: golden frames of format version 1 must be produced and decoded
bit for bit by every build (CPU and CUDA encode the same bytes)."""
import pathlib
import struct
import sys

import pytest
import torch

import hvd_lossy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "golden"))
from cases import CASES, HERE  # noqa: E402


def golden(name):
    return torch.frombuffer(bytearray((HERE / f"{name}.bin").read_bytes()), dtype=torch.uint8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoder_reproduces_golden_frame(name):
    make, kwargs = CASES[name]
    frame = hvd_lossy.compress(make(), **kwargs)
    assert torch.equal(frame, golden(name)), f"{name}: frame bytes changed; the format is pinned"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_frame_decodes_within_bound(name):
    make, kwargs = CASES[name]
    x = make()
    frame = golden(name)
    info = hvd_lossy.frame_info(frame)
    y = hvd_lossy.decompress(frame)
    assert y.dtype == x.dtype and y.shape == x.shape
    finite = torch.isfinite(x)
    assert (x[finite].double() - y[finite].double()).abs().max().item() <= info["eb_abs"]
    assert torch.equal(torch.isnan(x), torch.isnan(y))


def test_header_layout_is_little_endian_and_versioned():
    frame = golden("f32_rel003_level1").numpy().tobytes()
    magic, version, dtype, level, flags, ndim = struct.unpack_from("<IBBBBB", frame, 0)
    assert magic == 0x4C445648 and frame[:4] == b"HVDL"
    assert version == 1 and dtype == 0 and level == 1 and ndim == 2
    assert flags & 0x01  # relative mode
    eb_param, eb_abs = struct.unpack_from("<dd", frame, 16)
    n_rows, row_len, n_unique = struct.unpack_from("<QQQ", frame, 32)
    total = struct.unpack_from("<Q", frame, 88)[0]
    distinct = len(torch.unique(CASES["f32_rel003_level1"][0](), dim=0))
    assert eb_param == 0.03 and (n_rows, row_len) == (96, 32) and n_unique == distinct
    assert total == len(frame)
    assert struct.unpack_from("<qq", frame, 96) == (96, 32)


def test_dedup_visible_in_golden_frame():
    info = hvd_lossy.frame_info(golden("f32_rel003_level1"))
    distinct = len(torch.unique(CASES["f32_rel003_level1"][0](), dim=0))
    assert 1 < distinct < 96 and info["n_unique"] == distinct and info["n_rows"] == 96


def test_dithered_frame_carries_flag_and_24_bit_seed_in_the_reserved_bytes():
    frame = golden("f32_rel002_dither_level2").numpy().tobytes()
    flags = frame[7]
    assert flags & 0x08 and flags & 0x04  # dither, identity map (no dedup)
    assert frame[9:12] == (0xC0FFEE).to_bytes(3, "little")
    assert hvd_lossy.frame_info(golden("f32_rel002_dither_level2"))["dither_seed"] == 0xC0FFEE


def _with_byte(frame, offset, value):
    raw = bytearray(frame.numpy().tobytes())
    raw[offset] = value
    return torch.frombuffer(raw, dtype=torch.uint8)


@pytest.mark.parametrize("offset, value, match", [
    (9, 1, "reserved"),           # seed bytes without the dither flag
    (7, 0x01 | 0x08, "dithered"),  # dither flag on a frame with a row map
])
def test_dither_fields_are_validated(offset, value, match):
    frame = golden("f32_rel003_level1")  # deduplicated: has a row map
    with pytest.raises(hvd_lossy.FrameError, match=match):
        hvd_lossy.frame_info(_with_byte(frame, offset, value))


@pytest.mark.parametrize("dither", [None, 4321], ids=["plain", "dithered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_level_two_decodes_to_the_same_bits_as_level_one(dtype, dither):
    # The entropy stage only re-stores level 1's codes, so the two levels cost the same accuracy:
    # what a level-2 training run measured holds for level 1, the faster one.
    g = torch.Generator().manual_seed(5)
    table = torch.randn(300, 24, generator=g)
    x = table[torch.randint(0, 300, (2000,), generator=g)].to(dtype)
    x[7, 3] = float("nan")
    one = hvd_lossy.compress(x, 0.02, level=1, dither=dither)
    two = hvd_lossy.compress(x, 0.02, level=2, dither=dither)
    assert hvd_lossy.frame_info(two)["level"] == 2 and two.numel() < one.numel()
    bits = {torch.float32: torch.int32}.get(dtype, torch.int16)
    assert torch.equal(hvd_lossy.decompress(one).view(bits), hvd_lossy.decompress(two).view(bits))
