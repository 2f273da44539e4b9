"""Worker (torchrun): hvd_lossy.distributed.all_to_all_single with `ids=` in the reference
DLRM's flattened layout (`row_len`): ids of shape [rows, tables]. Every table's rows arrive
within that table's bound and exactly as without ids, for ids that lie too; the autograd form
takes them (its gradient does not); bad ids on one rank raise RankError on every rank. Run by
tests/test_ids.py."""
import torch
from codec_calls import CodecCalls
from dist_util import N, R, cases_of, max_error, rel_bound, run_cases

import hvd_lossy.distributed as dist

C = dist.Compression
DIM, BATCH, K = 4, 6, 2  # embedding dim, samples per rank, tables per rank
BAD = N - 1


def dlrm_rows(src, case=0):
    """Rank src's lookups in the flattened layout, [N * BATCH, K x DIM] (table t's values
    scaled by 10 ** t), and their ids [N * BATCH, K], each table's ids into 8 rows."""
    g = torch.Generator().manual_seed(31 * case + src)
    tables = torch.randn(K, 8, DIM, generator=g) * (10.0 ** torch.arange(K)).view(K, 1, 1)
    ids = torch.randint(0, 8, (N * BATCH, K), generator=g)
    rows = torch.stack([tables[t][ids[:, t]] for t in range(K)], dim=1)
    return rows.reshape(N * BATCH, K * DIM), ids


def exchange(flat, compression, ids=None):
    out = torch.empty_like(flat)
    dist.all_to_all_single(out, flat, compression=compression, ids=ids)
    return out


def test_row_len_layout_with_ids_keeps_each_tables_bound_and_the_output_of_no_ids():
    x, ids = dlrm_rows(R)
    flat = x.reshape(-1).contiguous()
    lossy = C.lossy(0.01, row_len=DIM, tables=K)
    with CodecCalls() as codec:
        out = exchange(flat, lossy, ids)
    codec.assert_ids_match_rows()  # rearranged table-major with their rows
    assert torch.equal(out, exchange(flat, lossy)), "ids changed the output"
    got = out.view(N, BATCH, K, DIM)
    for src in range(N):
        ref = dlrm_rows(src)[0][R * BATCH:(R + 1) * BATCH].view(BATCH, K, DIM)
        for t in range(K):
            bound = 0.0 if src == R else rel_bound(ref[:, t], 0.01)
            assert max_error(got[src, :, t], ref[:, t]) <= bound, (src, t)
    lies = torch.zeros_like(ids)  # one id for every row of every table
    assert torch.equal(exchange(flat, lossy, lies), out), "lying ids changed the output"
    leaf = flat.clone().requires_grad_(True)
    back = dist.all_to_all_single_autograd(leaf, compression=lossy, ids=ids)
    assert torch.equal(back.detach(), out)
    back.sum().backward()  # a constant gradient: lossless frames
    assert torch.equal(leaf.grad, torch.ones_like(flat))


def test_bad_ids_in_the_row_len_layout_raise_on_every_rank():
    x, ids = dlrm_rows(R, 1)
    flat = x.reshape(-1).contiguous()
    lossy = C.lossy(0.01, row_len=DIM, tables=K)
    for bad, detail in ((ids.t().contiguous(), f"ids must have shape ({N * BATCH}, {K}): one "
                                               f"key per row and table of the [rows, tables x "
                                               f"{DIM}] input, got ({K}, {N * BATCH})"),
                        (ids.int(), "ids must be an int64 tensor, got torch.int32")):
        try:
            exchange(flat, lossy, bad if R == BAD else ids)
        except dist.RankError as e:
            assert f"rank {BAD}" in str(e), e
            assert R != BAD or detail in str(e), e
        else:
            raise AssertionError(f"rank {R}: no RankError for {detail}")
    exchange(flat, lossy, ids)  # the ranks are still in step


if __name__ == "__main__":
    run_cases(cases_of(globals()))
