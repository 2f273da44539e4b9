"""Worker: one reusing compressor on two process sets (issue 24, the "process set" divergence).
Its caches are kept per process set, so calls on the global set and on a subset, interleaved,
each predict only from what that set's peers decoded: every received element stays within the
bound of its sender's current value. Run last in a launch (transport_process_sets says why);
run by tests/test_reuse.py."""
import torch
from transport_reuse import B, EB, T, chunk
from transport_util import N, R, cases_of, run_cases

import hvd_lossy.torch as hvd


def check_from(members, out, call):
    """out: what this rank got from `members` (in set order) at `call`, against their values now."""
    for i, s in enumerate(members):
        want = chunk(s, R, call)[0]
        got = out[i * T * B:(i + 1) * T * B]
        for t in range(T):
            w, g = want[t * B:(t + 1) * B], got[t * B:(t + 1) * B]
            eb = EB * float(w.max() - w.min())
            err = float((w.double() - g.double()).abs().max())
            assert err <= eb, f"call {call}, from rank {s}, table {t}: error {err} > {eb}"


def exchange(comp, members, call, process_set=None):
    sent = [chunk(R, d, call) for d in members]
    out = hvd.alltoall(torch.cat([x for x, _ in sent]), [T * B] * len(members), compression=comp,
                       ids=torch.cat([i for _, i in sent]),
                       recv_ids=[chunk(s, R, call)[1] for s in members], process_set=process_set)[0]
    check_from(members, out, call)


def test_a_reusing_compressor_keeps_apart_the_caches_of_its_process_sets():
    members = [0, N - 1] if N > 2 else [N - 1]  # a set equal to the global one is refused
    ps = hvd.add_process_set(members)
    comp = hvd.Compression.lossy(EB, segments=T, reuse=True)
    everyone = list(range(N))
    for call in range(10):
        exchange(comp, everyone, call)
        if R in members:
            # other calls' values for the same ids: a cache shared across the sets would
            # predict from rows these peers never decoded, and raise or miss the bound
            exchange(comp, members, 1000 + call, process_set=ps)
    hvd.remove_process_set(ps)


if __name__ == "__main__":
    run_cases(cases_of(globals()))
