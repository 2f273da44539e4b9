"""Worker: compressed alltoall, allgather and broadcast deliver what the peers sent, within the
bound; Compression.none is Horovod's own result bit for bit. Run by tests/test_transport.py
under mpirun and horovodrun with 2 or 3 ranks."""
import time

import horovod.torch as horovod
import pytest
import torch
from transport_util import (N, R, abs_bound, assert_within, cases_of, lookups, pieces_for,
                            run_cases, uneven_splits)

import hvd_lossy.torch as hvd
from hvd_lossy import gather as _gather
from hvd_lossy.compression import LossyCompressor

EB = 0.02


def check_lossy_alltoall(case, dtype, trailing, eb=EB, mode="rel", level=1, dither=False):
    splits = uneven_splits(R, case, N)
    x = lookups(R, case, sum(splits), trailing, dtype)
    compression = hvd.Compression.lossy(eb, mode=mode, level=level, dither=dither)
    out, got = hvd.alltoall(x, splits, compression=compression)
    refs = pieces_for(R, case, N, trailing, dtype)
    assert got.tolist() == [p.shape[0] for p in refs], f"received splits {got.tolist()}"
    assert got.dtype == torch.int32
    offset = 0
    for src, ref in enumerate(refs):
        piece = out[offset:offset + ref.shape[0]]
        offset += ref.shape[0]
        assert_within(piece, ref, abs_bound(ref, eb, mode), f"{dtype} {trailing} from rank {src}")
        if src == R:  # the chunk a rank sends itself is copied, never coded
            assert torch.equal(piece, ref), f"own chunk changed ({dtype} {trailing})"
    assert offset == out.shape[0]


def test_lossy_alltoall_respects_bound_for_every_dtype_and_rank():
    for case, dtype in enumerate((torch.float32, torch.float16, torch.bfloat16)):
        check_lossy_alltoall(case, dtype, (6,))
        check_lossy_alltoall(case + 10, dtype, ())  # 1-D: each piece is one row
    check_lossy_alltoall(20, torch.float32, (3, 5), eb=0.01, mode="abs", level=2)
    for case, dtype in enumerate((torch.float32, torch.float16, torch.bfloat16)):
        check_lossy_alltoall(case + 40, dtype, (6,), level=1 + case % 2, dither=True)


def test_none_is_bit_identical_to_horovod():
    for case, trailing in ((30, (5,)), (31, ())):
        splits = uneven_splits(R, case, N)
        x = lookups(R, case, sum(splits), trailing)
        ours, ours_splits = hvd.alltoall(x, splits)
        theirs, their_splits = horovod.alltoall(x, splits)
        assert torch.equal(ours, theirs) and torch.equal(ours_splits, their_splits)
        assert torch.equal(ours, torch.cat(pieces_for(R, case, N, trailing)))
    even = lookups(R, 32, 2 * N)
    assert torch.equal(hvd.alltoall(even), horovod.alltoall(even))  # splits=None: tensor alone


def test_bfloat16_without_compression_travels_lossless():
    splits = uneven_splits(R, 40, N)
    x = lookups(R, 40, sum(splits), (4,), torch.bfloat16)
    out, _ = hvd.alltoall(x, splits)
    assert torch.equal(out, torch.cat(pieces_for(R, 40, N, (4,), torch.bfloat16)))


def test_fp16_compression_rounds_to_half():
    splits = uneven_splits(R, 41, N)
    x = lookups(R, 41, sum(splits))
    out, _ = hvd.alltoall(x, splits, compression=hvd.Compression.fp16)
    ref = torch.cat(pieces_for(R, 41, N))
    assert out.dtype == torch.float32 and torch.equal(out, ref.half().float())


def wait_for_poll(handle, seconds=30):
    """Polls until the handle reports its communication done, without synchronizing: what
    overlapping needs. Fails if poll() is not a bool or never turns True."""
    deadline = time.monotonic() + seconds
    while True:
        done = hvd.poll(handle)
        assert isinstance(done, bool), f"poll() returned {done!r}, expected a bool"
        if done:
            return
        assert time.monotonic() < deadline, f"poll() still False after {seconds} s"
        time.sleep(0.001)


def test_async_returns_horovod_pairs_and_overlaps():
    lossy = hvd.Compression.lossy(EB)
    xs = [lookups(R, 50 + i, sum(uneven_splits(R, 50 + i, N))) for i in range(2)]
    handles = [hvd.alltoall_async(x, uneven_splits(R, 50 + i, N), compression=lossy)
               for i, x in enumerate(xs)]
    even = lookups(R, 52, 3 * N)
    plain = hvd.alltoall_async(even)
    assert isinstance(plain, int), "Compression.none hands out Horovod's own handle"
    for i in reversed(range(2)):  # finish in the other order than started
        wait_for_poll(handles[i])  # the exchange completes in the background: it overlaps
        out, got = hvd.synchronize(handles[i])
        refs = pieces_for(R, 50 + i, N)
        assert got.tolist() == [r.shape[0] for r in refs]
        assert_within(out, torch.cat(refs), max(abs_bound(r, EB) for r in refs), "async")
    out, got = hvd.synchronize(plain)  # as Horovod: a pair even without splits
    assert torch.equal(out, horovod.alltoall(even))


def test_plain_handles_finished_by_horovod_leave_nothing_behind():
    x = lookups(R, 53, 2 * N)
    for _ in range(200):
        handle = hvd.alltoall_async(x)  # Compression.none: Horovod's own integer handle
        horovod.synchronize(handle)
    assert len(hvd._plain_handles) <= 1, f"{len(hvd._plain_handles)} handles kept"
    out, _ = hvd.synchronize(hvd.alltoall_async(x))  # ours still finishes them, with statistics
    assert torch.equal(out, horovod.alltoall(x))


def test_broadcast_async_neither_blocks_nor_raises_before_synchronize():
    x = lookups(R, 54, 3)
    lossy = hvd.Compression.lossy(EB)
    # Rank 0 starts its broadcast before a blocking (Horovod, named) collective the others run
    # first: a broadcast_async that waited for its header round would deadlock here.
    if R == 0:
        handle = hvd.broadcast_async(x, 0, compression=lossy)
        gathered = horovod.allgather(x, name="plain.54")
    else:
        gathered = horovod.allgather(x, name="plain.54")
        handle = hvd.broadcast_async(x, 0, compression=lossy)
    assert gathered.shape == (3 * N, 4)
    wait_for_poll(handle)
    ref = lookups(0, 54, 3)
    assert_within(hvd.synchronize(handle), ref, abs_bound(ref, EB), "broadcast_async")
    bad = hvd.broadcast_async(x, N + 3, compression=lossy)  # a root outside the set
    wait_for_poll(bad)  # the verdict is known: synchronize raises without waiting
    try:
        hvd.synchronize(bad)
    except hvd.RankError as e:
        assert f"root_rank {N + 3} is not in the process set" in str(e)
    else:
        raise AssertionError("a broadcast from a root outside the set did not raise")


def test_differentiable_async_gives_the_gradient_alltoall_gives():
    case = 55
    splits = uneven_splits(R, case, N)
    rows_in = sum(uneven_splits(s, case, N)[R] for s in range(N))
    g_out = lookups(200 + R, case, rows_in, (4,))
    # Undithered: dither seeds advance with every call, so two calls' gradients would differ.
    for compression in (hvd.Compression.none, hvd.Compression.lossy(EB, backward=0.05, dither=False)):
        grads = []
        for use_async in (False, True):
            x = lookups(R, case, sum(splits)).requires_grad_()
            if use_async:
                handle = hvd.alltoall_async(x, splits, compression=compression, differentiable=True)
                _ = torch.ones(64, 64) @ torch.ones(64, 64)  # work overlapped with the exchange
                out, got = hvd.synchronize(handle)
            else:
                out, got = hvd.alltoall(x, splits, compression=compression)
            assert out.requires_grad and got.tolist() == [p.shape[0] for p in pieces_for(R, case, N)]
            (g_x,) = torch.autograd.grad(out, x, grad_outputs=g_out)
            grads.append(g_x)
        assert torch.equal(grads[0], grads[1]), f"{compression}: async gradient differs"


class TwoFramesPerDestination(LossyCompressor):
    """Plans two frames per destination with different bounds, as the adaptive controller may."""

    def plan(self, splits):
        self.sizes_seen = None
        return [(d, part, eb) for d, rows in enumerate(splits)
                for part, eb in ((rows // 2, self.error_bound), (rows - rows // 2, self.error_bound / 4))]

    def after_compress(self, plan, frame_sizes, tensor):
        self.sizes_seen = (len(plan), list(frame_sizes), tensor.shape[0])


def test_subclass_plan_sends_several_frames_per_destination():
    c = TwoFramesPerDestination(EB)
    splits = uneven_splits(R, 60, N)
    x = lookups(R, 60, sum(splits))
    out, _ = hvd.alltoall(x, splits, compression=c)
    n_frames, sizes, rows = c.sizes_seen
    assert n_frames == 2 * N == len(sizes) and rows == x.shape[0]
    # the two frames of the own chunk are copied, not coded: their sizes are None
    assert [i for i, n in enumerate(sizes) if n is None] == [2 * R, 2 * R + 1]
    assert hvd.comm_stats()["last"]["wire_bytes"] == sum(n for n in sizes if n is not None)
    offset = 0
    for src, ref in enumerate(pieces_for(R, 60, N)):
        half = ref.shape[0] // 2
        for part, eb in ((ref[:half], EB), (ref[half:], EB / 4)):
            assert_within(out[offset:offset + part.shape[0]], part, abs_bound(part, eb), f"src {src}")
            offset += part.shape[0]


def sender_grads(case, weights_of, eb_back):
    """Reference gradient of this rank's input and the bound of each of its pieces: dest d
    computes weights_of(d) as the gradient of its output and compresses, per source, its rows."""
    splits = uneven_splits(R, case, N)
    grads, bounds = [], []
    for d in range(N):
        w = weights_of(d)
        start = sum(uneven_splits(s, case, N)[d] for s in range(R))
        piece = w[start:start + splits[d]]
        grads.append(piece)
        bounds.append(abs_bound(piece, eb_back) if eb_back is not None else 0.0)
    return splits, grads, bounds


def test_gradient_returns_through_compressed_alltoall_with_reversed_splits():
    case = 70

    def weights_of(d):  # a rank-specific, non-contiguous gradient for the output of rank d
        rows = sum(uneven_splits(s, case, N)[d] for s in range(N))
        return lookups(100 + d, case, rows, (5,)).t().contiguous().t() * 3

    for eb_back, dither in ((0.05, False), (0.05, "backward"), (None, False)):
        splits, grads, bounds = sender_grads(case, weights_of, eb_back)
        x = lookups(R, case, sum(splits), (5,)).requires_grad_()
        compression = hvd.Compression.lossy(EB, backward=eb_back, dither=dither)
        out, _ = hvd.alltoall(x, splits, compression=compression)
        g_out = weights_of(R)
        assert not g_out.is_contiguous()
        (g_x,) = torch.autograd.grad(out, x, grad_outputs=g_out)
        offset = 0
        for d, (ref, bound) in enumerate(zip(grads, bounds)):
            assert_within(g_x[offset:offset + ref.shape[0]], ref, bound, f"grad to dest {d} (backward={eb_back})")
            offset += ref.shape[0]
    # Compression.none: exact, also for a non-contiguous gradient (Horovod's own would raise)
    splits, grads, _ = sender_grads(case, weights_of, None)
    x = lookups(R, case, sum(splits), (5,)).requires_grad_()
    out, _ = hvd.alltoall(x, splits)
    (g_x,) = torch.autograd.grad(out, x, grad_outputs=weights_of(R))
    assert torch.equal(g_x, torch.cat(grads))


def test_a_destinations_pieces_travel_in_one_frame_that_carries_the_protocol_header():
    # 8 pieces of 4 rows a destination, each with its own bound: one format-2 frame a
    # destination, the protocol's fields in its header, costs less than a 112-byte header a
    # piece.
    pieces = 8
    x = torch.randn(N * pieces * 4, 8, generator=torch.Generator().manual_seed(R)) * 0.1
    c = hvd.Compression.lossy(EB, segments=pieces, level=2)
    out, _ = hvd.alltoall(x, [pieces * 4] * N, compression=c)
    last = hvd.comm_stats()["last"]
    assert last["wire_bytes"] < (N - 1) * pieces * 112, last
    assert last["meta_bytes"] <= 8 * N, last  # flags, rank and digest in each frame's header
    for src in range(N):
        sent = torch.randn(N * pieces * 4, 8, generator=torch.Generator().manual_seed(src)) * 0.1
        mine = sent[R * pieces * 4:(R + 1) * pieces * 4]
        for k in range(pieces):
            got = out[src * pieces * 4 + 4 * k:src * pieces * 4 + 4 * (k + 1)]
            ref = mine[4 * k:4 * (k + 1)]
            assert_within(got, ref, abs_bound(ref, EB), f"src {src} piece {k}")


def test_comm_stats_report_bytes_ratio_and_bounds():
    hvd.reset_comm_stats()
    splits = uneven_splits(R, 80, N)
    x = lookups(R, 80, sum(splits), (8,))
    out, _ = hvd.alltoall(x, splits, compression=hvd.Compression.lossy(EB))
    stats = hvd.comm_stats()
    last, total = stats["last"], stats["total"]
    assert total["calls"] == 1 and last["op"] == "alltoall"
    own = splits[R] * 8 * 4  # the chunk a rank keeps is copied, never coded or sent
    assert last["raw_bytes"] == x.numel() * 4 - own and last["local_bytes"] == own
    assert last["recv_raw_bytes"] == out.numel() * 4
    assert last["ratio"] == last["raw_bytes"] / last["wire_bytes"]
    assert last["error_bounds"] == [EB] * (N - 1)
    assert min(last["compress_s"], last["comm_s"], last["decompress_s"]) > 0
    assert total["wire_bytes"] == last["wire_bytes"] and total["meta_bytes"] > 0


def run_auto(c, calls, rows_of, case):
    """`calls` auto alltoalls of rows_of(i) rows a rank, each checked against what was sent;
    returns this rank's report of c's slot."""
    from hvd_lossy import auto
    for i in range(calls):
        rows = [rows_of(i, s) for s in range(N)]
        x = lookups(R, case + i, rows[R] * N)
        out, got = hvd.alltoall(x, [rows[R]] * N, compression=c)
        assert got.tolist() == rows
        offset = 0
        for src in range(N):
            ref = lookups(src, case + i, rows[src] * N)[R * rows[src]:(R + 1) * rows[src]]
            assert_within(out[offset:offset + rows[src]], ref, abs_bound(ref, EB), f"auto call {i}")
            offset += rows[src]
    mine = auto.slot(c, hvd.global_process_set).report()
    assert mine in hvd.comm_stats()["auto"] and mine["calls"] == calls, mine
    everyone = horovod.allgather_object(mine)
    assert all(r == everyone[0] for r in everyone), f"ranks took different paths: {everyone}"
    return mine


def test_auto_decides_alike_on_every_rank_and_stays_within_bound():
    from hvd_lossy import auto
    c = hvd.Compression.lossy(EB, auto=True)
    # rank 0 sends 4x more rows: another size bucket, and still one decision
    mine = run_auto(c, auto.DECIDED_WITHIN + 2, lambda i, s: 16 if s == 0 else 4, 110)
    assert mine["decision"] in ("lossy", "plain") and len(mine["message_bytes"]) == 2, mine
    # each mode's warm-up call and its first look's, at least
    assert mine["lossy_calls"] >= 2 and mine["plain_calls"] >= 2, mine
    assert mine["lossy_floor_ms"] > 0  # the lossy calls' statistics reached the slot
    assert mine["plain_period_ms"] > 0 and mine["lossy_period_ms"] > 0


def test_auto_measures_again_when_a_rank_changes_its_message_size():
    from hvd_lossy import auto
    c = hvd.Compression.lossy(EB, auto=True)
    first = auto.DECIDED_WITHIN  # decided by then
    rows_of = lambda i, s: 32 if (s == N - 1 and i >= first) else 4  # noqa: E731
    mine = run_auto(c, first + auto.AGREE_EVERY + auto.LAG, rows_of, 130)
    assert mine["decision"] == "probing", mine


def count_horovod_ops(call):
    """call() with every Horovod collective counted: {function name: calls}."""
    from horovod.torch import mpi_ops
    names = ("alltoall_async", "allgather_async", "broadcast_async", "allreduce_async")
    real = {n: getattr(mpi_ops, n) for n in names}
    counts = dict.fromkeys(names, 0)

    def counting(n):
        def wrapper(*args, **kwargs):
            counts[n] += 1
            return real[n](*args, **kwargs)
        return wrapper

    for n in names:
        setattr(mpi_ops, n, counting(n))
    try:
        call()
    finally:
        for n in names:
            setattr(mpi_ops, n, real[n])
    return {n: k for n, k in counts.items() if k}


def test_a_lossy_alltoall_and_its_gradient_take_one_horovod_collective_each():
    splits = uneven_splits(R, 140, N)
    x = lookups(R, 140, sum(splits), (6,)).requires_grad_()

    def forward_and_backward():
        out, _ = hvd.alltoall(x, splits, compression=hvd.Compression.lossy(EB, dither="backward"))
        out.sum().backward()

    assert count_horovod_ops(forward_and_backward) == {"alltoall_async": 2}
    assert count_horovod_ops(lambda: hvd.allgather(x.detach(), compression=hvd.Compression.lossy(EB))) \
        == {"allgather_async": 1}


def test_allgather_delivers_every_rank_within_bound():
    rows = [(s * 2) % 3 for s in range(N)]  # rank 0 contributes no rows
    for case, dtype, trailing in ((90, torch.float32, (4,)), (91, torch.bfloat16, ()), (92, torch.float16, (2, 3))):
        x = lookups(R, case, rows[R], trailing, dtype)
        refs = [lookups(s, case, rows[s], trailing, dtype) for s in range(N)]
        out = hvd.allgather(x, compression=hvd.Compression.lossy(EB))
        offset = 0
        for s, ref in enumerate(refs):
            assert_within(out[offset:offset + rows[s]], ref, abs_bound(ref, EB), f"allgather from {s}")
            offset += rows[s]
        if dtype != torch.bfloat16:
            assert torch.equal(hvd.allgather(x), horovod.allgather(x))
        else:  # bfloat16 without compression: lossless frames
            assert torch.equal(hvd.allgather(x), torch.cat(refs))
    handle = hvd.allgather_async(lookups(R, 93, 2), compression=hvd.Compression.lossy(0.0))
    assert torch.equal(hvd.synchronize(handle), torch.cat([lookups(s, 93, 2) for s in range(N)]))


def test_allgather_segments_are_each_coded_within_their_own_range():
    # The lossy optimizer's use: a step's parameters as segments of one frame a rank. A first
    # segment 1000x larger would give the whole frame a bound far looser than the second's own.
    def rows_of(s):
        x = lookups(s, 94, 7, (3,))
        x[:2] *= 1000
        return x
    out = _gather.allgather_start(rows_of(R), "segments.94", hvd.Compression.lossy(EB),
                                  segments=[2, 5]).wait()
    for s in range(N):
        mine, ref = out[7 * s:7 * s + 7], rows_of(s)
        for a, b in ((0, 2), (2, 7)):
            assert_within(mine[a:b], ref[a:b], abs_bound(ref[a:b], EB), f"rank {s} rows {a}:{b}")
    for bad in ([2, 4], [8, -1]):
        with pytest.raises(ValueError, match=r"segments must be rows >= 0 summing to the "
                                             rf"tensor's 7, got \[{bad[0]}, {bad[1]}\]"):
            _gather.allgather_start(rows_of(R), "segments.95", hvd.Compression.lossy(EB),
                                    segments=bad)


def test_broadcast_gives_all_ranks_the_same_values_within_bound():
    root = N - 1
    x = lookups(R, 100, 5, (3,))
    out = hvd.broadcast(x, root, compression=hvd.Compression.lossy(EB))
    ref = lookups(root, 100, 5, (3,))
    assert_within(out, ref, abs_bound(ref, EB), "broadcast")
    assert torch.equal(horovod.allgather(out.view(1, -1)), out.view(1, -1).repeat(N, 1)), "ranks differ"
    bf = lookups(R, 101, 3, (), torch.bfloat16)
    assert torch.equal(hvd.broadcast(bf, 0), lookups(0, 101, 3, (), torch.bfloat16))
    assert torch.equal(hvd.broadcast(x, root), horovod.broadcast(x, root))
    handle = hvd.broadcast_async(x, 0, compression=hvd.Compression.lossy(EB))
    assert_within(hvd.synchronize(handle), lookups(0, 100, 5, (3,)), abs_bound(lookups(0, 100, 5, (3,)), EB), "async")


if __name__ == "__main__":
    run_cases(cases_of(globals()))
