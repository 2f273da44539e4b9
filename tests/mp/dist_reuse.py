"""Worker (torchrun): hvd_lossy.distributed.all_to_all_single with a reusing compressor in the
reference DLRM's flattened layout (`row_len`): ids and recv_ids of shape [rows, tables]. Every
received element is within its table's bound of the sender's CURRENT value over many calls
while the tables drift; the autograd form reuses the forward only; a restarted compressor on
one rank raises RankError on every rank, and the calls after it are correct. Run by
tests/test_reuse.py."""
import torch
from dist_util import N, R, cases_of, max_error, rel_bound, run_cases

import hvd_lossy.distributed as dist

C = dist.Compression
DIM, BATCH, K, EB = 4, 16, 2, 0.02  # embedding dim, samples per rank, tables per rank, bound


def dlrm_rows(src, call):
    """Rank src's lookups at `call` in the flattened layout, [N * BATCH, K x DIM] (table t
    scaled by 10 ** t, every row drifting), and their ids [N * BATCH, K] into 12 rows a table."""
    g = torch.Generator().manual_seed(src)
    tables = torch.randn(K, 12, DIM, generator=g) * (10.0 ** torch.arange(K)).view(K, 1, 1)
    tables = tables + 1e-3 * call * torch.randn(K, 12, DIM, generator=g)
    ids = torch.randint(0, 12, (N * BATCH, K), generator=torch.Generator().manual_seed(
        1000 * call + src))
    rows = torch.stack([tables[t][ids[:, t]] for t in range(K)], dim=1)
    return rows.reshape(N * BATCH, K * DIM), ids


def received_ids(call):
    return torch.cat([dlrm_rows(s, call)[1][R * BATCH:(R + 1) * BATCH] for s in range(N)])


def exchange(comp, call, autograd=False):
    x, ids = dlrm_rows(R, call)
    flat = x.reshape(-1).contiguous()
    if autograd:
        leaf = flat.clone().requires_grad_(True)
        out = dist.all_to_all_single_autograd(leaf, compression=comp, ids=ids,
                                              recv_ids=received_ids(call))
        out.sum().backward()  # a constant gradient: lossless frames, never reused
        assert torch.equal(leaf.grad, torch.ones_like(flat))
        return out.detach()
    out = torch.empty_like(flat)
    dist.all_to_all_single(out, flat, compression=comp, ids=ids, recv_ids=received_ids(call))
    return out


def check(out, call):
    got = out.view(N, BATCH, K, DIM)
    for src in range(N):
        ref = dlrm_rows(src, call)[0][R * BATCH:(R + 1) * BATCH].view(BATCH, K, DIM)
        for t in range(K):
            bound = 0.0 if src == R else rel_bound(ref[:, t], EB)
            err = max_error(got[src, :, t], ref[:, t])
            assert err <= bound, f"call {call} from {src} table {t}: {err} > {bound}"


def lossy():
    return C.lossy(EB, row_len=DIM, tables=K, reuse=True)


def test_every_element_is_within_its_tables_bound_of_the_current_value_over_many_calls():
    comp = lossy()
    sent = []
    for call in range(12):
        dist.reset_comm_stats()
        check(exchange(comp, call, autograd=call % 3 == 2), call)
        sent.append(dist.comm_stats()["total"]["wire_bytes"])
    assert sent[10] < 0.7 * sent[0], sent  # held rows travel as references and residuals


def test_a_restarted_compressor_on_one_rank_raises_on_every_rank():
    comp = lossy()
    for call in range(3):
        check(exchange(comp, call), call)
    if R == N - 1:
        comp = lossy()
    try:
        exchange(comp, 3)
    except dist.RankError as e:
        assert "is not the mirror rank" in str(e), str(e)
    else:
        raise AssertionError(f"rank {R}: no RankError")
    for call in range(4, 7):
        check(exchange(comp, call), call)


if __name__ == "__main__":
    run_cases(cases_of(globals()))
