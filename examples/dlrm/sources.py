"""Batches for data-parallel training: each rank takes its slice of every global batch.

Global batch k holds B rows; rank r trains on rows [r*b, (r+1)*b) of it (b = B/world), which is
the slice the embedding exchange delivers lookups for. The row order depends only on the seed
and the epoch, never on the compressor, so compressed and uncompressed runs see the same data.
"""

import numpy as np
import torch

import data
import synthetic


def _tensors(dense, sparse, labels):
    return torch.from_numpy(np.ascontiguousarray(dense)), torch.from_numpy(
        np.ascontiguousarray(sparse)), torch.from_numpy(np.ascontiguousarray(labels))


class FileSource:
    """Rows read from files in the Kaggle format, shuffled each epoch.

    Arguments:
        train, held_out: data.Dataset of training and evaluation rows.
        batch_size: global batch B.
        seed: fixes the per-epoch shuffles.
    """

    def __init__(self, train, held_out, batch_size, seed):
        self.train, self.held_out = train, held_out
        self.batch_size, self.seed = batch_size, seed
        self.cardinalities = train.cardinalities
        self.steps_per_epoch = len(train) // batch_size
        self.n_eval = len(held_out)

    def batch(self, epoch, k, rank, world):
        """This rank's slice of global batch k of an epoch: (dense, sparse, labels) tensors."""
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
        b = self.batch_size // world
        rows = perm[k * self.batch_size + rank * b:k * self.batch_size + (rank + 1) * b]
        return _tensors(self.train.dense[rows], self.train.sparse[rows], self.train.labels[rows])

    def eval_rows(self, start, stop):
        d = self.held_out
        return d.dense[start:stop], d.sparse[start:stop], d.labels[start:stop]


class SyntheticSource:
    """Rows of a SyntheticCriteo stream in order (they are i.i.d., so no shuffle is needed; the
    generator is seeded per chunk, so each rank generates only what its slices touch)."""

    def __init__(self, gen, batch_size):
        self.gen, self.batch_size = gen, batch_size
        self.cardinalities = gen.cardinalities
        self.steps_per_epoch = gen.n["train"] // batch_size
        self.n_eval = gen.n["test"]

    def batch(self, epoch, k, rank, world):
        b = self.batch_size // world
        start = k * self.batch_size + rank * b
        return _tensors(*self.gen.rows("train", start, start + b))

    def eval_rows(self, start, stop):
        return self.gen.rows("test", start, stop)


def eval_batches(source, rank, world, limit=None):
    """This rank's slices of the held-out rows, in global batches of B padded to full size (the
    exchange needs equal slices everywhere); yields (dense, sparse, labels, valid) tensors, valid
    False on padding rows.

    Arguments:
        limit: use only the first `limit` held-out rows (None: all).
    """
    n = source.n_eval if limit is None else min(limit, source.n_eval)
    big_b = source.batch_size
    b = big_b // world
    for start in range(0, n, big_b):
        lo = min(start + rank * b, n)
        hi = min(start + (rank + 1) * b, n)
        dense, sparse, labels = source.eval_rows(lo, hi)
        m = len(labels)
        pad = b - m
        valid = np.concatenate([np.ones(m, bool), np.zeros(pad, bool)])
        if pad:
            # Padding repeats row 0 of the held-out set: any valid ids work, they are masked out.
            d0, s0, _ = source.eval_rows(0, 1)
            dense = np.concatenate([dense, np.repeat(d0, pad, 0)])
            sparse = np.concatenate([sparse, np.repeat(s0, pad, 0)])
            labels = np.concatenate([labels, np.zeros(pad, np.float32)])
        yield _tensors(dense, sparse, labels) + (torch.from_numpy(valid),)


def build(args, world):
    """The source named by the arguments (--synthetic N or --data DIR)."""
    if args.synthetic:
        n_test = args.synthetic_test or max(args.synthetic // 10, args.batch_size)
        gen = synthetic.SyntheticCriteo(args.synthetic, n_test, args.seed, args.max_table_rows)
        return SyntheticSource(gen, args.batch_size)
    splits = data.load_splits(args.data, args.categorical, args.max_table_rows, args.max_rows)
    train = splits["train"]
    # dev and test are both held out (nothing is tuned on dev here): more rows, steadier metrics.
    parts = [splits[k] for k in ("dev", "test") if k in splits]
    if parts:
        held_out = data.Dataset(*(np.concatenate([getattr(p, f) for p in parts])
                                  for f in ("dense", "sparse", "labels")), train.cardinalities)
    else:
        # Only train.txt: hold out its last tenth.
        cut = len(train) - max(len(train) // 10, 1)
        rows = lambda s: data.Dataset(train.dense[s], train.sparse[s], train.labels[s],  # noqa: E731
                                      train.cardinalities)
        held_out, train = rows(slice(cut, None)), rows(slice(None, cut))
    return FileSource(train, held_out, args.batch_size, args.seed)
