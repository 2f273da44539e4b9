"""Data folders as users have them, and rows streamed from them.

Two layouts are recognised (`find_layout`):
  * Criteo Kaggle: ``train.txt`` and, if present, ``dev.txt``/``test.txt``. The competition's
    ``test.txt`` has no labels (39 fields); such a file is left out, and the run says so.
  * Criteo Terabyte: ``day_0`` ... ``day_23``, plain or gzipped (``day_0.gz``), read in day order.
    The last day present is held out (the Terabyte convention holds out day_23).
Without a labelled held-out file the last tenth of the training rows is held out, and the run
says that too. Any file may be gzipped (``.gz``); it is decompressed as it is read.

Streaming (`RowStream`) reads the training files in order without holding them: global batch k
is lines ``[k*B, (k+1)*B)`` of the files concatenated, and each rank parses only its slice of
every batch (it still reads past the other ranks' lines: text has no index).
"""

import gzip
import itertools
import os
import re

import numpy as np

import data


class Layout:
    """The files of a data folder.

    Attributes:
        kind: "kaggle" or "terabyte".
        train: training files, in reading order.
        held_out: labelled files held out for evaluation ([]: the training rows' last tenth).
        notes: what was left out or held out, in words, for the run's log.
    """

    def __init__(self, kind, train, held_out, notes):
        self.kind, self.train, self.held_out, self.notes = kind, train, held_out, notes


def open_text(path):
    """A data file as text lines; a ``.gz`` file is decompressed as it is read."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="ascii", errors="replace")
    return open(path, "r", encoding="ascii", errors="replace")


def field_count(path):
    """Tab-separated fields on the file's first line (0 for an empty file)."""
    with open_text(path) as f:
        line = f.readline()
    return len(line.rstrip("\r\n").split("\t")) if line else 0


def _pick(data_dir, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    return None


def find_layout(data_dir):
    """The Layout of a Criteo Kaggle or Terabyte folder; DataError for anything else."""
    if not os.path.isdir(data_dir):
        raise data.DataError("--data %s is not a folder (expected one holding train.txt, or "
                             "day_0 ... day_23)" % data_dir)
    train = _pick(data_dir, "train.txt")
    notes = []
    if train:
        kind, train, held_out = "kaggle", [train], []
        for split in ("dev.txt", "test.txt"):
            path = _pick(data_dir, split)
            if path is None:
                continue
            if field_count(path) == data.N_FIELDS - 1:
                notes.append("%s has no labels (39 fields, like the Kaggle competition's test "
                             "set): not used" % os.path.basename(path))
            else:
                held_out.append(path)
    else:
        days = {}
        for name in os.listdir(data_dir):
            m = re.fullmatch(r"day_(\d+)(\.gz)?", name)
            if m:
                if int(m.group(1)) in days:
                    raise data.DataError("%s holds day_%s twice (plain and .gz); keep one"
                                         % (data_dir, m.group(1)))
                days[int(m.group(1))] = os.path.join(data_dir, name)
        if not days:
            raise data.DataError("%s holds neither train.txt (Criteo Kaggle) nor day_0 ... day_23 "
                                 "(Criteo Terabyte, plain or .gz)" % data_dir)
        paths = [days[d] for d in sorted(days)]
        kind = "terabyte"
        train, held_out = (paths[:-1], paths[-1:]) if len(paths) > 1 else (paths, [])
    if held_out:
        notes.append("held out: %s" % ", ".join(os.path.basename(p) for p in held_out)
                     + (" (the last day present)" if kind == "terabyte" else ""))
    else:
        notes.append("held out: the last 10%% of the training rows (%s has no labelled "
                     "dev.txt/test.txt or second day file)" % data_dir)
    return Layout(kind, train, held_out, notes)


def count_rows(paths):
    """Lines in the files (a pass over the bytes, nothing parsed)."""
    total = 0
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                total += block.count(b"\n")
    return total


def _lines(paths):
    """(path, line number, line) of the files concatenated."""
    for path in paths:
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                yield path, lineno, line


def parse_lines(numbered):
    """Parsed rows of [(path, line number, line), ...]: (labels, dense, ids) as data.read_raw."""
    labels, dense, ids = [], [], []
    for path, group in itertools.groupby(numbered, key=lambda x: x[0]):
        group = list(group)
        fields = []
        for _, lineno, line in group:
            row = line.rstrip("\r\n").split("\t")
            if len(row) != data.N_FIELDS:
                raise data.DataError("%s line %d has %d tab-separated fields, expected %d (label, "
                                     "13 integer, 26 categorical)" % (path, lineno, len(row),
                                                                      data.N_FIELDS))
            fields.append(row)
        data.parse_chunk(fields, path, group[0][1], labels, dense, ids)
    return np.concatenate(labels), np.concatenate(dense), np.concatenate(ids)


class RowStream:
    """This rank's slices of consecutive global batches of the files' rows, read in order.

    Arguments:
        paths: the files, in order.
        batch_size: global batch B; world ranks take B/world consecutive rows of it each.
        rows: rows that form the stream (the rest of the files is not read).
    """

    def __init__(self, paths, batch_size, rows):
        self.paths, self.batch_size, self.rows = paths, batch_size, rows
        self._lines, self._next = None, None  # open iterator, and the batch it is at

    def batch(self, epoch, k, rank, world):
        """(labels, dense, ids) of this rank's rows of global batch k of an epoch."""
        if self._next != (epoch, k):
            # A new epoch (or a resumed run) starts from the files' beginning again.
            self._lines = _lines(self.paths)
            for _ in itertools.islice(self._lines, k * self.batch_size):
                pass
        b = self.batch_size // world
        block = list(itertools.islice(self._lines, self.batch_size))
        if len(block) < self.batch_size or (k + 1) * self.batch_size > self.rows:
            raise data.DataError("the training files ended after %d rows, before batch %d"
                                 % (k * self.batch_size + len(block), k + 1))
        self._next = (epoch, k + 1)
        return parse_lines(block[rank * b:(rank + 1) * b])


def read_rows(paths, start, stop):
    """(labels, dense, ids) of rows [start, stop) of the files concatenated."""
    return parse_lines(list(itertools.islice(_lines(paths), start, stop)))


def published_cardinalities(layout):
    return data.TERABYTE_CARDINALITIES if layout.kind == "terabyte" else data.KAGGLE_CARDINALITIES


def load_splits(data_dir, categorical="vocab", max_table_rows=None, max_rows=None):
    """Every file of a data folder in memory, encoded.

    Arguments:
        data_dir: a Criteo Kaggle or Terabyte folder (see find_layout).
        categorical: "vocab" (fitted on the training files, OOV row 0) or "hash".
        max_table_rows: cap on rows per table (None: no cap for vocab; the published
            cardinalities for hash).
        max_rows: read at most this many rows of each file.
    Returns:
        dict name -> data.Dataset: "train" (the training files concatenated), then each
        labelled held-out file under its name without ".txt"/".gz" ("dev", "test", "day_23").
    """
    layout = find_layout(data_dir)
    raw = {"train": [data.read_raw(p, max_rows) for p in layout.train]}
    for path in layout.held_out:
        raw[re.sub(r"(\.txt)?(\.gz)?$", "", os.path.basename(path))] = [data.read_raw(p, max_rows)
                                                                        for p in [path]]
    raw = {k: tuple(np.concatenate(parts) for parts in zip(*v)) for k, v in raw.items()}
    encode, sizes = data.encoder(categorical, raw["train"][2], max_table_rows,
                                 published_cardinalities(layout))
    return {name: data.Dataset(dense, encode(ids), labels, sizes)
            for name, (labels, dense, ids) in raw.items()}
