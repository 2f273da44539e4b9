"""Per-call and cumulative statistics of the collectives in hvd_lossy.torch.

Every alltoall, allgather and broadcast that goes through hvd_lossy.torch records one `CallStats`
on the calling rank: what that rank sent and received, and where its time went. Users read
them with `comm_stats()` to log compression ratios next to training metrics.

Units: bytes and seconds. "raw" is the size of the uncompressed tensor data, "wire" the size of
what Horovod moved for it (frames, or the fp16 tensor, or the tensor itself). The protocol's
fields that keep ranks in step (in each frame's header, and broadcast's header round) are
counted in `meta_bytes`, not in `wire_bytes`, so that `ratio` describes the codec alone.
"""

import dataclasses
import threading

_lock = threading.Lock()


@dataclasses.dataclass
class CallStats:
    """What one collective call cost on this rank.

    Fields:
        op: "alltoall", "allgather" or "broadcast".
        compression: repr of the compressor used.
        raw_bytes: uncompressed bytes this rank sent to other ranks (for alltoall its input
                   less the chunk it keeps, for broadcast the root's tensor on the root, 0
                   elsewhere).
        local_bytes: bytes of the chunk an alltoall sends to its own rank: copied, never
                   coded or put on a link.
        wire_bytes: bytes this rank handed to Horovod for the payload.
        recv_raw_bytes: uncompressed bytes of what this rank received.
        recv_wire_bytes: payload bytes this rank received.
        meta_bytes: bytes of the protocol's fields this rank sent (hvd_lossy.chunk_header).
        error_bounds: the bound of every frame this rank compressed (the parameter, in the
                      compressor's mode); empty without lossy compression.
        compress_s: seconds spent compressing.
        comm_s: seconds spent in Horovod collectives (headers and payload).
        decompress_s: seconds spent decoding received frames.
    """
    op: str = ""
    compression: str = ""
    raw_bytes: int = 0
    local_bytes: int = 0
    wire_bytes: int = 0
    recv_raw_bytes: int = 0
    recv_wire_bytes: int = 0
    meta_bytes: int = 0
    error_bounds: list = dataclasses.field(default_factory=list)
    compress_s: float = 0.0
    comm_s: float = 0.0
    decompress_s: float = 0.0

    @property
    def ratio(self):
        """raw_bytes / wire_bytes of what this rank sent; 1.0 when it sent nothing."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else 1.0

    def as_dict(self):
        d = dataclasses.asdict(self)
        d["ratio"] = self.ratio
        return d


_NUMERIC = ("raw_bytes", "local_bytes", "wire_bytes", "recv_raw_bytes", "recv_wire_bytes", "meta_bytes",
            "compress_s", "comm_s", "decompress_s")


class _Totals:
    def __init__(self):
        self.calls = 0
        self.sums = dict.fromkeys(_NUMERIC, 0)
        self.last = None

    def add(self, call):
        self.calls += 1
        for key in _NUMERIC:
            self.sums[key] += getattr(call, key)
        self.last = call


_totals = _Totals()


def record(call):
    """Adds one finished call to the totals (called by the collectives)."""
    with _lock:
        _totals.add(call)


def comm_stats():
    """Statistics of this rank's collectives since the last `reset_comm_stats()`.

    Returns:
        A dict with
          "total": {"calls", "raw_bytes", "wire_bytes", "recv_raw_bytes", "recv_wire_bytes",
                    "meta_bytes", "compress_s", "comm_s", "decompress_s", "ratio"}, sums over
                   all calls (ratio = total raw_bytes / total wire_bytes);
          "last": the most recent call as `CallStats.as_dict()` (which adds "ratio"), or None.
        Plain Python numbers, so it can go straight to json.dumps or a logger.
    """
    with _lock:
        total = dict(_totals.sums, calls=_totals.calls)
        total["ratio"] = total["raw_bytes"] / total["wire_bytes"] if total["wire_bytes"] else 1.0
        last = _totals.last.as_dict() if _totals.last is not None else None
    return {"total": total, "last": last}


def reset_comm_stats():
    """Forgets all recorded calls on this rank."""
    global _totals
    with _lock:
        _totals = _Totals()
