"""The model-parallel embedding exchange of hybrid-parallel DLRM.

Each rank holds a data-parallel slice of b = B/world rows of the global batch and owns some whole
tables. Per step:
  1. allgather the local sparse ids (int64, cheap), so each owner sees the ids of all B rows;
  2. the owner looks its tables up for all B rows;
  3. forward all-to-all: to destination r it sends, table-major, [its table t0's rows of r's
     slice (b x D), its table t1's rows, ...], i.e. (n_local*b, D) per destination, destinations
     in rank order; splits = [n_local*b] * world;
  4. the receiver gets from each source s that source's tables for its own slice and reorders
     them to (b, T, D) in global table order.
Autograd runs through the all-to-all, so backward sends each lookup's gradient back to its owner
with the reverse all-to-all (compressed with the compressor's backward setting). With send_ids
(--ids) the lookups' ids travel to the codec beside them, in the same order (`ids=`: duplicates
found by id rather than by hashing rows).

The table-major layout matters to the adaptive compressor: one destination's chunk is n_local
consecutive pieces of b rows, one per table, so it can pick an error bound per table.
"""

import time

import torch


class _GradClock(torch.autograd.Function):
    """Identity whose backward notes the time: placed around the all-to-all, the two clocks
    bracket the backward all-to-all (compress + communicate + decompress of the gradients)."""

    @staticmethod
    def forward(ctx, x, clock, key):
        ctx.clock, ctx.key = clock, key
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.clock[ctx.key] = time.perf_counter()
        # Horovod's alltoall backward fails on a non-contiguous gradient.
        return grad.contiguous(), None, None


class EmbeddingExchange:
    """Moves embedding lookups between owners and data-parallel consumers.

    Arguments:
        owners: owner rank of each table (sharding.place_tables).
        rank, world: this rank and the number of ranks.
        alltoall: callable(tensor, splits, ids=None) -> (output, received_splits) with
            autograd, e.g. a closure over hvd_lossy.torch.alltoall with a compressor, or
            horovod.torch.alltoall (called without ids unless send_ids).
        allgather: callable(tensor) -> tensor concatenated over ranks in rank order.
        alltoall_start: optional callable(tensor, splits, ids=None) -> wait, where wait() gives
            what alltoall gives; started before and waited for after other work (start/finish).
        send_ids: hand the alltoall the id of each row it sends (`ids=`).
        recv_ids: also hand it the ids of the rows each rank sends here (`recv_ids=`, for a
            reusing compressor): every rank has the global batch's ids (gather_ids).
    """

    def __init__(self, owners, rank, world, alltoall, allgather, alltoall_start=None,
                 send_ids=False, recv_ids=False):
        self.send_ids, self.recv_ids = send_ids or recv_ids, recv_ids
        self.owners, self.rank, self.world = list(owners), rank, world
        self.alltoall, self.allgather = alltoall, allgather
        self.alltoall_start = alltoall_start or self._start_now
        self.by_source = [[t for t, r in enumerate(owners) if r == s] for s in range(world)]
        self.local = self.by_source[rank]
        recv_order = [t for tables in self.by_source for t in tables]
        # Position in the received (source-major) order of each global table.
        self.restore = torch.tensor([recv_order.index(t) for t in range(len(owners))])
        self.clock = {}

    def _start_now(self, tensor, splits, **ids):
        """Default alltoall_start: the synchronous alltoall, its result handed out by wait()."""
        result = self.alltoall(tensor, splits, **ids)
        return lambda: result

    def gather_ids(self, local_ids):
        """(b, T) local ids -> (B, T) ids of the global batch, rank slices in rank order."""
        return self.allgather(local_ids)

    def exchange(self, lookups, b, ids=None):
        """Forward all-to-all of the owned tables' lookups.

        Arguments:
            lookups: (n_local, B, D) lookups of the owned tables for the global batch.
            b: rows per rank (B / world).
            ids: (B, T) ids of the global batch (gather_ids), whose owned tables' columns the
                lookups are; sent beside them with send_ids, else unused.
        Returns:
            (b, T, D) lookups of all tables for this rank's slice, global table order.
        """
        return self.finish(self.start(lookups, b, ids))

    def start(self, lookups, b, ids=None):
        """exchange() in two halves, to overlap the all-to-all with other work (the bottom
        MLP): start() sends, finish(pending) waits and returns what exchange() returns."""
        n_local, big_b, dim = lookups.shape
        if big_b != b * self.world:
            raise ValueError("lookups cover %d rows, expected b*world = %d*%d" % (big_b, b, self.world))
        # (n_local, world, b, D) -> (world, n_local, b, D): destination-major, table-major within.
        send = lookups.reshape(n_local, self.world, b, dim).transpose(0, 1).reshape(-1, dim)
        send = _GradClock.apply(send, self.clock, "bwd_end")
        splits = torch.tensor([n_local * b] * self.world, dtype=torch.int32)
        keys = {}
        if self.send_ids and ids is not None:  # the same order as the rows: (B, n_local) -> send's
            owned = ids[:, self.local].t().reshape(n_local, self.world, b)
            keys["ids"] = owned.transpose(0, 1).reshape(-1)
        if self.recv_ids and ids is not None:  # source s sends its tables' rows of my slice
            mine = ids[self.rank * b:(self.rank + 1) * b]
            keys["recv_ids"] = [mine[:, tables].t().reshape(-1) for tables in self.by_source]
        t0 = time.perf_counter()
        wait = self.alltoall_start(send, splits, **keys)
        self.clock["fwd_s"] = time.perf_counter() - t0
        return wait, b, dim

    def finish(self, pending):
        wait, b, dim = pending
        t0 = time.perf_counter()
        recv, _ = wait()
        self.clock["fwd_s"] += time.perf_counter() - t0
        recv = _GradClock.apply(recv, self.clock, "bwd_start")
        parts = torch.split(recv, [len(tables) * b for tables in self.by_source])
        stacked = torch.cat([p.reshape(-1, b, dim) for p in parts])  # (T, b, D), source-major
        if self.restore.device != stacked.device:  # once: the order moves to the lookups' device
            self.restore = self.restore.to(stacked.device)
        return stacked.index_select(0, self.restore).transpose(0, 1)

    def backward_seconds(self):
        """Seconds the last backward all-to-all took (0 before the first backward)."""
        if "bwd_start" in self.clock and "bwd_end" in self.clock:
            return max(self.clock["bwd_end"] - self.clock["bwd_start"], 0.0)
        return 0.0
