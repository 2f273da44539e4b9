"""A hybrid-parallel DLRM training loop as a user writes it against plain `horovod.torch`.

Not the example (examples/dlrm): no exchange helper, no hvd_lossy import unless asked. It follows
the README's "Port your script": each rank owns some tables, looks them up for the whole global
batch, and one differentiable `hvd.alltoall` sends each rank its slice; gradients travel back
through it. Modes change only the import line and `compression=`:

  plain   import horovod.torch as hvd; hvd.alltoall(lookups, splits)
  none    import hvd_lossy.torch as hvd; hvd.alltoall(lookups, splits): the drop-in's own cost
  fp16    the same, casting: hvd.alltoall(lookups.half(), splits) then .float()
  lossy   import hvd_lossy.torch as hvd; compression=hvd.Compression.lossy(0.03, segments=...)
  auto    ... Compression.lossy(0.03, ..., auto=True)
  lossy-fp16-backward
          ... Compression.lossy(0.03, ..., backward=hvd.Compression.fp16): float16 gradients

    mpirun -np 2 python benchmarks/user_dlrm.py --mode lossy --steps 112 --json out.json

Model: DLRM's, with the reference DLRM's Criteo Kaggle MLP sizes (bottom 13-512-256-dim, top
512-256-1; the example's are narrower) and its dot interaction (pairwise dot products of the
bottom output and the lookups), as the example has. `--interaction cat` feeds the top MLP the
concatenation instead (dim x (tables + 1) inputs): 3.6x the dense parameters at dim 128, so the
dense gradients' allreduce carries more of a step's bytes than the all-to-all does.
`--dense-fp16` sends that allreduce as float16 (Horovod's own compression=, in every mode);
`--dense-lossy` gives DistributedOptimizer the all-to-all's compressor in the lossy modes, which
codes the dense gradients as it codes the embedding gradients (README, "Port your script").

Data: ids Zipf-skewed (exponent 1.1) into tables of the Criteo Kaggle cardinalities capped at
--table-rows, fresh each step from a seeded stream (the same on every rank and in every mode);
dense features and labels random. Only the step time is measured: a JSON of per-step seconds.
"""
import argparse
import importlib
import json
import time

import numpy as np
import torch

KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
          14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["plain", "none", "fp16", "lossy", "auto", "lossy-fp16-backward"],
                   default="plain")
    p.add_argument("--steps", type=int, default=112)
    p.add_argument("--tables", type=int, default=21)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--table-rows", type=int, default=200_000)
    p.add_argument("--error-bound", type=float, default=0.03)
    p.add_argument("--interaction", choices=["dot", "cat"], default="dot",
                   help="the top MLP's input: DLRM's pairwise dot products (default) or the concatenation")
    p.add_argument("--dense-fp16", action="store_true",
                   help="the dense gradients' allreduce as float16 (DistributedOptimizer's "
                        "compression=hvd.Compression.fp16), in every mode")
    p.add_argument("--dense-lossy", action="store_true",
                   help="in the lossy modes, DistributedOptimizer(compression=) the all-to-all's "
                        "compressor: the dense gradients coded as the embedding gradients")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write {'mode', 'step_seconds', 'report'} here (rank 0)")
    return p.parse_args(argv)


def mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def interact(bottom, emb, how):
    """The top MLP's input from the bottom output (b, D) and the lookups (b, T, D)."""
    feats = torch.cat([bottom.unsqueeze(1), emb], dim=1)
    if how == "cat":
        return feats.flatten(1)
    n = feats.shape[1]
    i, j = torch.tril_indices(n, n, offset=-1)
    return torch.cat([bottom, torch.bmm(feats, feats.transpose(1, 2))[:, i, j]], dim=1)


def dense_compression(hvd, args, lossy):
    """What DistributedOptimizer sends the dense gradients with: the all-to-all's compressor
    `lossy` (None in the modes without one) with --dense-lossy, Horovod's float16 cast with
    --dense-fp16, else as they are."""
    if args.dense_lossy and lossy is not None:
        return lossy
    return hvd.Compression.fp16 if args.dense_fp16 else hvd.Compression.none


def zipf(rng, n, size):
    """ids in [0, n) with P(k) ~ (k+1)^-1.1, by inverting the continuous power law."""
    u = rng.random(size)
    a = 1.0 - 1.1
    k = ((u * ((n + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)) - 1.0
    return np.minimum(k.astype(np.int64), n - 1)


def main(argv=None):
    args = parse(argv)
    hvd = importlib.import_module("horovod.torch" if args.mode in ("plain", "fp16") else "hvd_lossy.torch")
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed + rank)
    rows = [min(c, args.table_rows) for c in (KAGGLE * 2)[:args.tables]]
    owner = [t % size for t in range(args.tables)]
    mine = [t for t in range(args.tables) if owner[t] == rank]
    tables_per_rank = [owner.count(r) for r in range(size)]
    tables = torch.nn.ModuleList(torch.nn.Embedding(rows[t], args.dim, sparse=True) for t in mine)
    for t in tables:
        torch.nn.init.uniform_(t.weight, -(1 / t.num_embeddings) ** 0.5, (1 / t.num_embeddings) ** 0.5)
    # the top MLP's width from interact itself, so the two cannot disagree
    top_in = interact(torch.zeros(1, args.dim), torch.zeros(1, args.tables, args.dim),
                      args.interaction).shape[1]
    bottom, top = mlp([13, 512, 256, args.dim]), mlp([top_in, 512, 256, 1])
    dense_params = list(bottom.parameters()) + list(top.parameters())
    named = [(f"b{i}", q) for i, q in enumerate(bottom.parameters())] + \
            [(f"t{i}", q) for i, q in enumerate(top.parameters())]
    kw = {}
    if args.mode in ("lossy", "auto", "lossy-fp16-backward"):
        # lossy-fp16-backward: the gradients as float16 (Horovod's cast), no segments of theirs
        backward = (dict(backward=hvd.Compression.fp16) if args.mode == "lossy-fp16-backward"
                    else dict(backward_segments=tables_per_rank))
        kw["compression"] = hvd.Compression.lossy(args.error_bound, segments=len(mine),
                                                  auto=args.mode == "auto", **backward)
    opt = hvd.DistributedOptimizer(torch.optim.Adagrad(dense_params, lr=0.01), named_parameters=named,
                                   compression=dense_compression(hvd, args, kw.get("compression")))
    emb_opt = torch.optim.Adagrad(tables.parameters(), lr=0.01)
    hvd.broadcast_parameters(dict(named), root_rank=0)
    b = args.global_batch // size
    splits = [len(mine) * b] * size
    loss_fn = torch.nn.BCEWithLogitsLoss()
    times = []
    for step in range(args.steps):
        rng = np.random.default_rng([args.seed, step])
        ids = [torch.from_numpy(zipf(rng, rows[t], args.global_batch)) for t in range(args.tables)]
        dense = torch.from_numpy(rng.random((args.global_batch, 13), dtype=np.float32))
        label = torch.from_numpy((rng.random(args.global_batch) < 0.25).astype(np.float32))
        mine_slice = slice(rank * b, (rank + 1) * b)
        t0 = time.perf_counter()
        # table-major per destination: [dest][my table][row of dest's slice]
        emb_out = torch.cat([tables[j](ids[t][d * b:(d + 1) * b]) for d in range(size)
                             for j, t in enumerate(mine)])
        if args.mode == "fp16":
            got, _ = hvd.alltoall(emb_out.half(), splits=splits)
            got = got.float()
        else:
            got, _ = hvd.alltoall(emb_out, splits=splits, **kw)
        # received: [source rank][its table][my rows] -> [my rows, table, dim] in table order
        parts, at = [], 0
        for r in range(size):
            n = tables_per_rank[r] * b
            parts.append(got[at:at + n].view(tables_per_rank[r], b, args.dim))
            at += n
        emb = torch.cat(parts).transpose(0, 1)
        x = bottom(dense[mine_slice])
        loss = loss_fn(top(interact(x, emb, args.interaction)).squeeze(1), label[mine_slice])
        opt.zero_grad()
        emb_opt.zero_grad()
        loss.backward()
        opt.step()
        emb_opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0 and args.json:
        report = hvd.comm_stats() if hasattr(hvd, "comm_stats") else None
        with open(args.json, "w") as f:
            json.dump({"mode": args.mode, "step_seconds": times, "report": report}, f, default=str)


if __name__ == "__main__":
    main()
