"""Reuse across iterations at the codec level (hvd_lossy.reuse, issue 24 part 3): a sender's
ReuseEncoder against the mirror of what its peer holds, the peer's ReuseDecoder against its cache.

  - Every decoded element is within the bound of the CURRENT value, call after call, while rows
    drift (small steps, large steps, jumps) under repeating Zipf ids, for every dtype; NaN and
    Inf rows, held rows that turned NaN, and ids that lie included.
  - Mirror and cache are bit-identical after every call, and so are their digests.
  - Held rows within the bound cost ~nothing (all-zero codes folded into one row); drifted rows
    cost less than fresh ones. The pass settles a held row whose residual surely codes to zeros
    without quantizing it, and hands it to the codec as a zero row under one key: same frame.
  - A predicted row that would reconstruct outside the bound sends its frame fresh.
  - Collisions on a slot resolve deterministically (the last row of the call wins).
  - The sender's pass writes the same frames, rows and caches on every kernel path (its fused
    float32 sweep of drifted rows is the general one's bits).
  - The memory of a rank's caches stays under its cap, also over 10^4 calls.
"""
import pytest
import torch

import hvd_lossy
from hvd_lossy import _codec, grad_ids, reuse
from tests._launch import assert_every_rank_passed, run_mpi, same_on_every_kernel_path

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def zipf_ids(g, n, table_rows, a=1.2):
    """Ids drawn with probability ~ 1 / rank^a: a few hot ids in every call."""
    p = 1.0 / torch.arange(1, table_rows + 1, dtype=torch.float64) ** a
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    return torch.multinomial(p, n, replacement=True, generator=g)


def call_rows(table, g, seg_rows, table_rows):
    """One call's chunk: segment k looks up table k by Zipf ids."""
    ids = torch.cat([zipf_ids(g, n, table_rows) for n in seg_rows])
    seg = torch.repeat_interleave(torch.arange(len(seg_rows)), torch.tensor(seg_rows))
    return table[seg, ids], ids


def assert_within(x, x_hat, seg_rows, bound, mode="rel"):
    for k, (xs, hs) in enumerate(zip(x.split(seg_rows), x_hat.split(seg_rows))):
        eb = reuse.absolute_bound(xs, bound, mode)
        finite = torch.isfinite(xs)
        err = (xs.double() - hs.double()).abs()[finite]
        assert err.numel() == 0 or float(err.max()) <= eb, f"segment {k}: {float(err.max())} > {eb}"
        assert torch.equal(torch.isnan(xs), torch.isnan(hs)), f"segment {k}: NaN not kept"
        inf = torch.isinf(xs)
        assert torch.equal(xs[inf], hs[inf]), f"segment {k}: Inf not kept"


def assert_same_state(enc, dec):
    assert enc.digest == dec.digest
    for a, b in zip(enc.peer.caches, dec.peer.caches):
        assert torch.equal(a.tags, b.tags) and torch.equal(a.valid, b.valid)
        assert torch.equal(a.rows.view(torch.uint8), b.rows.view(torch.uint8))  # bits, NaN too
        assert torch.equal(a.records, b.records)  # every byte, the rows' magnitudes too
    assert sum(assert_magnitudes(c) for c in enc.peer.caches) > 0, "no held record to check"


def assert_magnitudes(cache):
    """A held record carries its row's largest magnitude (the bits of its largest |element|,
    uint32 at byte 12: NaN and Inf above every finite one), which a lookup reads instead of
    the row."""
    held = cache.valid
    wide = cache.rows.element_size() == 4
    bits = cache.rows[held].view(torch.int32 if wide else torch.int16).to(torch.int64)
    want = (bits & (0x7FFFFFFF if wide else 0x7FFF)).amax(1, keepdim=True).view(-1)
    got = cache.records[held][:, 12:16].contiguous().view(torch.int32).view(-1).to(torch.int64)
    assert torch.equal(got, want)
    return int(held.sum())


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_drift_up_to_and_past_half_a_step_decode_alike_on_both_ends(dtype):
    """The sender skips quantizing a held row whose residual is within 0.49 step (its codes are
    zeros): drifts spread evenly from 0 to past the bound, so rows fall on both sides of that
    line and of the codes' first rounding edge, and every one must decode within the bound to
    the very row the sender's mirror keeps."""
    g = torch.Generator().manual_seed(11)
    rows, dim, bound = 2000, 16, 0.03
    ids = torch.arange(rows)
    held = (torch.rand(rows, dim, generator=g) * 2 - 1) * 0.1
    enc, dec = reuse.ReuseEncoder(bound, mode="abs"), reuse.ReuseDecoder()
    frame, predicted = enc.encode(held.to(dtype), ids, [rows])
    held_now = dec.decode(frame, ids, predicted)  # what both ends now hold for each id
    # one element a row moves by a fraction of the bound from 0 to 1.2, the others stay
    drift = torch.linspace(0, 1.2 * bound, rows).unsqueeze(1) * torch.where(
        torch.rand(rows, 1, generator=g) < 0.5, -1.0, 1.0)
    x = held_now.float().clone()
    x[:, 3:4] += drift
    x = x.to(dtype)
    frame, predicted = enc.encode(x, ids, [rows])
    assert predicted and enc.last["references"] > 0 and enc.last["residuals"] > 0
    assert_within(x, dec.decode(frame, ids, predicted), [rows], bound, mode="abs")
    assert_same_state(enc, dec)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("step", [1e-4, 3e-3, 0.05])
def test_every_element_is_within_the_bound_of_the_current_value_over_many_calls(dtype, step):
    g = torch.Generator().manual_seed(0)
    seg_rows, table_rows, dim, bound = [300, 0, 200], 500, 16, 0.03
    table = torch.randn(len(seg_rows), table_rows, dim, generator=g)
    enc, dec = reuse.ReuseEncoder(bound, capacity=256), reuse.ReuseDecoder(capacity=256)
    kinds = {"references": 0, "residuals": 0, "fresh": 0}
    for call in range(25):
        x, ids = call_rows(table, g, seg_rows, table_rows)
        x = x.to(dtype)
        frame, predicted = enc.encode(x, ids, seg_rows)
        x_hat = dec.decode(frame, ids, predicted)
        assert x_hat.dtype == dtype
        assert_within(x, x_hat, seg_rows, bound)
        assert_same_state(enc, dec)
        for k in kinds:
            kinds[k] += enc.last[k]
        table += step * torch.randn(table.shape, generator=g)  # every row drifts
        table[:, call % 7] += 3.0  # and one jumps far
    assert kinds["references"] + kinds["residuals"] > kinds["fresh"]  # hot ids come back
    if step == 1e-4:
        assert kinds["references"] > kinds["residuals"]
    if step == 3e-3:
        assert kinds["residuals"] > 0


def test_nan_inf_rows_held_rows_turning_nan_and_lying_ids_stay_within_the_bound():
    g = torch.Generator().manual_seed(1)
    seg_rows, dim, bound = [64, 64], 8, 0.05
    enc, dec = reuse.ReuseEncoder(bound, capacity=64), reuse.ReuseDecoder(capacity=64)
    ids = torch.randint(0, 10, (128,), generator=g)
    for call in range(12):
        x = torch.randn(128, dim, generator=g) * 0.1 + torch.arange(128.).unsqueeze(1) / 128
        if call % 3 == 0:
            x[ids == 3, 0] = float("nan")  # held next call as NaN: must predict nothing
        if call % 4 == 1:
            x[5, 2], x[70, 1] = float("inf"), float("-inf")
        lying = ids if call % 2 else torch.zeros_like(ids)  # one id for rows that differ
        frame, predicted = enc.encode(x, lying, seg_rows)
        x_hat = dec.decode(frame, lying, predicted)
        assert_within(x, x_hat, seg_rows, bound)
        assert_same_state(enc, dec)


def test_a_held_row_with_inf_or_nan_predicts_nothing_and_the_others_still_predict():
    g = torch.Generator().manual_seed(4)
    rows, dim = 64, 8
    ids = torch.arange(rows)
    x = torch.randn(rows, dim, generator=g)
    held = x.clone()
    held[5, 2], held[6, 1], held[7, 0] = float("inf"), float("-inf"), float("nan")
    enc, dec = reuse.ReuseEncoder(0.03, capacity=1 << 16), reuse.ReuseDecoder(capacity=1 << 16)
    first, predicted = enc.encode(held, ids, [rows])
    dec.decode(first, ids, predicted)
    again, predicted = enc.encode(x, ids, [rows])  # the three rows finite again
    # Predicting from Inf or NaN would decode NaN there and send the whole frame fresh.
    assert predicted and enc.last["fresh"] >= 3 and enc.last["references"] >= rows - 3 - 2
    assert_within(x, dec.decode(again, ids, predicted), [rows], 0.03)
    assert_same_state(enc, dec)


def test_held_rows_within_the_bound_cost_nearly_nothing_and_drifted_rows_less_than_fresh():
    g = torch.Generator().manual_seed(2)
    rows, dim = 1024, 16
    x = torch.randn(rows, dim, generator=g)
    ids = torch.arange(rows)
    enc, dec = reuse.ReuseEncoder(0.03, capacity=1 << 16), reuse.ReuseDecoder(capacity=1 << 16)
    first, _ = enc.encode(x, ids, [rows])
    dec.decode(first, ids, True)
    same, predicted = enc.encode(x, ids, [rows])  # every row held, unchanged
    # every row held but the few that lost their slot to another id (direct-mapped)
    assert predicted and enc.last["residuals"] == 0 and enc.last["references"] > 0.98 * rows
    assert same.numel() < 0.06 * first.numel(), (same.numel(), first.numel())
    assert_within(x, dec.decode(same, ids, predicted), [rows], 0.03)
    eb = reuse.absolute_bound(x, 0.03, "rel")
    drifted = x + eb * torch.randn(x.shape, generator=g)  # about a bound away
    fresh_bytes = hvd_lossy.compress_chunks(drifted, [rows], 0.03)[0].numel()
    residual, predicted = enc.encode(drifted, ids, [rows])
    assert enc.last["residuals"] > 0.9 * rows
    assert residual.numel() < 0.8 * fresh_bytes, (residual.numel(), fresh_bytes)
    assert_within(drifted, dec.decode(residual, ids, predicted), [rows], 0.03)
    assert_same_state(enc, dec)


def test_references_reach_the_codec_as_flagged_zero_rows_and_code_the_same_frame():
    """The pass settles a held float32 row whose residual surely codes to zeros (within the
    code bound by a 2^-20 margin) without quantizing it: the codec gets it as a row of zeros
    flagged in `_zero_rows`, so it takes all of them for one row unread. The frame must be the
    very bytes the true residuals with the caller's ids code to, and rows that drifted further
    keep their own residual and are not flagged."""
    g = torch.Generator().manual_seed(5)
    rows, dim, bound = 600, 32, 0.03
    ids = torch.arange(rows) * 7 + 3
    enc, dec = reuse.ReuseEncoder(bound), reuse.ReuseDecoder()
    frame, predicted = enc.encode(torch.randn(rows, dim, generator=g) * 0.1, ids, [rows])
    held = dec.decode(frame, ids, predicted)  # P of every row, on both ends
    eb = reuse.absolute_bound(held, bound, "rel")
    x = held.clone()
    x[:400] += 0.4 * eb * (torch.rand(400, dim, generator=g) * 2 - 1)  # references
    x[400:] += 3 * eb * (torch.rand(200, dim, generator=g) * 2 - 1)    # residuals
    pieces = reuse.Pieces()
    pieces.add_group(0, 0, [rows], [bound], enc.peer.ensure(1, dim, x.dtype))
    seen = {}

    def code(residual, code_ebs, _predicted, keys, zero):
        seen.update(residual=residual.clone(), keys=keys.clone(), zero=zero.clone(),
                    code_eb=code_ebs[0])
        frame, _ = hvd_lossy.compress_chunks(residual, [rows], code_ebs, mode="abs", ids=keys,
                                             _zero_rows=zero)
        return frame, _codec.segments_lossless(frame, [(0, frame.numel())])

    frame, encoded = reuse.encode_with_prediction(x, ids, pieces, 1, True, code)
    limit = seen["code_eb"] * (1 - 2 ** -20)
    # rows whose id lost its slot to another's (direct-mapped caches) are coded fresh
    predicted_rows = encoded.hit != 0
    true_residual = torch.where(predicted_rows.unsqueeze(1), x - held, x)
    settled = predicted_rows & (true_residual.abs() <= limit).all(1)
    assert settled[:400].sum() > 380 and not settled[400:].any()
    assert torch.equal(seen["residual"][settled], torch.zeros(int(settled.sum()), dim))
    assert torch.equal(seen["residual"][~settled], true_residual[~settled])
    assert torch.equal(seen["zero"], settled.to(torch.uint8))
    assert torch.equal(seen["keys"], ids)
    # the peer decodes a settled row to its held row, and every other row to the pass's X^
    # (which x_hat holds only for those: store leaves the settled rows' records alone)
    decoded = dec.decode(frame, ids, encoded.predicted[0])
    assert torch.equal(decoded[settled], held[settled])
    assert torch.equal(encoded.x_hat[~settled], decoded[~settled])
    assert (encoded.hit[settled] == 3).all()
    assert sum(encoded.references) == settled.sum() and sum(encoded.residuals) > 180
    truth, _ = hvd_lossy.compress_chunks(true_residual, [rows], [seen["code_eb"]], mode="abs",
                                         ids=ids)
    assert torch.equal(frame, truth)


def test_the_pass_writes_the_same_frames_rows_and_caches_on_every_kernel_path(tmp_path):
    """float32 rows drifting by a fraction of a bound up to many bounds (codes of a byte and
    wider than the fused sweep reconstructs in single precision), many rows shifted alike, NaN
    and Inf, lengths that are and are not a multiple of 8: the frames, the decoded
    rows, the pass's X^ and every cache byte are the same with AVX-512, with AVX2 at most and
    with the portable loops, which have no fused sweep."""
    script = tmp_path / "paths.py"
    script.write_text(
        "import zlib, torch, hvd_lossy\n"
        "from hvd_lossy import reuse\n"
        "out = [hvd_lossy._C.simd_level()]\n"
        "for d, scale in ((128, 1.0), (16, 1e-3), (12, 1.0)):\n"
        "    g = torch.Generator().manual_seed(d)\n"
        "    table = torch.randn(3, 300, d, generator=g) * scale\n"
        "    enc, dec, digest = reuse.ReuseEncoder(0.02), reuse.ReuseDecoder(), 0\n"
        "    for call in range(14):\n"
        "        ids = torch.randint(0, 300, (3 * 200,), generator=g) ** 2 // 300\n"
        "        seg = torch.arange(3).repeat_interleave(200)\n"
        "        x = table[seg, ids].contiguous()\n"
        "        if call == 9:\n"
        "            x[5, 3], x[6, 0] = float('nan'), float('inf')\n"
        "        frame, predicted = enc.encode(x, ids, [200] * 3)\n"
        "        got = dec.decode(frame, ids, predicted)\n"
        "        held = [c.records for c in enc.peer.caches]\n"
        "        for part in (frame, got, enc.buffers.pair(x)[1], *held):\n"
        "            raw = part.contiguous().view(torch.uint8).numpy().tobytes()\n"
        "            digest = zlib.crc32(raw, digest)\n"
        "        out.append((call, enc.last['references'], enc.last['residuals'], digest))\n"
        "        step = [0.1, 0.6, 3.0, 40.0][call % 4] * 0.02 * float(x.abs().max())\n"
        "        table += step * torch.randn(table.shape, generator=g)\n"
        "        table[:, :40] += 0.5 * step  # the same shift on many rows\n"
        "print(out)\n")
    runs = same_on_every_kernel_path(script)
    assert sum(r[2] for r in runs[0][1:]) > 0, "no row was coded against its held row"


def test_a_frame_whose_predicted_rows_would_miss_the_bound_goes_fresh():
    """Rows near 1e7 (float32 steps of 1) at an absolute bound of 0.75, no room to tighten:
    a drift of 5 codes as R^ = 4.5 (3 steps of 1.5), and P + 4.5 rounds to even, 1 away from X.
    The sender's check finds it and codes the frame fresh; a drift of 3 (R^ = 3 exactly) stays
    predicted."""
    x = torch.full((4, 2), 1e7)
    ids = torch.arange(4)
    enc, dec = reuse.ReuseEncoder(0.75, mode="abs"), reuse.ReuseDecoder()
    for drift, want in ((0.0, None), (3.0, True), (5.0, False)):
        now = x.clone()
        now[0] += drift
        frame, predicted = enc.encode(now, ids, [4])
        if want is not None:
            assert predicted == want, (drift, enc.last)
        got = dec.decode(frame, ids, predicted)
        assert float((got.double() - now.double()).abs().max()) <= 0.75
        assert_same_state(enc, dec)
    assert enc.last["fresh"] == 4


def test_segments_the_codec_stores_losslessly_keep_mirror_and_cache_identical():
    """A segment mostly of Inf costs more coded than raw, so the codec stores it as raw bits
    (lossless): the sender reads that back from the frame and holds X^ = R there (P + R where
    predicted), not its quantized R^. Without that the mirror would differ from the cache."""
    g = torch.Generator().manual_seed(6)
    table = torch.randn(2, 64, 8, generator=g)
    enc, dec = reuse.ReuseEncoder(0.03, capacity=64), reuse.ReuseDecoder(capacity=64)
    lossless = 0
    for call in range(6):
        x, ids = call_rows(table, g, [40, 40], 64)
        if call % 2 == 0:
            x[:40][torch.rand(40, 8, generator=g) < 0.6] = float("inf")
        frame, predicted = enc.encode(x, ids, [40, 40])
        lossless += sum(s["lossless"] for s in hvd_lossy.frame_info(frame)["segments"])
        assert_within(x, dec.decode(frame, ids, predicted), [40, 40], 0.03)
        assert_same_state(enc, dec)
        table += 1e-3 * torch.randn(table.shape, generator=g)
    assert lossless >= 3


def test_rows_sharing_a_slot_resolve_to_the_last_row_of_the_call():
    cache = reuse.DirectMappedCache(4, 2, torch.float32)
    slots = [cache.slot(i) for i in range(64)]
    a, b = [i for i in range(64) if slots[i] == slots[0]][:2]  # two ids on one slot

    def receive(ids, rows, predicted):
        """rows as decoded residuals: X^ of each, then the cache holds them."""
        pieces = reuse.Pieces()
        pieces.add_group(0, 0, [len(ids)], [0.0], [cache])
        rows = rows.clone()
        reuse.apply_received(rows, torch.tensor(ids), pieces, [predicted])
        return rows

    receive([a, b, a], torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), False)
    held = receive([a, b], torch.zeros(2, 2), True)  # P + 0 where held, 0 where not
    assert torch.equal(held, torch.tensor([[3.0, 3.0], [0.0, 0.0]]))  # a held, its last row
    held = receive([a, b], torch.zeros(2, 2), True)
    assert torch.equal(held, torch.tensor([[0.0, 0.0], [0.0, 0.0]]))  # b's zeros took the slot
    receive([b], torch.tensor([[2.0, 2.0]]), False)
    held = receive([a, b], torch.zeros(2, 2), True)
    assert torch.equal(held, torch.tensor([[0.0, 0.0], [2.0, 2.0]]))


def test_the_native_slot_is_the_documented_hash():
    """slot = (id * 2^64/phi wrapped, xor itself >> 29) mod capacity, in int64 as torch does,
    for extreme and random ids and capacities from 1 to past 2^40; no slots is refused."""
    g = torch.Generator().manual_seed(9)
    ids = torch.cat([torch.tensor([0, 1, -1, 7, 1 << 40, -(1 << 62), (1 << 63) - 1, -(1 << 63)]),
                     torch.randint(-(1 << 63), (1 << 63) - 1, (2000,), generator=g)])
    for capacity in (1, 2, 3, 7, 4096, 16383, 1 << 20, 12345677, (1 << 40) + 3, (1 << 62) - 57):
        h = ids * -7046029254386353131
        want = torch.remainder(h ^ (h >> 29), capacity)
        assert [_codec.reuse_slot(int(i), capacity) for i in ids] == want.tolist(), capacity
    cache = reuse.DirectMappedCache(4096, 1, torch.float32)
    assert cache.slot(7) == _codec.reuse_slot(7, 4096)
    with pytest.raises(ValueError, match="at least one slot, got capacity 0"):
        _codec.reuse_slot(1, 0)


def test_collisions_make_the_same_caches_on_every_run():
    def run():
        g = torch.Generator().manual_seed(3)
        enc = reuse.ReuseEncoder(0.03, capacity=8)  # far fewer slots than ids
        for _ in range(5):
            x = torch.randn(200, 4, generator=g)
            enc.encode(x, torch.randint(0, 1000, (200,), generator=g), [200])
        return enc
    a, b = run(), run()
    assert a.digest == b.digest
    assert torch.equal(a.peer.caches[0].rows, b.peer.caches[0].rows)
    assert torch.equal(a.peer.caches[0].tags, b.peer.caches[0].tags)


def test_capacity_keeps_a_ranks_mirrors_and_caches_under_the_cap():
    cap, peers, segments, dim = 1 << 20, 4, 26, 64
    slots = reuse.capacity_for(cap, peers, segments, dim, torch.float32)
    one = reuse.DirectMappedCache(slots, dim, torch.float32).nbytes()
    assert 2 * peers * segments * one <= cap  # mirrors to every peer and caches from every one
    assert 2 * peers * segments * (one + reuse.record_bytes(dim, torch.float32)) > cap  # not much under


def test_memory_stays_under_the_cap_over_ten_thousand_calls():
    cap, segments, dim = 64 << 10, 2, 4
    slots = reuse.capacity_for(cap, 1, segments, dim, torch.float32)
    enc, dec = reuse.ReuseEncoder(0.03, capacity=slots), reuse.ReuseDecoder(capacity=slots)
    g = torch.Generator().manual_seed(4)
    for call in range(10_000):
        ids = torch.randint(0, 1 << 40, (16,), generator=g)  # new ids every call
        frame, predicted = enc.encode(torch.randn(16, dim, generator=g), ids, [8, 8])
        dec.decode(frame, ids, predicted)
        if call % 1000 == 0:
            assert enc.nbytes() + dec.nbytes() <= cap
    assert enc.nbytes() + dec.nbytes() <= cap
    assert_same_state(enc, dec)


def test_without_reuse_the_header_and_the_settings_are_todays():
    from hvd_lossy import chunk_header, protocol
    from hvd_lossy.compression import Compression
    plain, off = Compression.lossy(0.03), Compression.lossy(0.03, reuse=False)
    assert set(plain.agreement()) == {"type", "error_bound", "mode", "level", "dedup", "dither",
                                      "auto", "row_len"}
    assert protocol.settings_digest(plain) == protocol.settings_digest(off)
    assert "reuse" not in plain.get_config()
    fields = protocol.header(torch.zeros(3, 4), None, 0, 0, (0, 0, 0), 5, 0x1234)
    assert chunk_header.extension(fields) == bytes([0, 10, 0x34, 0x12, 0, 0])


def test_a_reuse_block_travels_in_the_header_and_back():
    from hvd_lossy import chunk_header, protocol
    fields = protocol.header(torch.zeros(3, 4), None, 0, 0, (0, 0, 0), 1, 7)
    block = ((0, 0xDEADBEEF, 5), (1, 0, 2), (False, True, True))
    fields[protocol.REUSE] = block
    frame = chunk_header.header_frame(torch.zeros(3, 4), fields)
    parsed = chunk_header.parse_chunks(frame, [frame.numel()])[0]
    assert parsed[protocol.REUSE] == block
    assert chunk_header.extension(parsed) == chunk_header.extension(fields)


def test_reuse_refuses_settings_it_cannot_keep():
    from hvd_lossy.compression import Compression, compressor_from_config
    with pytest.raises(ValueError, match="reuse=True needs undithered lookups"):
        Compression.lossy(0.03, reuse=True, dither=True)
    with pytest.raises(ValueError, match="reuse=True and auto=True"):
        Compression.lossy(0.03, reuse=True, auto=True)
    with pytest.raises(ValueError, match="reuse_memory must be an int >= 1"):
        Compression.lossy(0.03, reuse=True, reuse_memory=0)
    c = Compression.lossy(0.03, reuse=True, reuse_memory=1 << 20)
    assert compressor_from_config(c.get_config()) == c


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 3])
def test_alltoall_with_reuse_under_mpirun_is_within_the_bound_and_faults_raise_everywhere(np):
    # reuse_sets last: it adds a process set (tests/mp/transport_process_sets.py says why)
    output = run_mpi("tests/mp/transport_run.py", np=np, args=["reuse", "reuse_sets"], timeout=240)
    assert_every_rank_passed(output, np)


@pytest.mark.mpi
def test_all_to_all_single_with_reuse_under_torchrun_in_the_row_len_layout():
    output = run_mpi("tests/mp/dist_run.py", np=2, args=["reuse"], launcher="torchrun",
                     timeout=180)
    assert_every_rank_passed(output, 2)


@pytest.mark.mpi
@pytest.mark.parametrize("launcher,extra", [("mpirun", ["--overlap"]),
                                            ("torchrun", ["--backend", "torch"])])
def test_dlrm_example_with_reuse_trains_and_sends_fewer_forward_bytes(tmp_path, launcher, extra):
    import json
    runs = {}
    for label, flags in (("ids", ["--ids"]), ("reuse", ["--reuse"])):
        path = tmp_path / f"{label}.json"
        run_mpi("examples/dlrm/train.py", np=2, launcher=launcher, timeout=240,
                args=["--compression", "lossy", "--steps", "12", "--batch-size", "256",
                      "--eval-points", "0", "--no-progress", "--metrics-out", path, *extra,
                      *flags])
        runs[label] = json.loads(path.read_text())
    assert runs["reuse"]["data_checksum"] == runs["ids"]["data_checksum"]
    assert runs["reuse"]["a2a_bytes_plain"] == runs["ids"]["a2a_bytes_plain"]
    assert runs["reuse"]["a2a_bytes_sent"] < runs["ids"]["a2a_bytes_sent"], runs
    assert abs(runs["reuse"]["loss_curve"][-1] - runs["ids"]["loss_curve"][-1]) < 0.05


def test_call_sites_of_one_process_set_share_its_cap():
    state = reuse.ReuseState(1 << 20)
    dim, size, segments = 8, 2, 3
    for name in ("a", "b", "c"):
        for p in range(size):
            for side in state.side(("set0", name), size, dim, torch.float32):
                side[p].ensure(3, dim, torch.float32)
        assert state.nbytes() <= 1 << 20
    assert len(state._sides) == 1  # the earlier sites were dropped, to come back smaller
    for name in ("a", "b"):
        for side in state.side(("set0", name), size, dim, torch.float32):
            side[0].ensure(3, dim, torch.float32)
    assert state.nbytes() <= 1 << 20


def test_gradients_summed_by_segment_and_id_come_back_on_each_ids_first_row():
    """hvd_lossy.grad_ids: a chunk's rows summed per (segment, id), in order of first
    occurrence a segment; expanded, each sum sits on its id's first row and the id's other rows
    are zero, so summing by id again gives the same sums."""
    keys = torch.tensor([5, 3, 5, 7, 3, 3, 9, 1, 2, 1])
    side = grad_ids.Keyed(keys, [[4], [3], [3]])  # 3 peers, one segment each
    assert side.unique_rows == [[3], [2], [2]] and side.peer_unique() == [3, 2, 2]
    rows = torch.arange(10.0).unsqueeze(1)
    sums, spans = side.sum(rows)
    assert sums.flatten().tolist() == [0.0 + 2, 1, 3, 4 + 5, 6, 7 + 9, 8]  # ids 5,3,7 | 3,9 | 1,2
    assert spans is None and side.sum(rows, spans=True)[1] == [3.0, 2.0, 2.0]
    back = side.expand(sums)
    assert back.flatten().tolist() == [2.0, 1, 0, 3, 9, 0, 6, 16, 8, 0]
    assert torch.equal(side.sum(back)[0], sums)
    # the same id in two segments is two rows; ids far apart are numbered alike
    big = grad_ids.Keyed(torch.tensor([2 ** 62, -2 ** 62, 2 ** 62, 5, -2 ** 62]), [[2, 3]])
    assert big.unique_rows == [[2, 3]] and big.first.tolist() == [0, 1, 2, 3, 4]
    assert big.inverse.tolist() == [0, 1, 2, 3, 4]
    twice = grad_ids.Keyed(torch.tensor([7, -1, 7, -1, 7]), [[0, 5]])
    assert twice.unique_rows == [[0, 2]] and twice.inverse.tolist() == [0, 1, 0, 1, 0]
    assert twice.first.tolist() == [0, 1]
    with pytest.raises(ValueError, match="expected 0 to 2"):
        grad_ids.Keyed(torch.tensor([1, 2]), [[-1, 3]])
    with pytest.raises(RuntimeError, match="expected one a distinct"):
        side.expand(sums[:-1])


def test_keys_are_numbered_by_first_occurrence_a_segment_as_a_dict_would():
    """grad_ids' numbering (one native pass) against the obvious Python: across segments the
    same key is another number, and a segment's numbers follow its keys' first rows."""
    g = torch.Generator().manual_seed(3)
    seg_rows = [0, 1, 700, 3, 0, 5000, 64]
    keys = torch.randint(-40, 40, (sum(seg_rows),), generator=g) * (2 ** 40 + 1)
    keys[-64:] = torch.arange(64)  # a segment of distinct keys
    inverse, first, counts = grad_ids.number_keys(keys, seg_rows)
    want_inverse, want_first, want_counts, start = [], [], [], 0
    for n in seg_rows:
        seen = {}
        for r in range(start, start + n):
            k = int(keys[r])
            if k not in seen:
                seen[k] = len(want_first)
                want_first.append(r)
            want_inverse.append(seen[k])
        want_counts.append(len(seen))
        start += n
    assert inverse.tolist() == want_inverse and first.tolist() == want_first
    assert list(counts) == want_counts and want_counts[-1] == 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_summed_by_key_are_index_add_s_sums_bit_for_bit_and_expand_back(dtype):
    """The native sum by (segment, id) adds as torch's index_add_ into zeros does, bit for bit
    (row order, in the dtype, -0 made +0), with each segment's finite range as the codec's range
    pass finds it; the expansion puts each sum on its first row and +0 on the others."""
    g = torch.Generator().manual_seed(5)
    seg_rows = [0, 300, 1, 2000, 0, 77]
    keys = torch.randint(0, 50, (sum(seg_rows),), generator=g)
    rows = (torch.randn(sum(seg_rows), 24, generator=g) * 1e3).to(dtype)
    rows[5, :4] = torch.tensor([-0.0, float("inf"), float("nan"), -float("inf")])
    rows[301, 3] = -0.0  # segment 2, one row: its sum is 0 + (-0) = +0
    side = grad_ids.Keyed(keys, [seg_rows])
    sums, spans = side.sum(rows, spans=True)
    want = torch.zeros(side.first.numel(), 24, dtype=dtype).index_add_(0, side.inverse, rows)
    finite = want.isfinite()
    assert torch.equal(sums[finite].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       want[finite].view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert torch.equal(sums.isnan(), want.isnan()) and torch.equal(sums[~finite & ~want.isnan()],
                                                                   want[~finite & ~want.isnan()])
    stats = _codec.piece_stats(rows, seg_rows, ranges_only=True)
    span = stats[:, _codec.STAT_MAX] - stats[:, _codec.STAT_MIN]
    assert spans == [0.0 if s != s else float(s) for s in span]
    back = side.expand(sums)
    want_back = torch.zeros_like(rows)
    want_back[side.first] = sums
    assert torch.equal(back.isnan(), want_back.isnan())
    assert torch.equal(back.nan_to_num(0.5).view(torch.uint8), want_back.nan_to_num(0.5).view(torch.uint8))


def test_rows_summed_by_key_refuse_other_numberings_and_counts_that_disagree():
    """sum_rows and expand_rows take number_keys' numbering, with as many numbers as rows and a
    first row a sum; anything else is refused, naming the bad value."""
    rows = torch.ones(3, 2)
    with pytest.raises(ValueError, match="row 0 has number 1, expected a number met before or 0"):
        grad_ids.sum_rows(rows, torch.tensor([1, 0, 0]), [3], 2)
    with pytest.raises(ValueError, match="the rows have 1 numbers, expected 2"):
        grad_ids.sum_rows(rows, torch.tensor([0, 0, 0]), [3], 2)
    with pytest.raises(ValueError, match="row 2 has number 5, expected one below 2"):
        grad_ids.expand_rows(torch.ones(2, 2), torch.tensor([0, 1, 5]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="dtype"):
        grad_ids.sum_rows(rows.double(), torch.tensor([0, 1, 1]), [3], 2)
    with pytest.raises(ValueError, match="segments of 4 rows, 3 numbers and 3 rows"):
        grad_ids.sum_rows(rows, torch.tensor([0, 1, 1]), [4], 2)
    with pytest.raises(ValueError, match="1 first rows for 2 sums"):
        grad_ids.expand_rows(torch.ones(2, 2), torch.tensor([0, 1]), torch.tensor([0]))


def test_summed_gradients_take_a_rel_bound_from_the_finite_range_of_their_segment():
    """A segment's absolute bound is rel x the range of its finite gradient rows, as the codec's
    rel rule: an Inf or NaN gradient travels as an outlier and does not widen the bound."""
    from hvd_lossy.compression import Compression
    comp = Compression.lossy(0.1)
    received = grad_ids.Keyed(torch.tensor([1, 1, 2, 3, 4, 5]), [[3], [3]])  # 2 peers
    grad = torch.tensor([[0.0], [4.0], [2.0], [1.0], [3.0], [7.0]])
    frames = grad_ids.plan(comp, received, received.sum(grad, spans=True)[1])
    assert [(d, u) for d, u, _ in frames] == [(0, 2), (1, 3)]  # one row a distinct id
    assert [e for _, _, e in frames] == pytest.approx([0.4, 0.6])
    grad[1, 0], grad[4, 0] = float("inf"), float("nan")
    spans = received.sum(grad, spans=True)[1]
    assert [e for _, _, e in grad_ids.plan(comp, received, spans)] == pytest.approx([0.2, 0.6])
    grad[3:, 0] = float("nan")  # a segment without a finite element: range 0, bound 0
    spans = received.sum(grad, spans=True)[1]
    assert [e for _, _, e in grad_ids.plan(comp, received, spans)] == pytest.approx([0.2, 0.0])


def test_a_reference_on_a_slot_another_row_of_the_call_took_wins_it_back_if_last():
    """The last row of a call on a slot wins on both ends, also when it is a reference (whose
    record the sender's store leaves alone) and an earlier row of the call wrote another id."""
    enc, dec = reuse.ReuseEncoder(0.03, capacity=4), reuse.ReuseDecoder(capacity=4)
    probe = reuse.DirectMappedCache(4, 2, torch.float32)
    slots = [probe.slot(i) for i in range(64)]
    a, b = [i for i in range(64) if slots[i] == slots[0]][:2]  # two ids on one slot
    row = {a: [1.0, 2.0], b: [-3.0, 5.0]}

    def call(order):
        x = torch.tensor([row[i] for i in order])
        ids = torch.tensor(order)
        frame, predicted = enc.encode(x, ids, [len(order)])
        assert_within(x, dec.decode(frame, ids, predicted), [len(order)], 0.03)
        assert_same_state(enc, dec)
        return enc.last["references"]

    call([a])
    assert call([a, b, a]) == 2  # both a rows are references; b, on a's slot, is not held
    assert int(enc.peer.caches[0].tags[slots[a]]) == a
    assert call([a]) == 1        # a still held: the last row on the slot won it back
    call([a, b])
    assert int(enc.peer.caches[0].tags[slots[a]]) == b
    assert call([b]) == 1
