"""Compressors for the non-reducing collectives of hvd_lossy.torch: the `Compression` namespace.

`Compression.none` and `Compression.fp16` are Horovod's own. `Compression.lossy(...)` gives a
`LossyCompressor` (hvd_lossy.compressor) and `Compression.adaptive(...)` an
`AdaptiveCompressor` (hvd_lossy.adaptive): error-bounded compression into self-describing byte
frames. Their payload is bytes, and bytes cannot be summed, so they serve alltoall, allgather
and broadcast, never allreduce or reducescatter (those raise ValueError when handed one);
DistributedOptimizer takes one and reduces the gradients by allgather (hvd_lossy.optimizer).

This module stands above both compressors' modules, so importing it registers every
compressor for compressor_from_config.
"""
from hvd_lossy import check_error_bound
from hvd_lossy.adaptive import AdaptiveCompressor
from hvd_lossy.compressor import (BACKWARD, SAME, FP16Compressor, LossyCompressor,
                                  NoneCompressor, compressor_from_config, is_lossy)
from hvd_lossy.reuse import DEFAULT_MEMORY_BYTES

__all__ = ["Compression", "LossyCompressor", "AdaptiveCompressor", "NoneCompressor",
           "FP16Compressor", "compressor_from_config", "is_lossy", "SAME", "BACKWARD", "RECIPE",
           "GRADIENT_BOUND"]

# backward=RECIPE (the default of Compression.lossy/adaptive): gradients at the measured bound of
# the training recipe, GRADIENT_BOUND relative and dithered (benchmarks/RESULTS.md).
RECIPE = "recipe"
GRADIENT_BOUND = 0.02


def _recipe_backward(backward, error_bound, mode):
    if isinstance(backward, str) and backward == RECIPE:
        if mode != "rel":
            return SAME  # an absolute bound's units are the tensor's: nothing was measured
        return min(check_error_bound(error_bound), GRADIENT_BOUND)
    return backward


class Compression:
    """Compressors for hvd_lossy.torch collectives.

    none and fp16 are Horovod's (they work everywhere). lossy and adaptive produce byte
    frames: alltoall, allgather and broadcast only.
    """
    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def lossy(error_bound, mode="rel", level=1, backward=RECIPE, dedup=True, segments=1,
              backward_segments=None, dither=BACKWARD, auto=False, row_len=None, tables=None,
              reuse=False, reuse_memory=DEFAULT_MEMORY_BYTES):
        """An error-bounded LossyCompressor; see its docstring for the arguments.

        The defaults are the measured training recipe: lookups at `error_bound`, their gradients
        at min(error_bound, 0.02) relative with subtractive dither (`backward=RECIPE` resolves to
        that bound in mode "rel", to "same" in mode "abs"). In the DLRM benchmark (1M synthetic
        rows, 3 seeds, lookups 0.03 one frame per table, benchmarks/RESULTS.md) that sent 15.8x
        fewer all-to-all bytes at dAUC +0.0020 against uncompressed training; gradients at the
        lookups' bound without dither (`backward="same", dither=False`, the old default) cost
        0.010 AUC at 14.7x. Dither has no CUDA kernel yet: dithered frames of device tensors are
        coded on the CPU (correct, not fast); for speed on a GPU pass dither=False and a tighter
        `backward` (0.01 undithered: dAUC +0.0023 at 13.1x).

        reuse=True (with `ids` and `recv_ids` on the alltoall) sends rows a destination already
        holds as references or residuals across calls (hvd_lossy.reuse_exchange); gradients
        are never reused, but the autograd all-to-alls' (hvd_lossy.torch and
        hvd_lossy.distributed) travel summed by id, one row an id (hvd_lossy.grad_ids). reuse_memory caps its caches a rank (bytes, default 256 MiB).
        """
        return LossyCompressor(error_bound, mode=mode, level=level,
                               backward=_recipe_backward(backward, error_bound, mode),
                               dedup=dedup, segments=segments, backward_segments=backward_segments,
                               dither=dither, auto=auto, row_len=row_len, tables=tables,
                               reuse=reuse, reuse_memory=reuse_memory)

    @staticmethod
    def adaptive(controller, tables, backward=RECIPE, dither=BACKWARD, **kwargs):
        """hvd_lossy.adaptive.AdaptiveCompressor(controller, tables, backward=..., dither=...,
        **kwargs): per-table bounds chosen online by a controller.

        The defaults are the measured training recipe: gradients at min(controller.base, 0.02)
        relative with subtractive dither (`backward=RECIPE`; in mode "abs" the controller's
        per-table gradient bounds, "table"). In the DLRM benchmark (1M synthetic rows, 3 seeds,
        base 0.03, benchmarks/RESULTS.md) that sent 15.6x fewer all-to-all bytes at dAUC -0.0001
        (level 2; at level 1, which decodes to the same bits, with short blocks: 14.0x on the
        links, dAUC -0.0004); the per-table gradient bounds without dither (`backward="table",
        dither=False`, the old default) cost 0.027 AUC. On CUDA tensors dithered frames are
        coded by the CUDA codec (not yet run on a GPU; HVD_LOSSY_HOST_DITHER=1 codes them on
        the host).
        """
        if isinstance(backward, str) and backward == RECIPE:
            backward = min(controller.base, GRADIENT_BOUND) if controller.mode == "rel" else "table"
        return AdaptiveCompressor(controller, tables, backward=backward, dither=dither, **kwargs)
