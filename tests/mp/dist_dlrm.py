"""A small hybrid-parallel DLRM written the torch.distributed way, as the reference DLRM code
is: tables model-parallel (table t on rank t % N), MLPs data-parallel, the lookups exchanged by
a custom autograd All2All around all_to_all_single(async_op=True) on the flattened
[global batch, local tables x dim] layout. Switching it to hvd_lossy is one import and
`compression=`; with Compression.none its losses equal the plain run's exactly."""
import torch
import torch.distributed as torch_dist

from dist_util import N, R, dist

K, D, B, DENSE, STEPS = 5, 8, 16, 4, 6  # tables, dim, local batch, dense features, steps


def make_all2all(dist_module, **compression):
    """The reference code's All2All, written against `dist_module`."""

    class All2All(torch.autograd.Function):
        @staticmethod
        def forward(ctx, lookups, out_splits, in_splits):
            out = lookups.new_empty(sum(out_splits))
            work = dist_module.all_to_all_single(out, lookups, out_splits, in_splits,
                                                 async_op=True, **compression)
            work.wait()
            ctx.splits = (out_splits, in_splits)
            return out

        @staticmethod
        def backward(ctx, grad):
            out_splits, in_splits = ctx.splits
            back = {k: dist_module.for_backward(v) for k, v in compression.items()}
            grad_in = grad.new_empty(sum(in_splits))
            dist_module.all_to_all_single(grad_in, grad.contiguous(), in_splits, out_splits,
                                          **back)
            return grad_in, None, None

    return All2All


def train(all2all, seed=0):
    """Losses of STEPS steps of SGD, identical on every rank."""
    torch.manual_seed(seed)
    tables = [torch.nn.EmbeddingBag(50, D, mode="sum") for _ in range(K)]
    bottom = torch.nn.Sequential(torch.nn.Linear(DENSE, D), torch.nn.ReLU())
    top = torch.nn.Sequential(torch.nn.Linear((K + 1) * D, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 1))
    mine = [t for t in range(K) if t % N == R]
    owned = [tables[t] for t in mine]
    params = [p for m in owned + [bottom, top] for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    ks = [len([t for t in range(K) if t % N == r]) for r in range(N)]
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)
        ids = torch.randint(0, 50, (N * B, K), generator=g)  # global batch, one id per table
        dense = torch.rand((N * B, DENSE), generator=g)[R * B:(R + 1) * B]
        labels = (torch.rand((N * B, 1), generator=g) < 0.3).float()[R * B:(R + 1) * B]
        looked = torch.cat([tables[t](ids[:, t:t + 1]) for t in mine], dim=1)  # [N*B, k*D]
        out = all2all.apply(looked.reshape(-1), [B * k * D for k in ks], [B * len(mine) * D] * N)
        by_src = out.split([B * k * D for k in ks])
        cols = [None] * K
        for src, chunk in enumerate(by_src):
            theirs = [t for t in range(K) if t % N == src]
            for j, t in enumerate(chunk.view(B, len(theirs), D).unbind(1)):
                cols[theirs[j]] = t
        z = top(torch.cat([bottom(dense)] + cols, dim=1))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels)
        opt.zero_grad()
        loss.backward()
        for m in (bottom, top):  # data parallel: average the dense gradients
            for p in m.parameters():
                torch_dist.all_reduce(p.grad)
                p.grad /= N
        opt.step()
        total = loss.detach().clone()
        torch_dist.all_reduce(total)
        losses.append(float(total) / N)
    return losses


def test_dlrm_with_compression_none_has_exactly_the_plain_runs_losses():
    plain = train(make_all2all(torch_dist))
    ours = train(make_all2all(dist, compression=dist.Compression.none))
    assert ours == plain, (ours, plain)
    c = dist.Compression.lossy(0.01, row_len=D, tables=len([t for t in range(K) if t % N == R]),
                               backward_segments=[len([t for t in range(K) if t % N == r])
                                                  for r in range(N)])
    lossy = train(make_all2all(dist, compression=c))
    assert lossy != plain and max(abs(a - b) for a, b in zip(lossy, plain)) < 0.01, (lossy, plain)
    if R == 0:
        print(f"dlrm losses: plain {plain}; lossy 0.01 {lossy}", flush=True)
