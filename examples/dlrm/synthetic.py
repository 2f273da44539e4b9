"""Synthetic click logs at Criteo scale with a planted, learnable signal.

Features follow the Kaggle layout: 13 dense count features (log-normal counts, some missing, the
same log(1+x) transform as the real loader) and 26 categorical fields whose table sizes are the
published Kaggle cardinalities capped at ``max_table_rows``; ids are Zipf-skewed (exponent ~1.1),
like real categorical traffic where a few values carry most lookups.

Labels come from a fixed random "teacher": logit = bias + linear(dense) + a weight per
(table, id) + dot products of small per-id vectors for a few table pairs, then Bernoulli. The
teacher's per-id parameters are hashes of (seed, table, id, component), so they cost no memory
at any table size, and the DLRM's embeddings + dot interaction can learn them: quality
differences between runs are measurable, which the 8,000 real rows are too few for.

Rows are generated in fixed chunks of CHUNK_ROWS, each from its own random stream keyed by
(seed, split, chunk index): any row range is reproducible on any rank without generating what
precedes it, the data does not depend on the batch size, and 1M+ rows need no more memory than
one batch.
"""

import numpy as np

from data import KAGGLE_CARDINALITIES, N_DENSE, N_SPARSE

CHUNK_ROWS = 4096
ZIPF_EXPONENT = 1.1
SPLITS = {"train": 0, "test": 1}

# Teacher scales, chosen so the click rate is ~0.25 and the teacher's own AUC ~0.8 (neither
# trivial nor hopeless for a small DLRM); see test_dlrm.py for the checks.
_BIAS = -1.5
_ID_SCALE = 0.22
_DENSE_SCALE = 0.25
_PAIR_DIM = 4
_PAIR_SCALE = 0.4
_PAIRS = [(0, 1), (2, 3), (4, 5), (6, 7), (9, 10), (11, 12), (14, 15), (20, 23)]


def _mix64(x):
    """splitmix64 finalizer: a bijective scramble of uint64 (numpy wraps on overflow)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash_normal(seed, table, ids, component):
    """Standard normal values that are a pure function of (seed, table, id, component)."""
    key = np.uint64((seed * 1000003 + table * 1009 + component * 7919 + 1) & 0xFFFFFFFFFFFFFFFF)
    h1 = _mix64(ids.astype(np.uint64) ^ _mix64(np.full(1, key, np.uint64)))
    h2 = _mix64(h1 ^ np.uint64(0x632BE59BD9B4E019))
    # Uniforms in (0, 1) from the top 53 bits, then Box-Muller.
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    u2 = ((h2 >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def zipf_ids(u, n, exponent=ZIPF_EXPONENT):
    """Maps uniforms to ids 0..n-1 with P(id = k) roughly proportional to (k+1)^-exponent.

    The inverse CDF of the continuous power law on [1, n+1), floored: O(1) memory for any n,
    unlike a table of n probabilities (the largest Kaggle table has 10M rows).
    """
    a = 1.0 - exponent
    x = (1.0 + u * ((n + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, n - 1)


class SyntheticCriteo:
    """A deterministic stream of synthetic rows.

    Arguments:
        n_train: rows in the train split.
        n_test: rows in the test split.
        seed: fixes the teacher and every row.
        max_table_rows: cap on each table's rows (None: the full published cardinalities).
    """

    def __init__(self, n_train, n_test, seed, max_table_rows=None):
        self.n = {"train": int(n_train), "test": int(n_test)}
        self.seed = int(seed)
        self.cardinalities = [c if max_table_rows is None else min(c, max_table_rows)
                              for c in KAGGLE_CARDINALITIES]
        rng = np.random.default_rng([self.seed, 99])
        # Per dense feature: log-normal count parameters, missing rate and teacher weight.
        self._dense_mu = rng.uniform(0.0, 3.0, N_DENSE)
        self._dense_sigma = rng.uniform(0.5, 1.5, N_DENSE)
        self._dense_missing = rng.uniform(0.0, 0.4, N_DENSE)
        self._dense_w = rng.normal(0.0, _DENSE_SCALE, N_DENSE)
        self._dense_center = self._dense_mu * (1.0 - self._dense_missing)
        self._cache = {}

    def __len__(self):
        return self.n["train"]

    def chunk(self, split, index):
        """Rows [index*CHUNK_ROWS, (index+1)*CHUNK_ROWS) of a split (the last may be shorter).

        Returns:
            (dense float32 (m, 13), sparse int64 (m, 26), labels float32 (m,)).
        """
        key = (split, index)
        if key not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[key] = self._generate(split, index)
        return self._cache[key]

    def rows(self, split, start, stop):
        """Rows [start, stop) of a split, assembled from chunks."""
        if not 0 <= start <= stop <= self.n[split]:
            raise ValueError("row range [%d, %d) outside the %s split of %d rows"
                             % (start, stop, split, self.n[split]))
        parts = []
        for c in range(start // CHUNK_ROWS, (stop + CHUNK_ROWS - 1) // CHUNK_ROWS):
            lo, hi = max(start - c * CHUNK_ROWS, 0), min(stop - c * CHUNK_ROWS, CHUNK_ROWS)
            parts.append(tuple(a[lo:hi] for a in self.chunk(split, c)))
        if not parts:
            return (np.zeros((0, N_DENSE), np.float32), np.zeros((0, N_SPARSE), np.int64),
                    np.zeros(0, np.float32))
        return tuple(np.concatenate(a) for a in zip(*parts))

    def _generate(self, split, index):
        m = min(CHUNK_ROWS, self.n[split] - index * CHUNK_ROWS)
        rng = np.random.default_rng([self.seed, SPLITS[split], index])
        counts = np.floor(np.exp(rng.normal(self._dense_mu, self._dense_sigma, (m, N_DENSE))))
        missing = rng.random((m, N_DENSE)) < self._dense_missing
        dense = np.log1p(counts)
        dense[missing] = 0.0
        u = rng.random((m, N_SPARSE))
        sparse = np.stack([zipf_ids(u[:, t], n) for t, n in enumerate(self.cardinalities)], axis=1)
        p = 1.0 / (1.0 + np.exp(-self.teacher_logit(dense, sparse)))
        labels = (rng.random(m) < p).astype(np.float32)
        return dense.astype(np.float32), sparse, labels

    def teacher_logit(self, dense, sparse):
        """The planted logit of each row (float64 (m,)); the best any model can do is to learn it."""
        # Centred on each feature's typical value (a constant, so the logit is per-row).
        z = _BIAS + (dense - self._dense_center) @ self._dense_w
        for t in range(N_SPARSE):
            z = z + _ID_SCALE * _hash_normal(self.seed, t, sparse[:, t], 0)
        for a, b in _PAIRS:
            va = np.stack([_hash_normal(self.seed, a, sparse[:, a], 1 + k) for k in range(_PAIR_DIM)], 1)
            vb = np.stack([_hash_normal(self.seed, b, sparse[:, b], 1 + k) for k in range(_PAIR_DIM)], 1)
            z = z + _PAIR_SCALE * (va * vb).sum(axis=1) / np.sqrt(_PAIR_DIM)
        return z
