"""How much of each forward chunk the receiver already holds within the bound: the measurement
issue 24 asks for before an id-aware exchange is built ("measure first, keep it only if it pays").

One process trains the DLRM example's model (its synthetic Criteo-scale data, its DenseArch and
LocalTables, every table local) and, every step, cuts the global batch's lookups into the chunks
a `--ranks`-rank all-to-all would send: one (destination, table) piece of b = batch / ranks rows.
For each piece it compares two senders, both at the same bound (rel `--bound` of the piece's
range, as `Compression.lossy` sets it):

  today   the piece compressed alone (`hvd_lossy.compress`, dedup of identical rows);
  reuse   a sender that knows the ids and mirrors what the receiver holds for (destination,
          table, id): the decoded row it last received. Each distinct id of the piece is
            a reference  when every element is within the bound of the held row (nothing sent
                         but its slot number),
            a residual   when the id is held but has drifted: x - held coded at the same
                         absolute bound (small codes), held + decoded residual replaces it,
            fresh        otherwise: coded as today, its decoded row becomes the held copy.
          Whatever is decoded replaces the held copy on both sides, so they stay identical.

The model trains on what the receiver would decode under `reuse` (the held rows included), so
the drift it measures is the drift of a run that reuses. Gradients are never reused: their bytes
(the recipe's rel 0.02, dithered) are the same for both and count in the whole-run ratio.

Bytes of `reuse` are frames of the real codec for the fresh rows and for the residuals, plus an
estimate of what a format would add: a varint slot number per reference and per residual, two
bits of kind per distinct id, and a row map of ceil(log2(distinct)) bits a row where the piece
has repeated ids. It is an estimate of the format's bytes, not a format. `reuse_ids_known` is
the same sender for a receiver that knows the ids of the rows it receives (in hybrid-parallel
DLRM each rank holds its slice's sparse features, so it does): no slot numbers, no row map.

    python benchmarks/reuse_share.py --optimizer sgd --steps 488 --json out/reuse_sgd.json
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "dlrm"))

import data  # noqa: E402
import synthetic  # noqa: E402
from model import DenseArch, LocalTables  # noqa: E402

import hvd_lossy  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    p.add_argument("--emb-lr", type=float, default=0.05, help="learning rate of the embeddings")
    p.add_argument("--lr", type=float, default=0.03, help="learning rate of the dense part")
    p.add_argument("--bound", type=float, default=0.03, help="rel bound of the lookups")
    p.add_argument("--grad-bound", type=float, default=0.02, help="rel bound of the gradients (dithered)")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic training rows")
    p.add_argument("--max-table-rows", type=int, default=None, help="cap on each table's rows")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=2048, help="global batch")
    p.add_argument("--ranks", type=int, default=2, help="destinations a batch is cut into")
    p.add_argument("--steps", type=int, default=None, help="default: one epoch of --rows")
    p.add_argument("--every", type=int, default=25, help="steps per point of the curve")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def varint_bytes(v):
    return max(1, math.ceil(max(int(v), 1).bit_length() / 7))


class Held:
    """What one receiver holds for one (destination, table): a slot per id, the decoded rows."""

    def __init__(self, dim):
        self.slot = {}
        self.rows = torch.empty(0, dim)

    def lookup(self, ids):
        return torch.tensor([self.slot.get(i, -1) for i in ids], dtype=torch.int64)

    def put(self, ids, slots, rows):
        """Rows replace the held ones at `slots`, or take new slots where a slot is -1."""
        new = torch.nonzero(slots < 0).flatten()
        if len(new):
            base = self.rows.shape[0]
            for k, s in zip(new.tolist(), range(base, base + len(new))):
                self.slot[ids[k]] = s
            self.rows = torch.cat([self.rows, torch.empty(len(new), self.rows.shape[1])])
            slots = slots.clone()
            slots[new] = torch.arange(base, base + len(new))
        self.rows[slots] = rows


def code(x, eb_abs):
    """Frame bytes and decoded rows of x at an absolute bound (no rows: nothing sent)."""
    if x.shape[0] == 0:
        return 0, x.clone()
    frame = hvd_lossy.compress(x.contiguous(), eb_abs, mode="abs")
    return frame.numel(), hvd_lossy.decompress(frame)


def piece(x, ids, held, bound, tally):
    """One (destination, table) piece: today's bytes, reuse's bytes, and what the receiver
    decodes under reuse (rows of x's order)."""
    tally["today"] += hvd_lossy.compress(x, bound).numel()
    lo, hi = float(x.min()), float(x.max())
    eb = bound * (hi - lo)
    uniq, inv = torch.unique(ids, return_inverse=True)
    first = torch.full((len(uniq),), len(ids), dtype=torch.int64).scatter_reduce(
        0, inv, torch.arange(len(ids)), "amin")
    xu = x[first]
    keys = uniq.tolist()
    slots = held.lookup(keys)
    known = slots >= 0
    out = torch.empty_like(xu)
    ref = torch.zeros_like(known)
    if known.any():
        h = held.rows[slots[known]]
        dev = (xu[known].double() - h.double()).abs().amax(1)
        ref[known] = dev <= eb
        out[ref] = held.rows[slots[ref]]
    res = known & ~ref
    fresh = ~known
    if res.any():  # x - held at the bound; held + decoded must be within it too, else fresh
        idx = torch.nonzero(res).flatten()
        nbytes, dr = code(xu[idx] - held.rows[slots[idx]], eb)
        y = held.rows[slots[idx]] + dr
        ok = (y.double() - xu[idx].double()).abs().amax(1) <= eb
        if not ok.all():
            res[idx[~ok]], fresh[idx[~ok]] = False, True
            idx = idx[ok]
            nbytes, dr = code(xu[idx] - held.rows[slots[idx]], eb)  # what would be sent
            y = held.rows[slots[idx]] + dr
        out[idx] = y
        tally["reuse"] += nbytes
        tally["reuse_ids_known"] += nbytes
    nbytes, out[fresh] = code(xu[fresh], eb)
    kinds = math.ceil(2 * len(keys) / 8)  # kind of each distinct id
    tally["reuse"] += nbytes + kinds
    tally["reuse_ids_known"] += nbytes + kinds
    tally["reuse"] += sum(varint_bytes(s) for s in slots[known].tolist())  # slot numbers
    if len(keys) < len(ids):  # row map
        tally["reuse"] += math.ceil(len(ids) * max(1, math.ceil(math.log2(len(keys)))) / 8)
    changed = torch.nonzero(res | fresh).flatten()
    held.put([keys[k] for k in changed.tolist()], torch.where(fresh, -1, slots)[changed], out[changed])
    tally["rows"] += len(ids)
    tally["distinct"] += len(keys)
    tally["held"] += int(known.sum())
    tally["reference"] += int(ref.sum())
    tally["residual"] += int(res.sum())
    tally["fresh"] += int((~known).sum())
    tally["recoded"] += int((known & fresh).sum())  # drifted past what a residual can carry
    return out[inv]


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    hvd_lossy.set_num_threads(1)
    source = synthetic.SyntheticCriteo(args.rows, 0, args.seed, args.max_table_rows)
    T = data.N_SPARSE
    dense_arch = DenseArch(data.N_DENSE, T, args.dim, [64], [64, 32])
    tables = LocalTables(source.cardinalities, range(T), args.dim, args.seed)
    opt_cls = torch.optim.Adagrad if args.optimizer == "adagrad" else torch.optim.SGD
    dense_opt = opt_cls(dense_arch.parameters(), lr=args.lr)
    emb_opt = opt_cls(tables.parameters(), lr=args.emb_lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    B, R = args.batch, args.ranks
    b = B // R
    steps = args.steps or args.rows // B
    held = {(d, t): Held(args.dim) for d in range(R) for t in range(T)}
    keys = ("today", "reuse", "reuse_ids_known", "grad", "rows", "distinct", "held", "reference", "residual", "fresh", "recoded")
    total = dict.fromkeys(keys, 0)
    curve, window = [], dict.fromkeys(keys, 0)
    t0 = time.time()
    for step in range(steps):
        dense, sparse, labels = (torch.from_numpy(a) for a in source.rows("train", step * B, (step + 1) * B))
        lookups = tables(sparse)  # (T, B, D)
        with torch.no_grad():
            received = torch.empty_like(lookups)
            for d in range(R):
                for t in range(T):
                    rows = slice(d * b, (d + 1) * b)
                    received[t, rows] = piece(lookups[t, rows].detach().contiguous(), sparse[rows, t],
                                              held[(d, t)], args.bound, window)
        emb = received.detach().requires_grad_()
        logits = dense_arch.forward_top(dense_arch.forward_bottom(dense), emb.transpose(0, 1))
        loss = loss_fn(logits, labels)
        dense_opt.zero_grad()
        emb_opt.zero_grad()
        loss.backward()
        with torch.no_grad():
            for d in range(R):
                for t in range(T):
                    g = emb.grad[t, d * b:(d + 1) * b].contiguous()
                    window["grad"] += hvd_lossy.compress(g, args.grad_bound, dither=step + 1).numel()
        lookups.backward(emb.grad)
        dense_opt.step()
        emb_opt.step()
        if (step + 1) % args.every == 0 or step + 1 == steps:
            point = dict(window, step=step + 1)
            curve.append(point)
            for k in keys:
                total[k] += window[k]
            window = dict.fromkeys(keys, 0)
            raw = point["rows"] * args.dim * 4
            start = curve[-2]["step"] + 1 if len(curve) > 1 else 1
            print(f"steps {start:4d}-{step + 1:4d}: held {point['held'] / point['distinct']:.1%} "
                  f"of distinct rows, reference {point['reference'] / point['distinct']:.1%}, residual "
                  f"{point['residual'] / point['distinct']:.1%}; forward x{raw / point['today']:.1f} today, "
                  f"x{raw / point['reuse']:.1f} reuse ({point['today'] / point['reuse']:.2f}x fewer bytes; "
                  f"{point['today'] / point['reuse_ids_known']:.2f}x if the receiver knows the ids); "
                  f"loss {loss.item():.4f}  [{time.time() - t0:.0f} s]", flush=True)
    raw = total["rows"] * args.dim * 4
    summary = {
        "forward_ratio_today": raw / total["today"], "forward_ratio_reuse": raw / total["reuse"],
        "forward_bytes_saved": 1 - total["reuse"] / total["today"],
        "forward_fewer_x": total["today"] / total["reuse"],
        "forward_fewer_x_ids_known": total["today"] / total["reuse_ids_known"],
        "run_ratio_today": 2 * raw / (total["today"] + total["grad"]),
        "run_ratio_reuse": 2 * raw / (total["reuse"] + total["grad"]),
        "run_ratio_reuse_ids_known": 2 * raw / (total["reuse_ids_known"] + total["grad"]),
        "held_share": total["held"] / total["distinct"],
        "reference_share": total["reference"] / total["distinct"],
        "residual_share": total["residual"] / total["distinct"],
        "held_rows_mib": sum(h.rows.numel() * 4 for h in held.values()) / 2**20,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "totals": total, "curve": curve,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
