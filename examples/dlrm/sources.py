"""Batches for data-parallel training: each rank takes its slice of every global batch.

Global batch k holds B rows; rank r trains on rows [r*b, (r+1)*b) of it (b = B/world), which is
the slice the embedding exchange delivers lookups for. The row order depends only on the seed
and the epoch, never on the compressor, so compressed and uncompressed runs see the same data.
"""

import os

import numpy as np
import torch

import data
import files
import synthetic

# Held-out rows a streamed run keeps in memory unless --max-eval-rows says otherwise.
STREAM_EVAL_ROWS = 1_000_000
# Hash buckets per table unless --max-table-rows says otherwise.
HASH_TABLE_ROWS = 100_000


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


class StreamSource:
    """Rows streamed from the training files in order (no shuffle: day files are time-ordered),
    each rank parsing only its slice of every global batch; the held-out rows (at most
    --max-eval-rows) are the only ones held in memory.

    Arguments:
        layout: files.Layout of the folder.
        args: the run's arguments (batch size, steps, categorical encoding, caps).
    """

    def __init__(self, layout, args):
        self.batch_size = args.batch_size
        self.encode, self.cardinalities = data.encoder(
            args.categorical, None, args.max_table_rows, files.published_cardinalities(layout))
        cap = args.max_eval_rows
        if layout.held_out and args.steps:
            n_train = args.steps * args.batch_size  # no need to count: the run stops there
        else:
            n_train = files.count_rows(layout.train)
        if layout.held_out:
            labels, dense, ids = files.read_rows(layout.held_out, 0, cap)
        else:
            cut = n_train - max(n_train // 10, 1)
            labels, dense, ids = files.read_rows(layout.train, cut, min(n_train, cut + cap))
            n_train = cut
        if args.max_rows is not None:
            n_train = min(n_train, args.max_rows)
        self.held_out = data.Dataset(dense, self.encode(ids), labels, self.cardinalities)
        self.stream = files.RowStream(layout.train, args.batch_size, n_train)
        self.steps_per_epoch = n_train // args.batch_size
        self.n_eval = len(self.held_out)
        self.n_train = n_train

    def batch(self, epoch, k, rank, world):
        labels, dense, ids = self.stream.batch(epoch, k, rank, world)
        return _tensors(dense, self.encode(ids), labels)

    def eval_rows(self, start, stop):
        d = self.held_out
        return d.dense[start:stop], d.sparse[start:stop], d.labels[start:stop]


def build(args, world):
    """The source named by the arguments (--synthetic N or --data DIR), and what it holds out,
    in words (a list of lines for the run's log)."""
    if args.synthetic:
        n_test = args.synthetic_test or max(args.synthetic // 10, args.batch_size)
        gen = synthetic.SyntheticCriteo(args.synthetic, n_test, args.seed, args.max_table_rows)
        return SyntheticSource(gen, args.batch_size), [
            "synthetic: %d training rows, %d held out" % (args.synthetic, n_test)]
    layout = files.find_layout(args.data)
    if args.stream is None:
        args.stream = layout.kind == "terabyte"
    if args.categorical is None:
        args.categorical = "hash" if args.stream else "vocab"
    if args.categorical == "hash" and args.max_table_rows is None:
        # The published cardinalities reach 48M rows a table (17 GB of dim-16 tables for
        # Terabyte): more than a first run should allocate.
        args.max_table_rows = HASH_TABLE_ROWS
    if args.stream:
        if args.categorical == "vocab":
            raise data.DataError("--stream reads the files once, in order, so it needs "
                                 "--categorical hash (a vocabulary needs a pass over all of train)")
        if args.max_eval_rows is None:
            args.max_eval_rows = STREAM_EVAL_ROWS
        return StreamSource(layout, args), layout.notes + [
            "streaming %s in order, at most %d held-out rows in memory"
            % (", ".join(os.path.basename(p) for p in layout.train), args.max_eval_rows)]
    splits = files.load_splits(args.data, args.categorical, args.max_table_rows, args.max_rows)
    train = splits.pop("train")
    # dev and test are both held out (nothing is tuned on dev here): more rows, steadier metrics.
    parts = list(splits.values())
    if parts:
        held_out = data.Dataset(*(np.concatenate([getattr(p, f) for p in parts])
                                  for f in ("dense", "sparse", "labels")), train.cardinalities)
    else:
        cut = len(train) - max(len(train) // 10, 1)
        rows = lambda s: data.Dataset(train.dense[s], train.sparse[s], train.labels[s],  # noqa: E731
                                      train.cardinalities)
        held_out, train = rows(slice(cut, None)), rows(slice(None, cut))
    if args.max_eval_rows is not None:
        held_out = data.Dataset(held_out.dense[:args.max_eval_rows],
                                held_out.sparse[:args.max_eval_rows],
                                held_out.labels[:args.max_eval_rows], held_out.cardinalities)
    return FileSource(train, held_out, args.batch_size, args.seed), layout.notes
