"""hvd_lossy: error-bounded lossy compression for the embedding all-to-all of DLRM training.

The codec works without Horovod::

    frame = hvd_lossy.compress(lookups, 0.03)          # relative bound: 3% of the value range
    restored = hvd_lossy.decompress(frame)

The Horovod drop-in is ``import hvd_lossy.torch as hvd``; for torch.distributed code,
``import hvd_lossy.distributed as dist``.
"""
from ._codec import (
    DITHER_SEEDS,
    STAT_FINITE,
    STAT_MAX,
    STAT_MIN,
    STAT_SUM,
    STAT_SUMSQ,
    STAT_UNIQUE,
    STATS_PER_PIECE,
    CodecError,
    FrameError,
    check_error_bound,
    compress,
    compress_chunks,
    compress_grouped,
    decompress_into,
    frame_info,
    get_num_threads,
    max_frame_bytes,
    max_grouped_bytes,
    max_output_bytes,
    piece_stats,
    set_max_output_bytes,
    set_num_threads,
)
from ._decode import decompress, decompress_chunks, split_frames

__version__ = "0.1.0"

__all__ = [
    "CodecError",
    "FrameError",
    "DITHER_SEEDS",
    "STAT_FINITE",
    "STAT_MAX",
    "STAT_MIN",
    "STAT_SUM",
    "STAT_SUMSQ",
    "STAT_UNIQUE",
    "STATS_PER_PIECE",
    "check_error_bound",
    "compress",
    "compress_chunks",
    "compress_grouped",
    "decompress",
    "decompress_chunks",
    "decompress_into",
    "frame_info",
    "get_num_threads",
    "max_frame_bytes",
    "max_grouped_bytes",
    "max_output_bytes",
    "piece_stats",
    "set_max_output_bytes",
    "set_num_threads",
    "split_frames",
]
