"""Criteo-like embedding lookups for benchmarks: real ids from the bundled Kaggle rows, tables
initialised the way DLRM does (uniform in +-sqrt(1/n) for a table of n rows)."""
import pathlib

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = REPO / "data" / "criteo_kaggle_sample" / "train.txt"
N_DENSE, N_SPARSE = 13, 26

# Published cardinalities of the Criteo Kaggle categorical features (DLRM reference code).
KAGGLE_CARDINALITIES = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                        8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15,
                        286181, 105, 142572]


def load_sparse_ids(path=BUNDLED):
    """Per-table ids (int64 array rows x 26) from a Kaggle-format file, numbered by first
    appearance per column; an empty field is its own id."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Criteo rows not found at {path}; the repository bundles them under data/")
    vocabs = [dict() for _ in range(N_SPARSE)]
    rows = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 1 + N_DENSE + N_SPARSE:
                raise ValueError(f"{path}:{lineno}: {len(fields)} fields, expected {1 + N_DENSE + N_SPARSE}")
            cats = fields[1 + N_DENSE:]
            rows.append([vocabs[t].setdefault(v, len(vocabs[t])) for t, v in enumerate(cats)])
    return np.asarray(rows, dtype=np.int64), [len(v) for v in vocabs]


def uniform_tables(cardinalities, dim, seed=0):
    """DLRM's initialisation: table t is uniform in +-sqrt(1/n_t)."""
    g = torch.Generator().manual_seed(seed)
    tables = []
    for n in cardinalities:
        bound = (1.0 / max(n, 1)) ** 0.5
        tables.append((torch.rand(n, dim, generator=g) * 2 - 1) * bound)
    return tables


def criteo_batch_lookups(batch=2048, dim=32, seed=0, path=BUNDLED):
    """Lookups of the first `batch` bundled rows: a list of 26 tensors (batch x dim), one a table."""
    ids, cards = load_sparse_ids(path)
    if batch > len(ids):
        raise ValueError(f"batch {batch} exceeds the {len(ids)} rows in {path}")
    tables = uniform_tables(cards, dim, seed)
    ids = torch.from_numpy(ids[:batch])
    return [tables[t][ids[:, t]] for t in range(N_SPARSE)]


def synthetic_lookups(total_bytes, dim=32, seed=0, zipf=1.1, max_rows=100_000):
    """A float32 batch of about `total_bytes` of Criteo-scale lookups: 26 tables with the published
    cardinalities (capped at max_rows), Zipf-skewed ids, DLRM uniform init. Shape (rows, dim),
    table-major (all lookups of table 0, then table 1, ...)."""
    rng = np.random.default_rng(seed)
    rows_total = total_bytes // (4 * dim)
    per_table = rows_total // N_SPARSE
    g = torch.Generator().manual_seed(seed)
    parts = []
    for n in KAGGLE_CARDINALITIES:
        n = min(n, max_rows)
        bound = (1.0 / n) ** 0.5
        table = (torch.rand(n, dim, generator=g) * 2 - 1) * bound
        ranks = rng.zipf(zipf, size=per_table) - 1
        ids = torch.from_numpy(np.minimum(ranks, n - 1).astype(np.int64))
        parts.append(table[ids])
    return torch.cat(parts)


def realistic_lookups(total_bytes, dim=128, table_rows=1_000_000, zipf=1.04, seed=0,
                      with_ids=False):
    """A float32 batch of about `total_bytes` that duplicates like real lookups: ids drawn from a
    Zipf law (exponent `zipf`, ranks scattered over the table) into one table of `table_rows`
    rows with DLRM's init (uniform in +-sqrt(1/n)). With the defaults and 64 MB at dim 128 about
    30% of the rows are distinct (the measured share in DLRM batches), in random order, so a
    repeated row's first occurrence is far away in memory. Only the looked-up rows of the table
    are drawn, so the table itself costs no memory. Shape (rows, dim); with `with_ids` the pair
    (lookups, ids), ids the int64 key of each row (equal keys, equal rows)."""
    rng = np.random.default_rng(seed)
    rows = max(1, total_bytes // (4 * dim))
    ranks = np.arange(1, table_rows + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -zipf)
    cdf /= cdf[-1]
    ids = np.minimum(np.searchsorted(cdf, rng.random(rows)), table_rows - 1)
    distinct, inverse = np.unique(ids, return_inverse=True)
    g = torch.Generator().manual_seed(seed)
    bound = (1.0 / table_rows) ** 0.5
    table = (torch.rand(len(distinct), dim, generator=g) * 2 - 1) * bound
    keys = torch.from_numpy(inverse.astype(np.int64))
    return (table[keys], keys) if with_ids else table[keys]
