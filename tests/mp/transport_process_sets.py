"""Worker: lossy collectives limited to a process set, and the ranks outside it stay in step.

Run it last in a launch: Horovod 0.28.1 names an op given no name by a per-process handle
counter, and ranks outside a set skip the set's ops, so Horovod's own unnamed ops (the
Compression.none path) would be mismatched across ranks afterwards. hvd_lossy names its ops by
a counter per process set, which the last check here relies on.
"""
from transport_util import N, R, abs_bound, assert_within, cases_of, lookups, run_cases

import hvd_lossy.torch as hvd

EB = 0.02


def test_process_set_limits_lossy_collectives_to_its_members():
    members = [0, N - 1] if N > 2 else [N - 1]  # a set equal to the global one is refused
    ps = hvd.add_process_set(members)
    if R in members:
        splits_of = {src: [1 + i, 2][:len(members)] for i, src in enumerate(members)}
        x = lookups(R, 110, sum(splits_of[R]))
        out, got = hvd.alltoall(x, splits_of[R], compression=hvd.Compression.lossy(EB), process_set=ps)
        me, offset = members.index(R), 0
        for src in members:
            start = sum(splits_of[src][:me])
            ref = lookups(src, 110, sum(splits_of[src]))[start:start + splits_of[src][me]]
            assert_within(out[offset:offset + ref.shape[0]], ref, abs_bound(ref, EB), f"set, from {src}")
            offset += ref.shape[0]
        root = members[-1]
        out = hvd.broadcast(x[:1], root, compression=hvd.Compression.lossy(EB), process_set=ps)
        ref = lookups(root, 110, sum(splits_of[root]))[:1]
        assert_within(out, ref, abs_bound(ref, EB), "broadcast in a set")
    # every rank, members or not, still pairs up its next lossy op with the others'
    x = lookups(R, 111, 2 * N)
    assert hvd.alltoall(x, compression=hvd.Compression.lossy(EB)).shape == x.shape
    hvd.remove_process_set(ps)


if __name__ == "__main__":
    run_cases(cases_of(globals()))
