"""Worker: hvd_lossy.torch's alltoall with `ids=` (the rows' embedding ids). Every received
element is within its frame's bound, for ids that tell the truth and for ids that lie (one id
for rows that differ, NaN and Inf among them); the output is the output without ids bit for bit
(the frames are the same bytes), for Compression.lossy and Compression.adaptive, sync, async
and autograd; bad ids on one rank raise RankError on every rank. Run by tests/test_ids.py."""
import torch
from codec_calls import CodecCalls
from transport_errors import BAD, expect_rank_error
from transport_util import (N, R, abs_bound, assert_within, cases_of, lookups_and_ids,
                            pieces_for, run_cases, uneven_splits)

import hvd_lossy.torch as hvd
from hvd_lossy.adaptive import Controller

EB = 0.02


def test_alltoall_with_ids_delivers_every_element_within_bound_and_as_without_ids():
    for case, (dtype, level) in enumerate([(torch.float32, 1), (torch.float16, 1),
                                           (torch.bfloat16, 1), (torch.float32, 2)]):
        splits = uneven_splits(R, 50 + case, N)
        x, ids = lookups_and_ids(R, 50 + case, sum(splits), (6,), dtype)
        lossy = hvd.Compression.lossy(EB, level=level)
        with CodecCalls() as codec:
            out, got = hvd.alltoall(x, splits, compression=lossy, ids=ids)
        codec.assert_ids_match_rows()
        plain_ids, _ = hvd.alltoall(x, splits, compression=lossy)
        assert torch.equal(out, plain_ids), f"{dtype} L{level}: ids changed the output"
        at = 0
        for src, ref in enumerate(pieces_for(R, 50 + case, N, (6,), dtype)):
            assert_within(out[at:at + ref.shape[0]], ref, abs_bound(ref, EB),
                          f"{dtype} L{level} from rank {src}")
            at += ref.shape[0]
        assert got.tolist() == [uneven_splits(s, 50 + case, N)[R] for s in range(N)]


PER = 5  # rows of each chunk in the lying-ids case


def lying(src):
    """Rank src's rows, PER for each destination, all under ONE id: in every chunk a row, the
    same row with its last element one ulp up, a row of NaN, a row with +-Inf, and the first
    row again (the one claim that is true)."""
    g = torch.Generator().manual_seed(4242 + src)
    x = torch.randn(N * PER, 5, generator=g)
    for at in range(0, N * PER, PER):
        x[at + 1] = x[at]
        x[at + 1, -1] = torch.nextafter(x[at, -1], torch.tensor(10.0))
        x[at + 2] = float("nan")
        x[at + 3, 1], x[at + 3, 4] = float("inf"), float("-inf")
        x[at + 4] = x[at]
    return x, torch.zeros(N * PER, dtype=torch.int64)


def test_lying_ids_still_hold_the_bound_on_every_element():
    x, ids = lying(R)
    out, _ = hvd.alltoall(x, [PER] * N, compression=hvd.Compression.lossy(EB), ids=ids)
    for src in range(N):
        ref = lying(src)[0][R * PER:(R + 1) * PER]
        piece = out[src * PER:(src + 1) * PER]
        assert torch.equal(torch.isnan(piece), torch.isnan(ref)), f"NaN moved (from {src})"
        inf = torch.isinf(ref)
        assert torch.equal(piece[inf], ref[inf]), f"Inf changed (from {src})"
        finite = torch.isfinite(ref)
        err = float((piece[finite].double() - ref[finite].double()).abs().max())
        assert err <= abs_bound(ref, EB), f"from rank {src}: error {err} > {abs_bound(ref, EB)}"


def test_ids_work_with_async_and_autograd_and_leave_the_gradient_alone():
    splits = uneven_splits(R, 60, N)
    x, ids = lookups_and_ids(R, 60, sum(splits), (6,))
    lossy = hvd.Compression.lossy(EB)
    want, _ = hvd.alltoall(x, splits, compression=lossy)
    out, _ = hvd.synchronize(hvd.alltoall_async(x, splits, compression=lossy, ids=ids))
    assert torch.equal(out, want)
    leaf = x.clone().requires_grad_(True)
    handle = hvd.alltoall_async(leaf, splits, compression=lossy, differentiable=True, ids=ids)
    out, _ = hvd.synchronize(handle)
    assert torch.equal(out.detach(), want)
    out.sum().backward()  # a constant gradient: its frames are lossless
    assert torch.equal(leaf.grad, torch.ones_like(x))
    leaf.grad = None
    out, _ = hvd.alltoall(leaf, splits, compression=lossy, ids=ids)
    (out * 2).sum().backward()
    assert torch.equal(leaf.grad, torch.full_like(x, 2.0))


def test_adaptive_compression_takes_ids_and_sends_the_same_output():
    controller = Controller(tables={f"t{k}": 1000 * (k + 1) for k in range(2 * N)}, interval=100)
    mine = controller.tables_of(R)
    comp = hvd.Compression.adaptive(controller, tables=mine)
    per = 5  # rows of each table for each destination
    x, ids = lookups_and_ids(R, 70, len(mine) * per * N, (6,))
    splits = [len(mine) * per] * N
    with CodecCalls() as codec:
        with_ids, _ = hvd.alltoall(x, splits, compression=comp, ids=ids)
    codec.assert_ids_match_rows()
    without, _ = hvd.alltoall(x, splits, compression=comp)
    assert torch.equal(with_ids, without)
    controller.step()


def test_bad_ids_on_one_rank_raise_on_every_rank():
    x, ids = lookups_and_ids(R, 80, 2 * N, (4,))
    lossy = hvd.Compression.lossy(EB)
    for bad, detail in ((ids.float(), "ids must be an int64 tensor, got torch.float32"),
                        (ids[:-1], f"ids must have shape ({2 * N},), one key per row, got "
                                   f"({2 * N - 1},)"),
                        (ids.tolist(), "ids must be an int64 torch.Tensor with one key per row, "
                                       "got list")):
        given = bad if R == BAD else ids
        needles = [f"rank {BAD}"] + ([detail] if R == BAD else [])
        expect_rank_error(lambda: hvd.alltoall(x, compression=lossy, ids=given), *needles)
    flat = x.reshape(-1)
    given = torch.arange(flat.numel()) if R == BAD else None
    needles = [f"rank {BAD}"] + (["ids need a 2-D tensor (rows, dim)"] if R == BAD else [])
    expect_rank_error(lambda: hvd.alltoall(flat, compression=lossy, ids=given), *needles)


if __name__ == "__main__":
    run_cases(cases_of(globals()))
