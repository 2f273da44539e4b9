"""The README's "Port your torch.distributed script": the reference DLRM's embedding exchange
(tables side by side, flattened, split sizes in elements, custom autograd around
all_to_all_single(async_op=True)), switched to hvd_lossy by one import and `compression=`.

    torchrun --standalone --nproc_per_node 2 examples/port_torch_distributed.py
"""
import torch

import hvd_lossy.distributed as dist   # was: import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dim, batch = 16, 32                    # embedding dim, samples per rank
tables_of = [2 + r for r in range(world)]          # rank r owns 2 + r tables
lossy = dist.Compression.lossy(0.01, row_len=dim, tables=tables_of[rank],
                               backward_segments=tables_of)   # gradients: rank d's tables


class All2All(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat, out_splits, in_splits):
        out = flat.new_empty(sum(out_splits))
        work = dist.all_to_all_single(out, flat, out_splits, in_splits, async_op=True,
                                      compression=lossy)
        work.wait()
        ctx.splits = (out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        grad_in = grad.new_empty(sum(in_splits))
        dist.all_to_all_single(grad_in, grad.contiguous(), in_splits, out_splits,
                               compression=dist.for_backward(lossy))
        return grad_in, None, None


# This rank's tables' lookups for the global batch, side by side: [world * batch, k * dim].
lookups = torch.randn(world * batch, tables_of[rank] * dim, requires_grad=True)
out = All2All.apply(lookups.reshape(-1), [batch * k * dim for k in tables_of],
                    [batch * tables_of[rank] * dim] * world)
out.square().sum().backward()          # the gradient travels back compressed too
stats = dist.comm_stats()["total"]
print(f"rank {rank}: received {out.numel()} values, sent {stats['raw_bytes']} bytes "
      f"as {stats['wire_bytes']} ({stats['ratio']:.1f}x)")
dist.destroy_process_group()
