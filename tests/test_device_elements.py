"""The per-element rule the CUDA kernels run (native/common/elements.h: the code of element i,
dithered or not, and the value a code decodes to), run on the host one call an element as the
kernels' threads run it (_hl_test.element_codes_hd / element_values_hd), must give the CPU
encoder's segment bytes and the CPU decoder's values, bit for bit: random fp32, fp16 and bf16
rows, dither on and off, abs and rel bounds, empty and one-row segments, NaN, +-Inf and values
past the code range. Then the CUDA encoder's frame assembly (device_frames.h) must rebuild the
CPU encoder's dithered frames (the seed in the header, the dither flag in each descriptor).
No GPU is needed; tests/test_cuda_encoder.py compares real device frames where one is present."""
import numpy as np
import pytest
import torch

import hvd_lossy
import _hl_test  # the test-only native hooks (tests/_hooks.py)

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
SEED = 4242
# Pieces of one call: an empty segment and one-row segments beside longer ones.
ROWS = [0, 1, 37, 1, 64]


def random_rows(n_rows, d, seed, dtype, specials):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 1, n_rows, dtype=torch.float64)[:, None] if n_rows else 1.0
    x = (torch.randn(n_rows, d, generator=g, dtype=torch.float64) * scale).float()
    if specials and x.numel():
        flat = x.view(-1)
        for at, v in ((0, float("nan")), (5, float("inf")), (-1, -float("inf")),
                      (len(flat) // 2, 3e9 if dtype != torch.float16 else 6e4)):
            flat[at % len(flat)] = v
    return x.to(dtype)


def raw_bytes(x):
    return x.contiguous().view(INT_VIEW[x.dtype]).numpy().tobytes()


def payloads(frame):
    """(segment infos, payload bytes of each segment) of the CPU encoder's frame."""
    info = hvd_lossy.frame_info(frame)
    segs = info["segments"]
    at = info["header_bytes"] + sum(s["segment_bytes"] - s["map_bytes"] - s["code_bytes"]
                                    - s["outlier_bytes"] for s in segs)
    data, out = frame.numpy().tobytes(), []
    for s in segs:
        n = s["map_bytes"] + s["code_bytes"] + s["outlier_bytes"]
        out.append(data[at:at + n])
        at += n
    return segs, out


def device_segment(piece, seg, dither):
    """What the CUDA encoder's threads make of one piece: (codes, outliers, dithered)."""
    return _hl_test.element_codes_hd(raw_bytes(piece), DTYPE_CODE[piece.dtype],
                                     0.0 if seg["lossless"] else seg["eb_abs"], seg["lossless"],
                                     dither is not None, 0 if dither is None else dither)


CASES = [(dtype, dither, mode, specials)
         for dtype in (torch.float32, torch.float16, torch.bfloat16)
         for dither in (None, SEED)
         for mode in ("abs", "rel")
         for specials in (False, True)]


@pytest.mark.parametrize("dtype,dither,mode,specials", CASES,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_device_elements_write_the_cpu_encoders_segments_and_read_its_values(dtype, dither, mode,
                                                                           specials):
    x = random_rows(sum(ROWS), 24, 7, dtype, specials)
    bound = 0.01 if mode == "abs" else 0.003
    # the CPU's frame: undithered without dedup, so every segment is map-less as a dithered one
    frame, _ = hvd_lossy.compress_chunks(x, ROWS, bound, mode=mode, level=1,
                                         dedup=dither is not None, dither=dither)
    segs, cpu_payloads = payloads(frame)
    decoded = hvd_lossy.decompress(frame)
    assert len(segs) == len(ROWS)
    start = 0
    for k, (rows, seg, cpu_payload) in enumerate(zip(ROWS, segs, cpu_payloads)):
        piece = x[start:start + rows]
        seed = None if dither is None else dither + k  # pieces.h: piece k's seed
        codes, outliers, dithered = device_segment(piece, seg, seed)
        where = f"segment {k} ({rows} rows)"
        assert dithered == (seg["dither_seed"] is not None), where
        if dithered:
            assert seg["dither_seed"] == seed, where
        assert seg["n_unique"] == seg["n_rows"], where  # no map: dither turns dedup off
        assert len(outliers) == seg["n_outliers"], where
        got, _, code_bytes = _hl_test.segment_payload_hd([], codes, outliers, DTYPE_CODE[dtype],
                                                         not seg["lossless"])
        assert (code_bytes, got) == (seg["code_bytes"], cpu_payload), where
        stored = [0 if c == _hl_test.OUTLIER_MARK else c for c in codes]  # the frame stores 0
        values = _hl_test.element_values_hd(stored, outliers, DTYPE_CODE[dtype],
                                            0.0 if seg["lossless"] else seg["eb_abs"],
                                            seg["lossless"], seed is not None,
                                            0 if seed is None else seed)
        assert values == raw_bytes(decoded[start:start + rows]), where
        start += rows


def test_dither_changes_the_codes_and_keeps_every_element_within_the_bound():
    x = random_rows(64, 32, 3, torch.float32, False)
    eb = 0.05
    plain, _, off = _hl_test.element_codes_hd(raw_bytes(x), 0, eb, False, False, 0)
    codes, outliers, on = _hl_test.element_codes_hd(raw_bytes(x), 0, eb, False, True, 11)
    assert (off, on) == (False, True) and outliers == []
    assert codes != plain  # the offsets reach the codes
    values = _hl_test.element_values_hd(codes, [], 0, eb, False, True, 11)
    back = np.frombuffer(values, dtype=np.float32).reshape(x.shape)
    err = np.abs(back.astype(np.float64) - x.double().numpy())
    assert err.max() <= eb
    # unbiased: the error does not follow the sign of the value, as plain rounding's does
    again = _hl_test.element_values_hd(codes, [], 0, eb, False, True, 12)  # the wrong seed
    assert again != values


def test_a_lossless_segment_is_never_dithered():
    x = random_rows(4, 8, 5, torch.bfloat16, True)
    codes, outliers, dithered = _hl_test.element_codes_hd(raw_bytes(x), 2, 0.0, True, True, 9)
    assert dithered is False and outliers == []
    assert codes == [int(v) & 0xFFFF for v in x.view(torch.int16).reshape(-1).tolist()]


LAYOUTS = {
    "two groups": ([40, 0, 1, 63], [0.02, 0.01, 0.03, 0.0], [2, 2], 0, None),
    "prefix and extension, an empty group": ([25, 30, 1], [0.01, 1e-3, 0.05], [0, 2, 1], 5,
                                            b"\x02ext"),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_device_frame_assembly_writes_the_cpu_encoders_dithered_frames(name, dtype):
    rows, ebs, groups, prefix, ext = LAYOUTS[name]
    x = random_rows(sum(rows), 16, 13, dtype, True)
    cap = hvd_lossy.max_grouped_bytes(rows, [16], groups, prefix)
    out = torch.full((cap,), 0xAB, dtype=torch.uint8)
    got = hvd_lossy.compress_grouped(x, rows, ebs, groups, prefix, out, 0, mode="rel", level=1,
                                     dither=SEED, extension=ext)
    sizes, group_bytes = got if ext is not None else (got, None)
    end = len(groups) * prefix + (sum(group_bytes) if ext is not None else sum(sizes))
    cpu = out.numpy().tobytes()[:end]
    again, hd_sizes, hd_groups = _hl_test.device_frames_hd(cpu, rows, [16], groups, prefix,
                                                           ext or b"", 1, DTYPE_CODE[dtype])
    assert hd_sizes == sizes
    if ext is not None:
        assert hd_groups == group_bytes
    assert again == cpu
