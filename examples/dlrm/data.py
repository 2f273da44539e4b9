"""Reader for click logs in the Criteo Kaggle ``train.txt`` format.

One row a line, 40 tab-separated fields: the label (0/1), 13 integer features I1..I13 and 26
categorical features C1..C26 as hex hashes; an empty field is a missing value. Any file in this
format is accepted (the bundled sample, the full Kaggle or Terabyte files); rows are parsed in
chunks, so memory is what the parsed arrays need (~120 bytes a row), not the text.

Categorical ids become table rows in one of two ways:
  * ``vocab``: a vocabulary per field built from the train file, most frequent values first,
    row 0 reserved for values unseen in train (the OOV bucket). Best on small samples.
  * ``hash``: a multiplicative hash of the 32-bit id into ``min(cap, published cardinality)``
    buckets. Needs no pass over the data; the choice for the full files.
"""

import gzip
import os

import numpy as np

N_DENSE = 13
N_SPARSE = 26
N_FIELDS = 1 + N_DENSE + N_SPARSE
TABLE_NAMES = ["C%d" % (i + 1) for i in range(N_SPARSE)]

# Published cardinalities of C1..C26 in the full Kaggle data (DLRM reference code); see data/README.md.
KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
# ... and in the full Terabyte data, unhashed (data/README.md): the hash buckets of day_N folders.
TERABYTE_CARDINALITIES = [
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10, 2209,
    11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35]

# A missing categorical value is its own category; hex ids are < 2**32, so this cannot collide.
MISSING_ID = np.uint64(1 << 32)


class DataError(ValueError):
    """A data file or data option that cannot be used; the message says which and why."""


class Dataset:
    """Rows held in memory.

    Attributes:
        dense: float32 array (n, 13), already transformed by `transform_dense`.
        sparse: int64 array (n, 26), table row of each categorical field.
        labels: float32 array (n,), 0 or 1.
        cardinalities: rows of each of the 26 tables.
    """

    def __init__(self, dense, sparse, labels, cardinalities):
        self.dense, self.sparse, self.labels = dense, sparse, labels
        self.cardinalities = list(cardinalities)

    def __len__(self):
        return len(self.labels)


def transform_dense(raw, missing):
    """log(1 + x) of the integer features, negatives clamped to 0 (as the DLRM reference does:
    I2 holds small negative counts), missing values set to 0.

    Arguments:
        raw: float64 array (n, 13) of the parsed integers.
        missing: bool array (n, 13), True where the field was empty.
    Returns:
        float32 array (n, 13).
    """
    x = np.log1p(np.maximum(raw, 0.0))
    x[missing] = 0.0
    return x.astype(np.float32)


def read_raw(path, max_rows=None, chunk_rows=65536):
    """Parses a file in the Kaggle format.

    Arguments:
        path: the file.
        max_rows: stop after this many rows (None: the whole file).
        chunk_rows: rows parsed per numpy chunk (bounds the memory held as Python strings).
    Returns:
        (labels float32 (n,), dense float32 (n, 13) transformed, ids uint64 (n, 26) with
        MISSING_ID where a field was empty).
    Raises:
        DataError naming the file and line for a missing file, a row without 40 fields,
        or a field that does not parse.
    """
    if not os.path.isfile(path):
        raise DataError("data file %s does not exist (expected the Criteo Kaggle train.txt format: "
                        "40 tab-separated fields a line)" % path)
    labels, dense, ids = [], [], []
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="ascii", errors="replace") as f:
        rows = []
        for lineno, line in enumerate(f, 1):
            if max_rows is not None and lineno > max_rows:
                break
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != N_FIELDS:
                hint = (": no label, like the Kaggle competition's test.txt, so it cannot train or "
                        "evaluate" if len(fields) == N_FIELDS - 1 else "")
                raise DataError("%s line %d has %d tab-separated fields, expected %d (label, 13 integer, "
                                "26 categorical)%s" % (path, lineno, len(fields), N_FIELDS, hint))
            rows.append(fields)
            if len(rows) == chunk_rows:
                parse_chunk(rows, path, lineno - len(rows) + 1, labels, dense, ids)
                rows = []
        if rows:
            parse_chunk(rows, path, lineno - len(rows) + 1, labels, dense, ids)
    if not labels:
        raise DataError("data file %s has no rows" % path)
    return np.concatenate(labels), np.concatenate(dense), np.concatenate(ids)


def parse_chunk(rows, path, first_line, labels, dense, ids):
    """Parses rows of 40 fields (line `first_line` of `path` first) onto the three lists."""
    n = len(rows)
    lab = np.empty(n, np.float32)
    raw = np.zeros((n, N_DENSE), np.float64)
    missing = np.zeros((n, N_DENSE), bool)
    cat = np.empty((n, N_SPARSE), np.uint64)
    for i, fields in enumerate(rows):
        try:
            lab[i] = _label(fields[0])
            for j in range(N_DENSE):
                v = fields[1 + j]
                if v == "":
                    missing[i, j] = True
                else:
                    raw[i, j] = int(v)
            for j in range(N_SPARSE):
                v = fields[1 + N_DENSE + j]
                cat[i, j] = MISSING_ID if v == "" else _hex32(v)
        except ValueError as e:
            raise DataError("%s line %d: %s" % (path, first_line + i, e)) from None
    labels.append(lab)
    dense.append(transform_dense(raw, missing))
    ids.append(cat)


def _label(v):
    if v not in ("0", "1"):
        raise ValueError("label must be 0 or 1, got %r" % v)
    return float(v)


def _hex32(v):
    x = int(v, 16)
    if not 0 <= x < (1 << 32):
        raise ValueError("categorical id must be at most 8 hex digits, got %r" % v)
    return x


class Vocabulary:
    """Per-field map from raw id to table row, fitted on the train file.

    Row 0 of every table is the OOV bucket (ids unseen in train, or beyond the cap); seen ids get
    rows 1.. in order of decreasing frequency (ties by id, so fitting is deterministic).
    """

    def __init__(self, keys):
        self.keys = keys  # per field: sorted unique kept ids (uint64) and their rows

    @classmethod
    def fit(cls, ids, max_table_rows=None):
        """Arguments:
            ids: uint64 array (n, 26) from `read_raw`.
            max_table_rows: cap on rows per table, OOV row included (None: no cap).
        """
        keys = []
        for j in range(ids.shape[1]):
            uniq, counts = np.unique(ids[:, j], return_counts=True)
            order = np.lexsort((uniq, -counts))  # most frequent first
            if max_table_rows is not None:
                order = order[:max_table_rows - 1]
            kept = uniq[order]
            rows = np.arange(1, len(kept) + 1, dtype=np.int64)
            srt = np.argsort(kept)
            keys.append((kept[srt], rows[srt]))
        return cls(keys)

    @property
    def cardinalities(self):
        return [len(k) + 1 for k, _ in self.keys]

    def encode(self, ids):
        out = np.zeros(ids.shape, np.int64)
        for j, (kept, rows) in enumerate(self.keys):
            if len(kept) == 0:
                continue
            col = ids[:, j]
            pos = np.minimum(np.searchsorted(kept, col), len(kept) - 1)
            hit = kept[pos] == col
            out[hit, j] = rows[pos[hit]]
        return out


def hash_sizes(max_table_rows, published=KAGGLE_CARDINALITIES):
    """Buckets per table in hash mode: min(cap, published cardinality)."""
    return [c if max_table_rows is None else min(c, max_table_rows) for c in published]


def hash_encode(ids, sizes):
    """Multiplicative (Fibonacci) hash of each 32-bit id, then modulo the table size: ids that
    differ only in high bits still spread over the buckets."""
    mixed = (ids * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(20)
    return (mixed % np.asarray(sizes, np.uint64)).astype(np.int64)


def encoder(categorical, train_ids, max_table_rows, published=KAGGLE_CARDINALITIES):
    """(encode, table sizes) of an encoding: "vocab" fitted on `train_ids` (uint64 (n, 26)), or
    "hash" into min(cap, published cardinality) buckets (train_ids unused)."""
    if categorical == "vocab":
        vocab = Vocabulary.fit(train_ids, max_table_rows)
        return vocab.encode, vocab.cardinalities
    if categorical == "hash":
        sizes = hash_sizes(max_table_rows, published)
        return (lambda ids: hash_encode(ids, sizes)), sizes
    raise DataError("categorical encoding must be 'vocab' or 'hash', got %r" % categorical)
