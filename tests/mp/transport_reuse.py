"""Worker: hvd_lossy.torch's alltoall with a reusing compressor (issue 24 part 3). Every rank
regenerates every rank's CURRENT values, so every received element is checked against the value
its sender holds now, call after call, while the rows drift and jump under repeating Zipf ids.
Faults (a corrupted frame, a call one rank makes without ids, a restarted compressor, recv_ids
that are not the ids sent) raise RankError on every rank, never a silent wrong row, and the
calls after them are correct again. Run by tests/test_reuse.py."""
import torch
from transport_util import N, R, cases_of, run_cases

import hvd_lossy.alltoall as a2a
import hvd_lossy.torch as hvd

T, B, DIM, EB = 3, 48, 8, 0.03  # tables a chunk, rows a table and destination, row, rel bound


def values(src, table, call):
    """Rank src's table `table` as it is at call `call`: rows drift a little every call, and a
    seventh of them jump far every seventh call."""
    g = torch.Generator().manual_seed(1000 * src + table)
    base = torch.randn(64, DIM, generator=g)
    direction = torch.randn(64, DIM, generator=g)
    jumps = (torch.arange(64) % 7 == 0).float().unsqueeze(1) * (call // 7) * 0.7
    return base + 2e-3 * call * direction + jumps


def ids_of(src, dest, table, call):
    """Zipf ids of the rows src sends dest from `table` at call `call`: hot ids repeat."""
    g = torch.Generator().manual_seed(((src * 31 + dest) * 31 + table) * 100_003 + call)
    p = 1.0 / torch.arange(1, 65, dtype=torch.float64) ** 1.3
    return torch.multinomial(p, B, replacement=True, generator=g)


def chunk(src, dest, call):
    """(rows, ids) of what src sends dest: T segments of B rows, one a table."""
    ids = [ids_of(src, dest, t, call) for t in range(T)]
    return torch.cat([values(src, t, call)[i] for t, i in enumerate(ids)]), torch.cat(ids)


def inputs(call):
    """This rank's tensor, ids and recv_ids at `call`."""
    parts = [chunk(R, d, call) for d in range(N)]
    x = torch.cat([p[0] for p in parts])
    ids = torch.cat([p[1] for p in parts])
    return x, ids, [chunk(s, R, call)[1] for s in range(N)]


def exchange(comp, call, **change):
    x, ids, recv_ids = inputs(call)
    kwargs = dict(compression=comp, ids=ids, recv_ids=recv_ids)
    kwargs.update(change)
    return hvd.alltoall(x, [T * B] * N, **kwargs)[0]


def check(out, call, bounds=None):
    """Every received element within the bound of its sender's value NOW; bounds[s][t]: the
    rel bound of source s's table t (default EB)."""
    for s in range(N):
        want = chunk(s, R, call)[0]
        got = out[s * T * B:(s + 1) * T * B]
        for t in range(T):
            w, g = want[t * B:(t + 1) * B], got[t * B:(t + 1) * B]
            eb = (EB if bounds is None else bounds[s][t]) * float(w.max() - w.min())
            err = float((w.double() - g.double()).abs().max())
            assert err <= eb, f"call {call}, from rank {s}, table {t}: error {err} > {eb}"


def lossy():
    return hvd.Compression.lossy(EB, segments=T, reuse=True)


def test_every_received_element_is_within_the_bound_of_its_current_value_over_many_calls():
    comp = lossy()
    sent = []
    for call in range(30):
        hvd.reset_comm_stats()
        check(exchange(comp, call), call)
        sent.append(hvd.comm_stats()["total"]["wire_bytes"])
    if N > 1:
        # hot ids come back held: later calls send far less than the first
        assert sum(sent[20:]) < 0.6 * 10 * sent[0], sent
    plain = hvd.Compression.lossy(EB, segments=T)
    hvd.reset_comm_stats()
    check(hvd.alltoall(inputs(30)[0], [T * B] * N, compression=plain)[0], 30)
    assert hvd.comm_stats()["total"]["wire_bytes"] > sent[-1] or N == 1
    assert 0 < comp.reuse_state().nbytes() <= comp.reuse_memory


def test_without_ids_or_without_reuse_the_frames_are_todays():
    x, ids, recv_ids = inputs(0)
    plain = hvd.Compression.lossy(EB, segments=T)
    frames = {}
    real = a2a.Alltoall.launch

    def keep(self, payload):
        frames[len(frames)] = payload.clone()
        return real(self, payload)

    a2a.Alltoall.launch = keep
    try:
        a = hvd.alltoall(x, [T * B] * N, compression=plain)[0]
        b = hvd.alltoall(x, [T * B] * N, compression=plain, ids=ids)[0]
        c = hvd.alltoall(x, [T * B] * N, compression=lossy())[0]  # reuse without ids
    finally:
        a2a.Alltoall.launch = real
    assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(frames[0], frames[1])
    # the reusing compressor's settings digest differs (its cap is agreed), nothing else
    assert frames[2].numel() == frames[0].numel()


def by_id(rows, ids):
    """(sums of `rows` per id, in sorted id order; the first row of each id)."""
    unique, inverse = torch.unique(ids, return_inverse=True)
    sums = torch.zeros(len(unique), rows.shape[1], dtype=rows.dtype).index_add_(0, inverse, rows)
    first = torch.full((len(unique),), len(ids)).scatter_reduce_(0, inverse, torch.arange(len(ids)),
                                                                 "amin")
    return sums, first


def check_grad(grad, ids, want_of, exact=False):
    """The gradient of this rank's input, whose chunk for rank d holds T segments of B rows
    with `ids`: per (segment, id) its sum is within one bound of the sum of what rank d's
    gradient had for those rows (want_of(d), rows in my chunk's order), all on the id's first
    row, the id's other rows zero."""
    for d in range(N):
        for t in range(T):
            rows = slice(d * T * B + t * B, d * T * B + (t + 1) * B)
            want_rows = want_of(d)[t * B:(t + 1) * B]
            want, first = by_id(want_rows, ids[rows])
            got, _ = by_id(grad[rows], ids[rows])
            eb = 0.0 if exact or d == R else EB * float(want_rows.max() - want_rows.min())
            err = float((want.double() - got.double()).abs().max())
            assert err <= eb, f"gradient from rank {d}, table {t}: error {err} > {eb}"
            others = torch.ones(B, dtype=torch.bool)
            others[first] = False
            assert not grad[rows][others].any(), f"rank {d}, table {t}: a repeat's row is not 0"


def test_async_and_autograd_reuse_and_the_gradient_travels_summed_by_id():
    comp = lossy()
    warm(comp, range(2))
    x, ids, recv_ids = inputs(2)
    handle = hvd.alltoall_async(x, [T * B] * N, compression=comp, ids=ids, recv_ids=recv_ids)
    check(hvd.synchronize(handle)[0], 2)
    leaf = inputs(3)[0].requires_grad_(True)
    x, ids, recv_ids = inputs(3)
    out, _ = hvd.alltoall(leaf, [T * B] * N, compression=comp, ids=ids, recv_ids=recv_ids)
    check(out.detach(), 3)
    (out * 2).sum().backward()  # a constant gradient: its sums' frames are exact
    check_grad(leaf.grad, ids, lambda d: torch.full((T * B, DIM), 2.0), exact=True)
    warm(comp, range(4, 6))


def upstream(rank, call):
    """The gradient rank `rank` has for its output at `call` (every rank regenerates it)."""
    return torch.randn(N * T * B, DIM, generator=torch.Generator().manual_seed(7 * rank + 1000 * call))


def test_the_gradient_of_a_reusing_call_travels_summed_by_id_within_one_bound_in_fewer_bytes():
    """The owner's gradient per (table, id) is within ONE bound of the true sum (per lookup,
    a sum of k coded rows is within k), and the gradient frames are smaller than per lookup."""
    comp, per_lookup = lossy(), hvd.Compression.lossy(EB, segments=T)
    for call in range(4):
        x, ids, recv_ids = inputs(call)
        wire, grads = {}, {}
        for name, c in (("by id", comp), ("per lookup", per_lookup)):
            leaf = x.clone().requires_grad_(True)
            out, _ = hvd.alltoall(leaf, [T * B] * N, compression=c, ids=ids, recv_ids=recv_ids)
            hvd.reset_comm_stats()
            out.backward(upstream(R, call))
            wire[name], grads[name] = hvd.comm_stats()["total"]["wire_bytes"], leaf.grad
        # what rank d's gradient had for the rows it got from me
        check_grad(grads["by id"], ids, lambda d: upstream(d, call)[R * T * B:(R + 1) * T * B])
        if N > 1:
            assert wire["by id"] < 0.8 * wire["per lookup"], wire


def test_a_second_reusing_call_in_flight_raises_on_every_rank():
    comp = lossy()
    x, ids, recv_ids = inputs(0)
    first = hvd.alltoall_async(x, [T * B] * N, compression=comp, ids=ids, recv_ids=recv_ids)
    second = hvd.alltoall_async(x, [T * B] * N, compression=comp, ids=ids, recv_ids=recv_ids)
    check(hvd.synchronize(first)[0], 0)
    expect_all_raise(lambda: hvd.synchronize(second), "still in flight")
    warm(comp, range(1, 4))


def test_adaptive_compression_reuses_and_reports_a_reuse_rate_per_table():
    from hvd_lossy.adaptive import Controller
    from hvd_lossy.adaptive.telemetry import telemetry_record
    controller = Controller(tables={f"t{k}": 64 for k in range(T * N)}, interval=6)
    mine = controller.tables_of(R)
    assert len(mine) == T  # the tables this rank sends: T a chunk, as lossy() cuts them
    comp = hvd.Compression.adaptive(controller, tables=mine, reuse=True)
    for call in range(6):
        bounds = comp._bounds()  # the controller's, alike on every rank
        check(exchange(comp, call), call,
              [[bounds[name] for name in controller.tables_of(s)] for s in range(N)])
        controller.step()
    rates = {s.name: s.reuse_rate for s in controller.stats()}
    assert all(0 < rate <= 1 for rate in rates.values()) or N == 1, rates
    line = telemetry_record(controller)
    assert line["tables"]["t0"]["reuse_rate"] == rates["t0"]


def expect_all_raise(call, *needles):
    try:
        call()
    except hvd.RankError as e:
        missing = [n for n in needles if n not in str(e)]
        assert not missing, f"rank {R}: error lacks {missing}: {e}"
    else:
        raise AssertionError(f"rank {R}: no RankError, expected one naming {needles}")


DIVERGED = "is not the mirror rank"


def warm(comp, calls):
    for call in calls:
        check(exchange(comp, call), call)


def test_a_corrupted_frame_raises_on_every_rank_and_the_calls_after_are_correct():
    comp = lossy()
    warm(comp, range(3))
    real = a2a.Alltoall.complete

    def corrupting(self, work):
        a2a.Alltoall.complete = real
        recv, counts = real(self, work)
        recv[counts[0] + counts[1] // 2] ^= 0x10  # inside rank 1's frame to rank 0
        return recv, counts

    if R == 0:
        a2a.Alltoall.complete = corrupting
        expect_all_raise(lambda: exchange(comp, 3), "from rank 1 failed to decode")
    else:
        check(exchange(comp, 3), 3)  # rank 1 got good frames: it cannot know yet
    # the next call: every rank raises (the report, and caches that no longer match)
    expect_all_raise(lambda: exchange(comp, 4), DIVERGED)
    warm(comp, range(5, 9))  # fresh caches on every rank, correct again


def test_a_call_one_rank_makes_without_ids_raises_on_every_rank():
    comp = lossy()
    warm(comp, range(3))
    skip = dict(ids=None, recv_ids=None) if R == N - 1 else {}
    expect_all_raise(lambda: exchange(comp, 3, **skip), "reuse (ids and recv_ids on some ranks")
    warm(comp, range(4, 8))


def test_a_restarted_compressor_on_one_rank_raises_on_every_rank():
    comp = lossy()
    warm(comp, range(3))
    if R == N - 1:
        comp = lossy()  # as after a restart or a checkpoint resume on this rank only
    expect_all_raise(lambda: exchange(comp, 3), DIVERGED)
    warm(comp, range(4, 8))


def test_a_resume_on_every_rank_starts_fresh_without_an_error():
    comp = lossy()
    warm(comp, range(3))
    comp = hvd.Compression.lossy(**{k: v for k, v in lossy().get_config().items()
                                    if k not in ("id",)})  # as rebuilt from a checkpoint
    warm(comp, range(3, 6))


def test_missing_or_malformed_recv_ids_raise_on_every_rank():
    comp = lossy()
    x, ids, recv_ids = inputs(0)
    for bad, detail in ((None, "needs recv_ids"), (recv_ids[:-1], f"a list of {N - 1}"),
                        ([r.int() for r in recv_ids], "must be a 1-D int64 tensor")):
        given = bad if R == N - 1 else recv_ids
        needles = [f"rank {N - 1}"] + ([detail] if R == N - 1 else [])
        expect_all_raise(lambda: exchange(comp, 0, recv_ids=given), *needles)
    warm(comp, range(1, 3))


def test_recv_ids_that_are_not_the_ids_sent_raise_on_every_rank():
    comp = lossy()
    warm(comp, range(2))
    x, ids, recv_ids = inputs(2)
    if R == 0:
        recv_ids = [r.clone() for r in recv_ids]
        recv_ids[N - 1][5] += 1
    expect_all_raise(lambda: exchange(comp, 2, recv_ids=recv_ids), DIVERGED)
    warm(comp, range(3, 6))


if __name__ == "__main__":
    run_cases(cases_of(globals()))
