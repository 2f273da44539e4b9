"""Worker (torchrun): hvd_lossy.distributed.all_to_all_single with a reusing compressor in the
reference DLRM's flattened layout (`row_len`): ids and recv_ids of shape [rows, tables]. Every
received element is within its table's bound of the sender's CURRENT value over many calls
while the tables drift; the autograd form's gradient travels summed by (table, id), as
hvd_lossy.torch's does: each id's sum within ONE bound on its first row, zeros on its repeats,
in fewer bytes than per lookup; a restarted compressor on one rank raises RankError on every
rank, and the calls after it are correct. Run by tests/test_reuse.py."""
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
        out.sum().backward()  # a constant gradient: each segment's range is 0, its sums exact
        check_grad(leaf.grad, ids, lambda d: torch.ones(BATCH, K, DIM), exact=True)
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


def check_grad(grad, ids, want_of, exact=False):
    """The gradient of this rank's flat input: for the rows sent to rank d, per table and id,
    the sum is within one bound (the table's rel bound over what rank d's gradient had for
    those rows, want_of(d) [BATCH, tables, DIM]) of the true sum, all on the id's first row, zeros
    on the others. ids: [N * BATCH, tables], the tables side by side in grad's rows."""
    k = ids.shape[1]
    g = grad.view(N, BATCH, k, DIM)
    for d in range(N):
        want_all = want_of(d)
        for t in range(k):
            key = ids[d * BATCH:(d + 1) * BATCH, t]
            unique, inverse = torch.unique(key, return_inverse=True)
            first = torch.full((len(unique),), BATCH).scatter_reduce_(
                0, inverse, torch.arange(BATCH), "amin")
            # summed as the sender sums them (float32, rows in order): the bound is on that sum
            want = torch.zeros(len(unique), DIM).index_add_(0, inverse, want_all[:, t]).double()
            got = torch.zeros(len(unique), DIM).index_add_(0, inverse, g[d, :, t]).double()
            bound = 0.0 if exact or d == R else rel_bound(want_all[:, t], EB)
            err = float((got - want).abs().max())
            assert err <= bound, f"gradient from rank {d}, table {t}: error {err} > {bound}"
            others = torch.ones(BATCH, dtype=torch.bool)
            others[first] = False
            assert not g[d, :, t][others].any(), f"rank {d}, table {t}: a repeat's row is not 0"


def upstream(rank, call):
    """The gradient rank `rank` has for its flat output at `call` (every rank rebuilds it)."""
    return torch.randn(N * BATCH * K * DIM, generator=torch.Generator().manual_seed(
        7 * rank + 1000 * call))


def test_the_gradient_travels_summed_by_table_and_id_within_one_bound_in_fewer_bytes():
    comp, per_lookup = lossy(), C.lossy(EB, row_len=DIM, tables=K)
    for call in range(3):
        x, ids = dlrm_rows(R, call)
        wire, grads = {}, {}
        for name, c in (("by id", comp), ("per lookup", per_lookup)):
            leaf = x.reshape(-1).clone().requires_grad_(True)
            kw = dict(ids=ids, recv_ids=received_ids(call)) if name == "by id" else {}
            out = dist.all_to_all_single_autograd(leaf, compression=c, **kw)
            dist.reset_comm_stats()
            out.backward(upstream(R, call))
            wire[name], grads[name] = dist.comm_stats()["total"]["wire_bytes"], leaf.grad
        # what rank d's gradient had for the rows it got from me: its output chunk from me
        check_grad(grads["by id"], ids, lambda d: upstream(d, call).view(N, BATCH, K, DIM)[R])
        if N > 1:
            assert wire["by id"] < wire["per lookup"], wire  # ~1.6 lookups an id here


def test_every_element_is_within_its_tables_bound_of_the_current_value_over_many_calls():
    comp = lossy()
    sent = []
    for call in range(12):
        dist.reset_comm_stats()
        check(exchange(comp, call, autograd=call % 3 == 2), call)
        sent.append(dist.comm_stats()["total"]["wire_bytes"])
    assert sent[10] < 0.7 * sent[0], sent  # held rows travel as references and residuals


def test_without_row_len_the_gradient_of_rows_travels_summed_by_id_too():
    """[rows, dim] tensors (table 0 of the layout above): one segment a destination."""
    comp = C.lossy(EB, reuse=True)
    for call in range(3):
        x, ids = dlrm_rows(R, call)
        leaf = x[:, :DIM].contiguous().requires_grad_(True)
        out = dist.all_to_all_single_autograd(leaf, compression=comp, ids=ids[:, 0],
                                              recv_ids=received_ids(call)[:, 0])
        out.backward(upstream(R, call)[:N * BATCH * DIM].view(N * BATCH, DIM))
        check_grad(leaf.grad, ids[:, :1], lambda d: upstream(d, call)[:N * BATCH * DIM].view(
            N, BATCH, 1, DIM)[R])


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
