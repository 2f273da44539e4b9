"""LossyCompressor, the compressor of the non-reducing collectives, and the registry that
rebuilds compressors from their configs.

A `LossyCompressor` compresses into self-describing byte frames. Its payload is bytes, and bytes
cannot be summed, so it serves alltoall, allgather and broadcast, never allreduce or
reducescatter (those raise ValueError when handed one); DistributedOptimizer takes one and
reduces the gradients by allgather (hvd_lossy.optimizer).

Compressors are rebuilt from `get_config()` by `compressor_from_config`, which finds the class by
the config's "id" in a registry, as numcodecs does: a subclass registers itself
(`register_codec`), so this module knows none of them (hvd_lossy.adaptive's registers when it
is imported; hvd_lossy.compression, the user's `Compression` namespace, imports it).
"""
import json
import numbers

try:
    from horovod.torch.compression import Compressor, FP16Compressor, NoneCompressor
except ImportError:  # no Horovod: torch.distributed users, one process (_base_compressors.py)
    from hvd_lossy._base_compressors import Compressor, FP16Compressor, NoneCompressor

import hvd_lossy
from hvd_lossy import check_error_bound
from hvd_lossy.reuse import DEFAULT_MEMORY_BYTES, ReuseState

_MODES = ("rel", "abs")
_LEVELS = (1, 2)
SAME = "same"  # backward=SAME: gradients travel with the forward compressor's settings
BACKWARD = "backward"  # dither=BACKWARD: dither the gradient frames only


def is_lossy(compression):
    """True for compressors whose payload is a byte frame (instances or subclasses of
    LossyCompressor); such payloads cannot be reduced."""
    if isinstance(compression, type):
        return issubclass(compression, LossyCompressor)
    return isinstance(compression, LossyCompressor)


def dither_seed_range(used, rank, size, frames):
    """(first seed, seeds used after) for `frames` dithered frames of global rank `rank` of
    `size`, which has taken `used` seeds of its block [rank * B, (rank + 1) * B), B = 2^24 //
    size, so far; the block starts over when the frames do not fit in what is left."""
    if not 0 <= rank < max(size, 1):
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    block = hvd_lossy.DITHER_SEEDS // max(size, 1)
    if used + frames > block:
        used = 0
    return rank * block + used, used + frames


def _check_segments(segments, name):
    """segments as stored: an int >= 1, or a list of ints >= 0 (one per destination)."""
    if isinstance(segments, numbers.Integral) and not isinstance(segments, bool):
        if segments < 1:
            raise ValueError(f"{name} must be >= 1, got {segments!r}")
        return int(segments)
    if isinstance(segments, (list, tuple)) and all(
            isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 0 for k in segments):
        return [int(k) for k in segments]
    raise ValueError(f"{name} must be an int >= 1 or a list of ints >= 0 (one per destination), "
                     f"got {segments!r}")


def _check_reuse(reuse, memory, dither, auto):
    if not isinstance(reuse, bool):
        raise TypeError(f"reuse must be True or False, got {reuse!r}")
    if isinstance(memory, bool) or not isinstance(memory, numbers.Integral) or memory < 1:
        raise ValueError(f"reuse_memory must be an int >= 1 (bytes), got {memory!r}")
    if reuse and dither is True:
        raise ValueError("reuse=True needs undithered lookups (dither False or 'backward'), got "
                         "dither=True: dithered residuals never code to zero")
    if reuse and auto:
        raise ValueError("reuse=True and auto=True cannot be combined: a plain call in between "
                         "would leave what the receiver holds unknown to the sender")
    return reuse, int(memory)


def _check_dither_setting(dither):
    if not (isinstance(dither, bool) or (isinstance(dither, str) and dither == BACKWARD)):
        raise ValueError(f"dither must be False, True or 'backward', got {dither!r}")
    return dither


def _normalise_backward(backward):
    """backward as stored: SAME, None, a float bound, FP16Compressor or a LossyCompressor."""
    if isinstance(backward, str):
        if backward in (SAME, "fp16"):
            return SAME if backward == SAME else FP16Compressor
    elif backward is None or backward is NoneCompressor:
        return None
    elif backward is FP16Compressor or isinstance(backward, LossyCompressor):
        return backward
    elif isinstance(backward, dict):
        return compressor_from_config(backward)
    elif isinstance(backward, numbers.Real) and not isinstance(backward, bool):
        return check_error_bound(backward)
    raise ValueError(f"backward must be 'same', None, an error bound, Compression.fp16 or a "
                     f"LossyCompressor, got {backward!r}")


class LossyCompressor(Compressor):
    """Error-bounded lossy compression of a tensor into one byte frame per piece.

    The payload is a 1-D torch.uint8 tensor of self-describing frames (dtype, shape and bound
    live in each frame's header). Bytes cannot be summed: use it with alltoall, allgather and
    broadcast, not allreduce.

    An alltoall asks `plan(splits)` how to cut the tensor into frames, compresses all of them in
    one native call, then calls `after_compress`. Subclasses (the adaptive controller) override
    these two to pick a bound per frame and to learn from the sizes achieved. One compressor may
    serve several exchanges in flight (alltoall_async): nothing passes from `plan` to
    `after_compress` except the plan itself, which subclasses must keep so.

    The class's own defaults are the plain codec (gradients as the lookups, no dither), so a
    config means what it says; Compression.lossy's defaults are the training recipe.

    Arguments:
        error_bound: mode "rel": fraction of each frame's finite value range (max - min);
                     mode "abs": absolute bound in the tensor's units. 0 is lossless.
        mode: "rel" or "abs".
        level: 1 (bit packing, fastest) or 2 (adds an entropy coder).
        backward: how the gradient travels back in the autograd all-to-all: "same" (this
                  compressor), None (uncompressed), an error bound (this compressor's settings
                  with that bound), Compression.fp16, or another LossyCompressor.
        dedup: store identical rows of a frame once.
        segments: frames per destination chunk, cut in equal parts: an int for every
                  destination, or a list with one int per destination. A relative bound applies
                  to each frame's own range, so when a chunk holds several embedding tables back
                  to back, segments=<tables in the chunk> keeps a table with wide values from
                  setting the error of a table with narrow ones.
        backward_segments: the same for the gradient all-to-all (whose chunk for rank r holds
                  rank r's tables); defaults to `segments`.
        row_len: None, or the embedding dim of hvd_lossy.distributed's flattened layout: a 1-D
                  input whose chunk for each destination is `[rows, tables x row_len]` (the
                  tables' lookups side by side, split sizes in elements, as the reference
                  DLRM code has them). Each table's rows then become one frame of their own
                  (own bound, own dedup). hvd_lossy.torch's alltoall refuses it (pass
                  `[rows, dim]` tensors and `segments` there).
        tables: the number of tables side by side in a row_len chunk: another name for
                  `segments` (give one of the two), an int or one per destination.
        dither: False; True (every frame); or "backward" (only the gradient frames of the
                  autograd all-to-all, which an error bound or "same" `backward` then builds
                  dithered). Subtractive dither keeps the bound but makes the error uniform and
                  independent of the value: small values are kept on average instead of all
                  rounding to 0, which is what gradients need. Dithered frames skip dedup.
        auto: compress an alltoall only where it pays. The first calls alternate compressed
                  and plain (Horovod's own) alltoalls and time each to this compressor's next
                  call; the ranks agree, from the slowest rank's times, on the faster one per
                  message size, and re-check it as calls go on (hvd_lossy.auto). comm_stats()["auto"] reports the decisions.
                  Plain calls are Horovod's own alltoall, with Horovod's own argument checks.
                  The gradient compressor of the autograd alltoall decides on its own.
        reuse: send what a destination already holds as a reference and what drifted as a
                  residual, across calls (hvd_lossy.reuse, hvd_lossy.reuse_exchange). Applies to
                  alltoall calls given `ids` (the keys of the rows sent) and `recv_ids` (those
                  of the rows received, one tensor a source); other calls, and the gradients,
                  are coded as without it. Every element still decodes within the bound of its
                  CURRENT value: the bound is then also a bound on staleness (the row may be
                  an older copy the receiver held). Needs dither off for the lookups, auto off.
                  The autograd all-to-alls' gradients (hvd_lossy.torch's and
                  hvd_lossy.distributed's) then travel summed by (segment, id), one
                  row an id, each sum within the absolute bound its rows get (hvd_lossy.
                  grad_ids); the gradient of the input holds each id's sum on its first row
                  and zeros on its other rows, which an embedding's backward sums the same.
        reuse_memory: the most bytes a rank's reuse caches take, for this compressor (default
                  256 MiB): half for the mirrors of what peers hold, half for its own caches.
    """
    codec_id = "lossy"
    # As the gradient compressor of a reusing call: whether the gradients may travel summed by
    # (segment, id) (hvd_lossy.grad_ids), in frames this compressor's plan does not cut.
    sums_gradients_by_id = True

    def __init__(self, error_bound, mode="rel", level=1, backward=SAME, dedup=True, segments=1,
                 backward_segments=None, dither=False, auto=False, row_len=None, tables=None,
                 reuse=False, reuse_memory=DEFAULT_MEMORY_BYTES):
        self.error_bound = check_error_bound(error_bound)
        if mode not in _MODES:
            raise ValueError(f"mode must be 'rel' or 'abs', got {mode!r}")
        if level not in _LEVELS or isinstance(level, bool):
            raise ValueError(f"level must be 1 or 2, got {level!r}")
        if not isinstance(dedup, bool):
            raise TypeError(f"dedup must be True or False, got {dedup!r}")
        self.mode, self.level, self.dedup = mode, int(level), dedup
        if tables is not None:
            if segments != 1:
                raise ValueError(f"tables and segments name the same setting: give one, got "
                                 f"tables={tables!r} and segments={segments!r}")
            segments = tables
        if row_len is not None and (isinstance(row_len, bool) or not isinstance(
                row_len, numbers.Integral) or row_len < 1):
            raise ValueError(f"row_len must be None or an int >= 1, got {row_len!r}")
        self.row_len = None if row_len is None else int(row_len)
        self.segments = _check_segments(segments, "segments")
        self.backward_segments = (None if backward_segments is None
                                  else _check_segments(backward_segments, "backward_segments"))
        self.backward = _normalise_backward(backward)
        self.dither = _check_dither_setting(dither)
        self._backward_compressor = None
        self._dither_used = 0  # seeds taken from this rank's block (next_dither_seed)
        if not isinstance(auto, bool):
            raise TypeError(f"auto must be True or False, got {auto!r}")
        self.auto = auto
        self._auto_slots = {}  # process set id -> hvd_lossy.auto's state of this compressor
        self.reuse, self.reuse_memory = _check_reuse(reuse, reuse_memory, self.dither, auto)
        self._reuse_state = None

    def reuse_state(self):
        """This compressor's reuse caches on this rank (hvd_lossy.reuse.ReuseState)."""
        if self._reuse_state is None:
            self._reuse_state = ReuseState(self.reuse_memory)
        return self._reuse_state

    def next_dither_seed(self, rank=0, size=1, frames=1):
        """Dither seed of the first of the next `frames` frames this compressor compresses
        (frame i uses seed + i), or None when this compressor's own frames are not dithered.

        Seeds are 24 bits (they travel in the frame header), so they must repeat eventually;
        this scheme makes that as late as it can be: on global rank `rank` of `size` the
        compressor takes its seeds in order from the rank's own block of 2^24 // size, and
        starts the block over when a call's frames do not fit in what is left. No two frames
        of this compressor share a seed, on any rank, until a rank has dithered 2^24 // size
        frames (8 ranks sending 208 frames a call: the first 10,082 calls). The count is the
        compressor's own, not the process's, so a run that builds its compressors afresh and
        makes the same calls repeats exactly, whatever ran before it in the process."""
        if self.dither is not True:
            return None
        seed, self._dither_used = dither_seed_range(self._dither_used, rank, size, frames)
        return seed

    def plan(self, splits):
        """How to cut a tensor whose dim 0 goes `splits[d]` rows to rank d into frames.

        Returns:
            list of (destination, rows, error_bound), one per frame, in tensor order
            (destinations non-decreasing, rows per destination summing to splits[d]). The
            default is one frame per destination (also for 0 rows) with self.error_bound.
        """
        plan = []
        for dest, rows in enumerate(splits):
            parts = self.segments if isinstance(self.segments, int) else (
                self.segments[dest] if dest < len(self.segments) else -1)
            if parts < 0:
                raise ValueError(f"segments lists {len(self.segments)} destinations, the "
                                 f"all-to-all has {len(splits)}")
            rows = int(rows)
            if parts == 0 or rows == 0:
                if rows:
                    raise ValueError(f"chunk for rank {dest} has {rows} rows but 0 segments")
                plan.append((dest, 0, self.error_bound))
                continue
            if rows % parts:
                raise ValueError(f"chunk for rank {dest} has {rows} rows, not divisible into "
                                 f"{parts} equal segments")
            plan.extend((dest, rows // parts, self.error_bound) for _ in range(parts))
        return plan

    def wants_codec_stats(self):
        """Whether this call's `after_compress` wants `codec_stats`: what the codec learnt of
        each frame while coding it (no extra pass over the tensor). Asked once a call."""
        return False

    def after_compress(self, plan, frame_sizes, tensor):
        """Hook called once the frames of `tensor`, cut by `plan`, are on their way: frame i took
        `frame_sizes[i]` bytes, or None for the frames of the chunk an alltoall sends to its own
        rank, which is copied rather than coded. It runs after the launch, off the critical
        path; an exception here raises RankError from the call's synchronize.

        When `wants_codec_stats()` said so and the codec ran on the CPU, it is called with
        `codec_stats=`: one entry a frame, None where `frame_sizes` has None, else a row of
        floats indexed by hvd_lossy.STAT_MIN, STAT_MAX (the frame's finite value range) and
        STAT_UNIQUE (its distinct rows), NaN where the codec did not compute it."""

    def after_reuse(self, plan, shares):
        """Hook called after `after_compress` in a reusing call: shares[i] is (rows,
        references, residuals) of plan frame i, None for the own chunk, which is not sent."""

    def for_backward(self):
        """The compressor of the gradient all-to-all (which runs with the splits reversed)."""
        if self.backward is None:
            return NoneCompressor
        segments = self.segments if self.backward_segments is None else self.backward_segments
        if self.backward == SAME and segments == self.segments and self.dither != BACKWARD:
            return self
        if self.backward == SAME or isinstance(self.backward, float):
            if self._backward_compressor is None:
                bound = self.error_bound if self.backward == SAME else self.backward
                self._backward_compressor = LossyCompressor(
                    bound, mode=self.mode, level=self.level, dedup=self.dedup, segments=segments,
                    dither=bool(self.dither), auto=self.auto, row_len=self.row_len)
            return self._backward_compressor
        return self.backward

    def agreement(self):
        """What every rank of a collective must share about this compressor (it travels as a
        digest in the protocol headers; ranks that differ raise RankError)."""
        agreed = {"type": type(self).__name__, "error_bound": self.error_bound, "mode": self.mode,
                  "level": self.level, "dedup": self.dedup, "dither": self.dither,
                  "auto": self.auto, "row_len": self.row_len}
        if self.reuse:  # only then: without reuse the header bytes are today's
            agreed["reuse_memory"] = self.reuse_memory
        return agreed

    def compress(self, tensor):
        """Compresses the whole tensor into one frame.

        Returns:
            (frame, ctx): frame a 1-D torch.uint8 tensor, ctx the input dtype.
        """
        frame = hvd_lossy.compress(tensor, self.error_bound, mode=self.mode, level=self.level,
                                   dedup=self.dedup, dither=self.next_dither_seed(*_world()))
        return frame, tensor.dtype

    def decompress(self, frame, ctx):
        """Decodes a frame made by compress(); ctx (the expected dtype) may be None."""
        tensor = hvd_lossy.decompress(frame)
        if ctx is not None and tensor.dtype != ctx:
            raise hvd_lossy.FrameError(f"frame holds {tensor.dtype}, expected {ctx}")
        return tensor

    def get_config(self):
        """JSON-serialisable settings; from_config(get_config()) rebuilds an equal compressor."""
        backward = self.backward
        if backward is FP16Compressor:
            backward = "fp16"
        elif is_lossy(backward):
            backward = backward.get_config()
        config = {"id": self.codec_id, "error_bound": self.error_bound, "mode": self.mode,
                  "level": self.level, "backward": backward, "dedup": self.dedup}
        if self.segments != 1 or self.backward_segments is not None:
            config["segments"] = self.segments
            config["backward_segments"] = self.backward_segments
        if self.dither:
            config["dither"] = self.dither
        if self.auto:
            config["auto"] = True
        if self.row_len is not None:
            config["row_len"] = self.row_len
        if self.reuse:
            config["reuse"] = True
            config["reuse_memory"] = self.reuse_memory
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        codec_id = config.pop("id", cls.codec_id)
        if codec_id != cls.codec_id:
            raise ValueError(f"config is for {codec_id!r}, not {cls.codec_id!r}")
        return cls(**config)

    def __repr__(self):
        backward = self.backward
        if backward is FP16Compressor:
            backward = "Compression.fp16"
        else:
            backward = repr(backward)
        segments = ""
        if self.segments != 1 or self.backward_segments is not None:
            segments = f", segments={self.segments!r}, backward_segments={self.backward_segments!r}"
        if self.dither:
            segments += f", dither={self.dither!r}"
        if self.auto:
            segments += ", auto=True"
        if self.row_len is not None:
            segments += f", row_len={self.row_len!r}"
        if self.reuse:
            segments += f", reuse=True, reuse_memory={self.reuse_memory!r}"
        return (f"{type(self).__name__}(error_bound={self.error_bound!r}, mode={self.mode!r}, "
                f"level={self.level!r}, backward={backward}, dedup={self.dedup!r}{segments})")

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(json.dumps(self.get_config(), sort_keys=True))


def _world():
    """(global rank, size) when Horovod is initialised, else (0, 1)."""
    try:
        from horovod.torch import mpi_ops
        if mpi_ops.is_initialized():
            return mpi_ops.rank(), mpi_ops.size()
    except (ImportError, ValueError):
        pass
    return 0, 1


_codecs = {}  # codec_id -> compressor class (register_codec)


def register_codec(cls):
    """Registers a compressor class under its `codec_id` for compressor_from_config; returns
    the class, so that it serves as a class decorator."""
    _codecs[cls.codec_id] = cls
    return cls


def compressor_from_config(config):
    """Rebuilds a compressor from get_config() output: the registered class of its "id"."""
    cls = _codecs.get(config.get("id"))
    if cls is None:
        raise ValueError(f"unknown compressor id {config.get('id')!r} in {config!r}, expected "
                         f"one of {sorted(_codecs)} (hvd_lossy.compression registers them all)")
    return cls.from_config(config)


register_codec(LossyCompressor)
