"""Forward bytes of the real codec over training, today against prediction + residual (issue 24,
part 3): what hvd_lossy.reuse sends, not an estimate.

One process trains the DLRM example's model on its synthetic data (every table local) and
every step cuts the global batch's lookups into the chunks a
`--ranks`-rank all-to-all sends: per destination ONE frame of one segment a table (b = batch /
ranks rows each), at rel `--bound` of each segment's range, as Compression.lossy(segments=26)
codes it. Each chunk is coded two ways:

  today   hvd_lossy.compress_chunks of the chunk (dedup of equal rows, by id);
  reuse   hvd_lossy.reuse.ReuseEncoder for that destination: the residual against the mirror of
          what the destination holds, at the bound X itself gets; the destination's
          ReuseDecoder decodes it against its cache (whose memory is capped as the transport
          caps it, `--memory-mib` for a rank).

With `--data DIR` the rows are the Criteo files there instead (the Kaggle format, as the
example reads them: a vocabulary a table over train), shuffled each of `--epochs` epochs as the
example shuffles them; the bundled sample (`data/criteo_kaggle_sample`) holds 7,200 training
rows, so use a small `--batch`.

The model trains on what the reuse receiver decodes, so the drift measured is a reusing run's.
Every decoded element is checked against the current value (the run stops if one is outside the
bound) and mirror and cache digests are compared every step. With `--grad-by-id` the gradients
are also coded as a reusing alltoall sends them (hvd_lossy.grad_ids): summed per (destination,
table, id) before coding, each table's sums at the absolute bound its rows get (so each id's
summed gradient is within one bound, where a sum of k coded rows is within k), one row an id;
the owner knows the ids it sent, so nothing else travels ("grad_by_id" bytes). Gradients are never reused: their
frames (rel `--grad-bound`, dithered) count the same for both, in the whole-run ratio. Bytes are
deterministic for a seed; no timings are taken.

    python benchmarks/reuse_bytes.py --optimizer sgd --json benchmarks/results/reuse_bytes_sgd.json
    python benchmarks/reuse_bytes.py --data data/criteo_kaggle_sample --batch 512 --epochs 4 --every 7
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "dlrm"))

import data  # noqa: E402
import files  # noqa: E402
import sources  # noqa: E402
import synthetic  # noqa: E402
from model import DenseArch, LocalTables  # noqa: E402

import hvd_lossy  # noqa: E402
from hvd_lossy import reuse  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    p.add_argument("--emb-lr", type=float, default=0.05, help="learning rate of the embeddings")
    p.add_argument("--lr", type=float, default=0.03, help="learning rate of the dense part")
    p.add_argument("--bound", type=float, default=0.03, help="rel bound of the lookups")
    p.add_argument("--grad-bound", type=float, default=0.02, help="rel bound of the gradients")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic training rows")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=2048, help="global batch")
    p.add_argument("--ranks", type=int, default=2, help="destinations a batch is cut into")
    p.add_argument("--memory-mib", type=float, default=reuse.DEFAULT_MEMORY_BYTES / 2**20,
                   help="reuse memory cap of a rank")
    p.add_argument("--data", default=None, help="Criteo files to train on instead of synthetic rows")
    p.add_argument("--epochs", type=int, default=1, help="epochs over --data")
    p.add_argument("--steps", type=int, default=None, help="default: one epoch of --rows")
    p.add_argument("--every", type=int, default=25, help="steps per point of the curve")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grad-by-id", action="store_true",
                   help="also code the gradients summed by id (as a reusing alltoall sends them)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


KEYS = ("today", "reuse", "grad", "grad_by_id", "rows", "references", "residuals", "fresh")


def exchange(lookups, sparse, ends, args, window):
    """What every destination decodes under reuse, (T, B, D) like `lookups`; tallies bytes."""
    T, B, D = lookups.shape
    b = B // args.ranks
    received = torch.empty_like(lookups)
    for d, (enc, dec) in enumerate(ends):
        x = lookups[:, d * b:(d + 1) * b].reshape(T * b, D).contiguous()
        ids = sparse[d * b:(d + 1) * b].t().reshape(T * b).contiguous()
        seg_rows = [b] * T
        window["today"] += hvd_lossy.compress_chunks(x, seg_rows, args.bound, ids=ids)[1][0]
        frame, predicted = enc.encode(x, ids, seg_rows)
        x_hat = dec.decode(frame, ids, predicted)
        check(x, x_hat, seg_rows, args.bound)
        if enc.digest != dec.digest:
            raise AssertionError(f"mirror digest {enc.digest:#x} != cache digest {dec.digest:#x}")
        window["reuse"] += frame.numel()
        for k in ("rows", "references", "residuals", "fresh"):
            window[k] += enc.last[k]
        received[:, d * b:(d + 1) * b] = x_hat.reshape(T, b, D)
    return received


def grad_by_id_bytes(g, ids, bound, seed):
    """Frame bytes of a chunk's gradients `g` (T x b rows) summed per (table, id) of `ids`
    (T, b), each table at the absolute bound its rows get at rel `bound`."""
    T, b = ids.shape
    sums, rows, ebs = [], [], []
    for t in range(T):
        rows_t = g[t * b:(t + 1) * b]
        unique, inverse = torch.unique(ids[t], return_inverse=True)
        sums.append(torch.zeros(len(unique), g.shape[1]).index_add_(0, inverse, rows_t))
        rows.append(len(unique))
        ebs.append(reuse.absolute_bound(rows_t, bound, "rel"))
    return hvd_lossy.compress_chunks(torch.cat(sums), rows, ebs, mode="abs", dither=seed)[1][0]


def check(x, x_hat, seg_rows, bound):
    for i, (xs, hs) in enumerate(zip(x.split(seg_rows), x_hat.split(seg_rows))):
        eb = reuse.absolute_bound(xs, bound, "rel")
        err = float((xs.double() - hs.double()).abs().max())
        if err > eb:
            raise AssertionError(f"segment {i}: error {err} above the bound {eb}")


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    hvd_lossy.set_num_threads(1)
    if args.data:
        train = files.load_splits(args.data, "vocab", None, None)["train"]
        source = sources.FileSource(train, train, args.batch, args.seed)
        steps = args.steps or source.steps_per_epoch * args.epochs
        batch = lambda step: source.batch(*divmod(step, source.steps_per_epoch), 0, 1)  # noqa: E731
    else:
        source = synthetic.SyntheticCriteo(args.rows, 0, args.seed)
        steps = args.steps or args.rows // args.batch
        batch = lambda step: (torch.from_numpy(a) for a in source.rows(  # noqa: E731
            "train", step * args.batch, (step + 1) * args.batch))
    T = data.N_SPARSE
    dense_arch = DenseArch(data.N_DENSE, T, args.dim, [64], [64, 32])
    tables = LocalTables(source.cardinalities, range(T), args.dim, args.seed)
    opt_cls = torch.optim.Adagrad if args.optimizer == "adagrad" else torch.optim.SGD
    dense_opt = opt_cls(dense_arch.parameters(), lr=args.lr)
    emb_opt = opt_cls(tables.parameters(), lr=args.emb_lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    B, R = args.batch, args.ranks
    b = B // R
    capacity = reuse.capacity_for(int(args.memory_mib * 2**20), R, T, args.dim, torch.float32)
    ends = [(reuse.ReuseEncoder(args.bound, capacity=capacity), reuse.ReuseDecoder(capacity))
            for _ in range(R)]
    total, window, curve = dict.fromkeys(KEYS, 0), dict.fromkeys(KEYS, 0), []
    for step in range(steps):
        dense, sparse, labels = batch(step)
        lookups = tables(sparse)  # (T, B, D)
        with torch.no_grad():
            received = exchange(lookups.detach(), sparse, ends, args, window)
        emb = received.requires_grad_()
        logits = dense_arch.forward_top(dense_arch.forward_bottom(dense), emb.transpose(0, 1))
        loss = loss_fn(logits, labels)
        dense_opt.zero_grad()
        emb_opt.zero_grad()
        loss.backward()
        with torch.no_grad():
            for d in range(R):
                g = emb.grad[:, d * b:(d + 1) * b].reshape(T * b, args.dim).contiguous()
                seed = (step * R + d) % hvd_lossy.DITHER_SEEDS
                window["grad"] += hvd_lossy.compress_chunks(g, [b] * T, args.grad_bound,
                                                            dither=seed)[1][0]
                if args.grad_by_id:
                    window["grad_by_id"] += grad_by_id_bytes(
                        g, sparse[d * b:(d + 1) * b].t(), args.grad_bound, seed)
        lookups.backward(emb.grad)
        dense_opt.step()
        emb_opt.step()
        if (step + 1) % args.every == 0 or step + 1 == steps:
            point = dict(window, step=step + 1)
            curve.append(point)
            for k in KEYS:
                total[k] += window[k]
            window = dict.fromkeys(KEYS, 0)
            print(f"step {step + 1:4d}: references {point['references'] / point['rows']:.1%}, "
                  f"residuals {point['residuals'] / point['rows']:.1%} of rows; forward "
                  f"{point['today']} -> {point['reuse']} bytes "
                  f"({point['today'] / point['reuse']:.2f}x fewer); loss {loss.item():.4f}",
                  flush=True)
    raw = total["rows"] * args.dim * 4
    summary = {
        "forward_bytes_today": total["today"], "forward_bytes_reuse": total["reuse"],
        "forward_fewer_x": total["today"] / total["reuse"],
        "forward_bytes_saved": 1 - total["reuse"] / total["today"],
        "forward_ratio_today": raw / total["today"], "forward_ratio_reuse": raw / total["reuse"],
        "run_ratio_today": 2 * raw / (total["today"] + total["grad"]),
        "run_ratio_reuse": 2 * raw / (total["reuse"] + total["grad"]),
        **({"grad_fewer_x_by_id": total["grad"] / total["grad_by_id"],
            "run_ratio_reuse_grad_by_id": 2 * raw / (total["reuse"] + total["grad_by_id"])}
           if args.grad_by_id else {}),
        "reference_share": total["references"] / total["rows"],
        "residual_share": total["residuals"] / total["rows"],
        "cache_slots": capacity,
        "cache_mib_a_rank": 2 * (R - 1) * sum(e.nbytes() for e, _ in ends[:1]) / 2**20,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "totals": total, "curve": curve,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
