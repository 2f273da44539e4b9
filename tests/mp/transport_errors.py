"""Worker: bad input on one rank makes every rank raise RankError naming that rank, and nobody
hangs; after each error the ranks are still in step (a correct call follows every case)."""
import torch
from transport_util import N, R, cases_of, lookups, run_cases

import hvd_lossy
import hvd_lossy.torch as hvd
from hvd_lossy.compression import LossyCompressor

BAD = N - 1  # the rank that misbehaves
LOSSY = hvd.Compression.lossy(0.02)


def expect_rank_error(call, *fragments):
    """`call` must raise RankError on this rank, naming every fragment; then a correct
    alltoall must still work, proving the ranks stayed in step."""
    try:
        call()
    except hvd.RankError as e:
        text = str(e)
        missing = [f for f in fragments if f not in text]
        assert not missing, f"error message lacks {missing}: {text}"
    else:
        raise AssertionError(f"rank {R} got no error; expected one mentioning {fragments}")
    x = lookups(R, 1, 2 * N)
    out = hvd.alltoall(x, compression=LOSSY)
    assert out.shape == x.shape


def even(rows_per_rank=2, trailing=(4,), dtype=torch.float32):
    return lookups(R, 2, rows_per_rank * N, trailing, dtype)


def test_splits_not_summing_to_rows_raise_everywhere():
    splits = [2] * N
    if R == BAD:
        splits[0] += 1
    expect_rank_error(lambda: hvd.alltoall(even(), splits, compression=LOSSY),
                      f"rank {BAD}: splits sum to {2 * N + 1} but the tensor has {2 * N} rows")


def test_negative_split_raises_everywhere():
    splits = [2] * N
    if R == BAD:
        splits[0], splits[1] = -1, 5
    expect_rank_error(lambda: hvd.alltoall(even(), splits, compression=LOSSY),
                      f"rank {BAD}: splits[0] is negative (-1)")


def test_wrong_number_of_splits_raises_everywhere():
    splits = [2] * N if R != BAD else [2 * N]
    expect_rank_error(lambda: hvd.alltoall(even(), splits, compression=LOSSY),
                      f"rank {BAD}: got 1 splits for {N} ranks")


def test_uneven_rows_without_splits_raise_everywhere():
    x = even() if R != BAD else lookups(R, 2, 2 * N + 1)
    expect_rank_error(lambda: hvd.alltoall(x, compression=LOSSY),
                      f"rank {BAD}: splits=None needs dim 0 ({2 * N + 1}) to divide evenly")


def test_ranks_disagreeing_on_dtype_raise_everywhere():
    x = even(dtype=torch.float16 if R == BAD else torch.float32)
    expect_rank_error(lambda: hvd.alltoall(x, compression=LOSSY),
                      "disagree on the dtype", f"rank {BAD} has torch.float16", "rank 0 has torch.float32")


def test_ranks_disagreeing_on_trailing_shape_raise_everywhere():
    x = even(trailing=(5,) if R == BAD else (4,))
    expect_rank_error(lambda: hvd.alltoall(x, compression=LOSSY),
                      "disagree on the trailing shape", f"rank {BAD} has (5,)")


def test_uncompressible_dtype_raises_everywhere():
    x = even() if R != BAD else torch.arange(2 * N * 4).view(2 * N, 4)
    expect_rank_error(lambda: hvd.alltoall(x, compression=LOSSY),
                      f"rank {BAD}: dtype torch.int64 cannot be compressed")


def with_bad_rank_compressing(once, call):
    """Runs call() while, on rank BAD, the next compress_grouped call (the alltoall's frames
    for the ranks before it; BAD is the last rank) goes through once(real, *args) instead."""
    real = hvd_lossy.compress_grouped

    def patched(*args, **kwargs):
        hvd_lossy.compress_grouped = real
        return once(real, *args, **kwargs)

    if R == BAD:
        hvd_lossy.compress_grouped = patched
    try:
        return call()
    finally:
        hvd_lossy.compress_grouped = real


def expect_receive_error(receivers, once, *needles):
    """Frames only the receivers can find bad: they raise RankError in the call itself; every
    other rank raises the same error (naming the receivers) in its next lossy call, which
    reports it; after that a correct call works on all ranks."""
    def bad_call():
        return with_bad_rank_compressing(once, lambda: hvd.alltoall(even(), compression=LOSSY))

    def next_call():
        return hvd.alltoall(even(), compression=LOSSY)

    if R in receivers:
        expect_rank_error(bad_call, *needles)
        # the receivers already raised: their call that reports it to the peers succeeds
        assert next_call().shape == even().shape
    else:
        assert bad_call().shape == even().shape, "a rank that received good frames gets them"
        expect_rank_error(next_call, *needles, "reported with the next one")


def test_corrupt_frame_raises_on_the_receiver_then_on_every_other_rank():
    def corrupting(real, tensor, rows, bounds, groups, prefix, out, offset, **kwargs):
        sizes, frames = real(tensor, rows, bounds, groups, prefix, out, offset, **kwargs)
        out[offset + prefix + frames[0] // 2] ^= 0x40  # inside the first frame, meant for rank 0
        return sizes, frames

    expect_receive_error(
        {0}, corrupting, f"rank 0: the bytes received from rank {BAD} failed to decode")


def test_a_corrupt_allgather_frame_raises_on_every_rank():
    # Every rank decodes every rank's frame, the sender's own included: all raise in the call.
    def corrupting(real, tensor, rows, bounds, groups, prefix, out, offset, **kwargs):
        sizes, frames = real(tensor, rows, bounds, groups, prefix, out, offset, **kwargs)
        out[offset + prefix + frames[0] // 2] ^= 0x40
        return sizes, frames

    expect_rank_error(lambda: with_bad_rank_compressing(
        corrupting, lambda: hvd.allgather(even(), compression=LOSSY)),
        f"the bytes received from rank {BAD} failed to decode")


def test_a_corrupted_header_is_a_receive_failure_not_a_verdict_only_its_receiver_reads():
    # One bit of the settings digest in the protocol's extension of the frame for rank 0: read
    # unchecked it would make rank 0 alone raise "disagree on the compression settings"; its
    # CRC32C fails, so rank 0 raises a receive failure and the peers raise it next call.
    def corrupting(real, tensor, rows, bounds, groups, prefix, out, offset, **kwargs):
        sizes, frames = real(tensor, rows, bounds, groups, prefix, out, offset, **kwargs)
        at = offset + prefix + 7
        while out[at] & 0x80:  # total_bytes
            at += 1
        info = int(out[at + 1])
        at += 2 + (3 if info & 0x80 else 0)  # info, seed: at the extension's length
        at += 2  # its length and flags byte: at the sender's rank
        while out[at] & 0x80:
            at += 1
        out[at + 1] ^= 0x01  # the digest's low byte
        return sizes, frames

    expect_receive_error(
        {0}, corrupting, f"rank 0: the bytes received from rank {BAD} failed to decode")


def test_frames_of_a_shape_the_peers_do_not_share_raise_on_every_rank_at_once():
    # A chunk that is one frame announces the frame's own shape: frames of a narrower tensor
    # are a disagreement every rank reads from the headers in the same call.
    def wrong_shape(real, tensor, *args, **kwargs):
        return real(tensor[:, :-1], *args, **kwargs)

    expect_rank_error(lambda: with_bad_rank_compressing(
        wrong_shape, lambda: hvd.alltoall(even(), compression=LOSSY)),
        "ranks disagree on the trailing shape")
    assert hvd.alltoall(even(), compression=LOSSY).shape == even().shape


def test_a_broadcast_frame_disagreeing_with_its_announcement_raises_on_every_rank():
    # The root's header round announces its tensor; its frame, broadcast apart, holds one row
    # fewer. Every rank decodes that frame (the root too), so every rank raises in the call.
    x = even()
    lossy = hvd.Compression.lossy(0.02)
    real = lossy.compress
    if R == 0:
        lossy.compress = lambda tensor: real(tensor[:-1])
    expect_rank_error(lambda: hvd.broadcast(x, 0, compression=lossy),
                      "the frames received from rank 0 disagree")


def with_output_limit(limit, call):
    real = hvd_lossy.max_output_bytes()
    hvd_lossy.set_max_output_bytes(limit)
    try:
        return call()
    finally:
        hvd_lossy.set_max_output_bytes(real)


def test_headers_announcing_more_than_max_output_bytes_raise_before_allocating():
    # Rank 0 takes at most one chunk of output: the second sender's header puts it over, so
    # rank 0 refuses in the call and its peers raise with their next one.
    chunk = 2 * 4 * 4  # 2 rows of 4 float32 from every rank
    needle = "rank 1 announced more output than max_output_bytes"
    for call in (lambda: hvd.alltoall(even(), compression=LOSSY),
                 lambda: hvd.allgather(even()[:2], compression=LOSSY)):
        if R == 0:
            expect_rank_error(lambda: with_output_limit(chunk, call), needle)
            assert hvd.alltoall(even(), compression=LOSSY).shape == even().shape
        else:
            assert call() is not None
            expect_rank_error(lambda: hvd.alltoall(even(), compression=LOSSY), needle,
                              "reported with the next one")


def with_limit(limit, call):
    """Runs call() with Horovod's int32 count limit taken as `limit` bytes on every rank."""
    real = hvd_lossy.protocol.INT32_MAX
    hvd_lossy.protocol.INT32_MAX = limit
    try:
        return call()
    finally:
        hvd_lossy.protocol.INT32_MAX = real


def test_chunks_adding_up_past_the_per_call_limit_raise_everywhere():
    # A chunk of one header and one frame fits the limit alone, but not N of them: a receiver
    # of N such chunks would overflow, which no single sender sees.
    x = torch.randn(4 * N, 8, generator=torch.Generator().manual_seed(R))
    # The alltoall's chunk: one format-2 frame with the protocol's extension (at most 40
    # bytes more than the frame alone).
    chunk = 40 + hvd_lossy.compress(x[:4], 0.02).numel()
    assert hvd_lossy.protocol.per_rank_limit(N) == (2 ** 31 - 1) // N
    expect_rank_error(lambda: with_limit(chunk + 1, lambda: hvd.alltoall(x, compression=LOSSY)),
                      "exceed what one destination may take in a call", "int32")
    # The allgather's contribution: one frame of the whole tensor, more than 4 rows'.
    chunk = 40 + hvd_lossy.compress(x[:4], 0.02).numel()
    expect_rank_error(lambda: with_limit(chunk + 1, lambda: hvd.allgather(x, compression=LOSSY)),
                      "bytes one rank may send in a call", "int32")


def test_ranks_calling_with_different_bounds_or_compressors_raise_everywhere():
    x = even()
    for mine in (hvd.Compression.lossy(0.05 if R == BAD else 0.02),
                 hvd.Compression.lossy(0.02, level=2 if R == BAD else 1),
                 hvd.Compression.lossy(0.02, mode="abs" if R == BAD else "rel")):
        expect_rank_error(lambda: hvd.alltoall(x, compression=mine),
                          "disagree on the compression settings")
        expect_rank_error(lambda: hvd.allgather(x, compression=mine),
                          "disagree on the compression settings")
    expect_rank_error(lambda: hvd.broadcast(x, 0, compression=hvd.Compression.lossy(
        0.05 if R == BAD else 0.02)), "disagree on the compression settings")


class BrokenPlan(LossyCompressor):
    def plan(self, splits):
        if R == BAD:
            raise RuntimeError("controller lost its tables")
        return super().plan(splits)


def test_failing_compressor_plan_raises_everywhere():
    expect_rank_error(lambda: hvd.alltoall(even(), compression=BrokenPlan(0.02)),
                      f"rank {BAD}: bad argument")


def test_allgather_and_broadcast_disagreements_raise_everywhere():
    x = even(trailing=(3,) if R == BAD else (4,))
    expect_rank_error(lambda: hvd.allgather(x, compression=LOSSY), "allgather", "trailing shape")
    y = even(rows_per_rank=1 if R == BAD else 2)
    expect_rank_error(lambda: hvd.broadcast(y, 0, compression=LOSSY), "broadcast", "dim 0")
    expect_rank_error(lambda: hvd.broadcast(even(), N + 3, compression=LOSSY),
                      f"root_rank {N + 3} is not in the process set")


def test_async_errors_raise_in_synchronize_on_every_rank():
    splits = [2] * N if R != BAD else [2] * (N + 1)
    handle = hvd.alltoall_async(even(), splits, compression=LOSSY)  # starting never raises
    expect_rank_error(lambda: hvd.synchronize(handle), f"rank {BAD}: got {N + 1} splits")


if __name__ == "__main__":
    run_cases(cases_of(globals()))
