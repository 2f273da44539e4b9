"""hvd_lossy.distributed.all_to_all_single under torchrun (gloo): torch.distributed's semantics,
every received element within its frame's bound, errors on every rank."""
import torch

from dist_util import N, R, dist, lookups, max_error, rel_bound, uneven_splits

C = dist.Compression


def _inputs(case, dim=4, dtype=torch.float32):
    """(input, input splits, output splits, the pieces each source sends here)."""
    splits = uneven_splits(R, case, N)
    x = lookups(R, case, sum(splits), dim, dtype)
    received = []
    for src in range(N):
        s = uneven_splits(src, case, N)
        xs = lookups(src, case, sum(s), dim, dtype)
        received.append(xs[sum(s[:R]):sum(s[:R + 1])])
    return x, splits, [p.shape[0] for p in received], received


def test_none_is_bit_identical_to_torch_all_to_all_single():
    for case, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        x, splits, out_splits, _ = _inputs(case, dtype=dtype)
        ours = torch.full((sum(out_splits), 4), float("nan"), dtype=dtype)
        theirs = torch.empty_like(ours)
        assert dist.all_to_all_single(ours, x, out_splits, splits) is None
        torch.distributed.all_to_all_single(theirs, x, out_splits, splits)
        assert torch.equal(ours, theirs), (dtype, ours, theirs)
        work = dist.all_to_all_single(ours.zero_(), x, out_splits, splits, async_op=True,
                                      compression=C.none)
        assert work.wait() and torch.equal(ours, theirs)


def test_lossy_fills_output_in_place_within_each_frames_bound():
    for case, dtype in ((3, torch.float32), (4, torch.float16), (5, torch.bfloat16)):
        x, splits, out_splits, received = _inputs(case, dtype=dtype)
        out = torch.full((sum(out_splits), 4), float("nan"), dtype=dtype)
        ptr = out.data_ptr()
        dist.all_to_all_single(out, x, out_splits, splits, compression=C.lossy(0.05))
        assert out.data_ptr() == ptr and out.dtype == dtype
        at = 0
        for src, piece in enumerate(received):
            got = out[at:at + piece.shape[0]]
            bound = rel_bound(piece, 0.05) if src != R else 0.0  # own chunk: copied
            assert max_error(got, piece) <= bound, (src, dtype, max_error(got, piece), bound)
            at += piece.shape[0]


def test_lossy_1d_even_splits_async_returns_work_completed_by_wait():
    x = lookups(R, 6, 8 * N, dim=1).view(-1)
    out = torch.empty(8 * N)
    work = dist.all_to_all_single(out, x, async_op=True, compression=C.lossy(0.01, mode="abs"))
    assert work.wait() is True and work.is_completed()
    for src in range(N):
        ref = lookups(src, 6, 8 * N, dim=1).view(-1)[8 * R:8 * R + 8]
        assert max_error(out[8 * src:8 * src + 8], ref) <= (0.0 if src == R else 0.01)


def test_fp16_and_auto_deliver_within_their_tolerance():
    x, splits, out_splits, received = _inputs(7)
    ref = torch.cat(received)
    out = torch.empty_like(ref)
    dist.all_to_all_single(out, x, out_splits, splits, compression=C.fp16)
    assert max_error(out, ref) <= 1e-3
    auto = C.lossy(0.02, auto=True)
    for _ in range(12):  # through the probing: lossy and plain calls alternate
        out.fill_(float("nan"))
        dist.all_to_all_single(out, x, out_splits, splits, compression=auto)
        at = 0
        for src, piece in enumerate(received):
            assert max_error(out[at:at + len(piece)], piece) <= rel_bound(piece, 0.02)
            at += len(piece)
    (report,) = [r for r in dist.comm_stats()["auto"] if r["compressor"] == repr(auto)]
    assert report["lossy_calls"] + report["plain_calls"] == 12 and report["plain_calls"] > 0


def test_bad_splits_on_one_rank_raise_rank_error_on_every_rank():
    x, splits, out_splits, _ = _inputs(8)
    out = torch.empty((sum(out_splits), 4))
    bad = splits[:-1] if R == N - 1 else splits  # the last rank gives too few splits
    try:
        dist.all_to_all_single(out, x, out_splits, bad, compression=C.lossy(0.05))
    except dist.RankError as e:
        assert f"rank {N - 1}" in str(e) and f"{N - 1} splits for {N} ranks" in str(e), e
        assert e.ranks == [N - 1]
    else:
        raise AssertionError("no RankError")
    test_lossy_fills_output_in_place_within_each_frames_bound()  # still in step


def test_a_wrong_output_on_one_rank_raises_on_every_rank():
    x, splits, out_splits, _ = _inputs(9)
    out = torch.empty((sum(out_splits), 4), dtype=torch.float64 if R == 0 else torch.float32)
    try:
        dist.all_to_all_single(out, x, out_splits, splits, compression=C.lossy(0.05))
    except dist.RankError as e:
        assert "rank 0" in str(e) and e.ranks == [0], e
    else:
        raise AssertionError("no RankError")


def test_output_splits_disagreeing_with_the_senders_raise_here_and_on_the_peers_next_call():
    x, splits, out_splits, _ = _inputs(10)
    wrong = list(out_splits)
    if R == 0:  # rank 0 expects its rows from rank 1 in a different cut
        wrong[1], wrong[0] = wrong[1] + 1, wrong[0] - 1
    assert wrong[0] >= 0  # case 10 sends rank 0 four rows from itself
    out = torch.empty((sum(out_splits), 4))
    c = C.lossy(0.05)
    raised = False
    try:
        dist.all_to_all_single(out, x, wrong, splits, compression=c)
    except dist.RankError as e:
        raised = True
        assert R == 0 and "output_split_sizes" in str(e), e
    assert raised == (R == 0)
    try:
        dist.all_to_all_single(out, x, out_splits, splits, compression=c)
        assert R == 0, "the peers did not raise with their next call"
    except dist.RankError as e:
        assert R != 0 and "rank 0" in str(e), e
    dist.all_to_all_single(out, x, out_splits, splits, compression=c)  # in step again


def test_autograd_gradient_returns_with_reversed_splits_compressed_by_backward():
    x, splits, out_splits, received = _inputs(11)
    x.requires_grad_(True)
    c = C.lossy(0.05, backward=0.01)
    out = dist.all_to_all_single_autograd(x, out_splits, splits, compression=c)
    weights = torch.arange(out.numel(), dtype=torch.float32).view(out.shape) / out.numel()
    (out * weights).sum().backward()
    # The gradient of rank R's input rows for dest d are d's weights for R's chunk.
    at = 0
    for dest in range(N):
        rows_from = [uneven_splits(src, 11, N)[dest] for src in range(N)]
        start, n = sum(rows_from[:R]), splits[dest]
        wd = (torch.arange(sum(rows_from) * 4, dtype=torch.float32).view(-1, 4)
              / (sum(rows_from) * 4))[start:start + n]
        bound = 0.0 if dest == R else rel_bound(wd, 0.01)
        assert max_error(x.grad[at:at + n], wd) <= bound, (dest, max_error(x.grad[at:at + n], wd))
        at += n
    x.grad = None
    work = dist.all_to_all_single_autograd(x, out_splits, splits, async_op=True,
                                           compression=C.none)
    out = work.wait()
    assert torch.equal(out, torch.cat(received))
    (out * weights).sum().backward()
    plain = x.detach().clone().requires_grad_(True)
    ref_out = torch.empty_like(out)
    torch.distributed.all_to_all_single(ref_out, plain.detach(), out_splits, splits)
    grad_ref = torch.empty_like(x)
    torch.distributed.all_to_all_single(grad_ref, weights, splits, out_splits)
    assert torch.equal(x.grad, grad_ref)


def test_autograd_lossy_output_and_gradient_reuse_the_codec_output_cache():
    # Decoding into fresh memory pays a page fault a page (about as much as the decoding), so
    # the autograd form's lossy tensors come from the codec's cache, as hvd_lossy.torch's do;
    # once freed, the next call's output and gradient take the same blocks back.
    x, splits, out_splits, _ = _inputs(12, dim=256)
    c = C.lossy(0.05, backward=0.01)
    seen = []
    for _call in range(2):
        leaf = x.clone().requires_grad_(True)
        out = dist.all_to_all_single_autograd(leaf, out_splits, splits, compression=c)
        out.backward(torch.ones_like(out))
        seen.append({out.data_ptr(), leaf.grad.data_ptr()})
        del out, leaf
    assert seen[1] == seen[0], seen
    plain = dist.all_to_all_single_autograd(x, out_splits, splits)  # torch's own allocation
    assert plain.data_ptr() not in seen[0]


def _dlrm_layout(case, tables_of, dim, batch):
    """Rank src's flattened lookups: [N * batch, tables_of(src) x dim], table t scaled by
    10 ** t, so one bound for the whole chunk would swamp the narrow tables."""
    def of(src):
        cols = [lookups(src, case * 10 + t, N * batch, dim, scale=10.0 ** t)
                for t in range(tables_of(src))]
        return torch.cat(cols, dim=1)  # [global batch, k * dim], tables side by side
    return of


def test_row_len_layout_keeps_each_tables_bound_and_its_gradient_returns_per_table():
    dim, batch = 4, 6
    tables_of = lambda r: r + 1  # noqa: E731  (rank r owns r + 1 tables)
    of = _dlrm_layout(12, tables_of, dim, batch)
    mine = of(R)
    k = tables_of(R)
    flat = mine.reshape(-1).clone().requires_grad_(True)
    in_splits = [batch * k * dim] * N
    out_splits = [batch * tables_of(s) * dim for s in range(N)]
    c = C.lossy(0.01, row_len=dim, tables=k, backward=0.001)
    out = dist.all_to_all_single_autograd(flat, out_splits, in_splits, compression=c)
    at = 0
    for src in range(N):
        ks = tables_of(src)
        got = out[at:at + batch * ks * dim].view(batch, ks, dim)
        ref = of(src)[R * batch:(R + 1) * batch].view(batch, ks, dim)
        for t in range(ks):  # each table within its own range's bound
            bound = 0.0 if src == R else rel_bound(ref[:, t], 0.01)
            assert max_error(got[:, t], ref[:, t]) <= bound, (src, t, max_error(got[:, t], ref[:, t]))
        at += batch * ks * dim
    grad_out = torch.cat([of(s)[R * batch:(R + 1) * batch].reshape(-1) for s in range(N)]) * 0.5
    out.backward(grad_out)
    got = flat.grad.view(N, batch, k, dim)
    ref = (mine * 0.5).view(N, batch, k, dim)  # what every dest sends back is our own rows * 0.5
    for d in range(N):
        for t in range(k):
            bound = 0.0 if d == R else rel_bound(ref[d, :, t], 0.001)
            assert max_error(got[d, :, t], ref[d, :, t]) <= bound, (d, t)


def test_row_len_layout_dedups_within_each_table():
    dim, batch, k = 8, 64, 2
    # Table 0: one row, repeated, of wide values; table 1: all rows distinct, of values the
    # absolute bound leaves few bits. Whole rows never repeat; table 0's rows alone do.
    repeated = (lookups(R, 13, 1, dim) * 1000).expand(N * batch, dim)
    distinct = torch.rand((N * batch, dim), generator=torch.Generator().manual_seed(R))
    flat = torch.cat([repeated, distinct], dim=1).reshape(-1).contiguous()
    out = torch.empty_like(flat)
    dist.all_to_all_single(out, flat, compression=C.lossy(0.5, "abs", row_len=dim, tables=k))
    per_table = dist.comm_stats()["last"]["wire_bytes"]
    got = out.view(N, batch, k, dim)
    for src in range(N):
        ref = (lookups(src, 13, 1, dim) * 1000).expand(batch, dim)
        assert max_error(got[src, :, 0], ref) <= (0.0 if src == R else 0.5)
    dist.all_to_all_single(out, flat, compression=C.lossy(0.5, "abs", row_len=dim * k))
    whole_rows = dist.comm_stats()["last"]["wire_bytes"]
    dist.all_to_all_single(out, flat, compression=C.lossy(0.5, "abs", row_len=dim, tables=k,
                                                          dedup=False))
    no_dedup = dist.comm_stats()["last"]["wire_bytes"]
    assert 2 * per_table < min(whole_rows, no_dedup), (per_table, whole_rows, no_dedup)


def test_the_rows_alltoall_refuses_a_row_len_compressor_on_every_rank():
    from hvd_lossy import alltoall
    from hvd_lossy.backend import TorchBackend
    x, splits, _, _ = _inputs(15)
    try:
        alltoall.start(x, splits, None, C.lossy(0.01, row_len=4), TorchBackend()).wait()
    except dist.RankError as e:
        assert "row_len" in str(e) and f"rank {R}" in str(e), e
    else:
        raise AssertionError("no RankError")
