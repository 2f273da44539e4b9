"""horovod.torch.compression's three compressors, for a process without Horovod.

hvd_lossy's compressors derive from Horovod's classes, so that Horovod's own collectives take
them. hvd_lossy.distributed users and a one-process run (the DLRM example's `--backend local`,
a machine with one GPU and no MPI) have no Horovod to import them from; these behave as
Horovod 0.28's do, and are used only when `horovod.torch.compression` cannot be imported.
"""
import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """The tensor as it is."""

    compress = staticmethod(lambda tensor: (tensor, None))
    decompress = staticmethod(lambda tensor, ctx: tensor)


class FP16Compressor(Compressor):
    """Floating-point tensors cast to float16 and back to their dtype; others as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point:
            return tensor.type(ctx)
        return tensor

