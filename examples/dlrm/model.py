"""DLRM pieces: bottom MLP, local embedding tables, dot interaction, top MLP.

The model is split the way hybrid parallelism splits it: `DenseArch` (bottom MLP, interaction,
top MLP) is replicated on every rank and trained data-parallel; `LocalTables` holds only the
embedding tables this rank owns and is trained model-parallel (exchange.py moves its lookups).
"""

import math

import torch
from torch import nn


def mlp(sizes, last_activation):
    """Linear layers sizes[0] -> sizes[1] -> ... with ReLU between them (and after the last one
    when last_activation)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def interact(bottom, lookups):
    """Dot interaction of DLRM: all pairwise dot products of the bottom-MLP output and the
    embedding lookups (each pair once, no self-products), concatenated after the bottom output.

    Arguments:
        bottom: (b, D) bottom-MLP output.
        lookups: (b, T, D) embedding lookups of the T tables, in global table order.
    Returns:
        (b, D + (T+1)*T/2) input of the top MLP.
    """
    feats = torch.cat([bottom.unsqueeze(1), lookups], dim=1)  # (b, T+1, D)
    dots = torch.bmm(feats, feats.transpose(1, 2))  # (b, T+1, T+1)
    n = feats.shape[1]
    i, j = torch.tril_indices(n, n, offset=-1, device=feats.device)
    return torch.cat([bottom, dots[:, i, j]], dim=1)


class DenseArch(nn.Module):
    """Bottom MLP on the 13 dense features, dot interaction, top MLP to one logit.

    Arguments:
        n_dense: dense features (13 for Criteo).
        n_tables: embedding tables (26).
        dim: embedding dimension D (the bottom MLP's output size).
        bottom: hidden sizes of the bottom MLP.
        top: hidden sizes of the top MLP.
    """

    def __init__(self, n_dense, n_tables, dim, bottom, top):
        super().__init__()
        self.bottom = mlp([n_dense] + list(bottom) + [dim], last_activation=True)
        n_inter = dim + (n_tables + 1) * n_tables // 2
        self.top = mlp([n_inter] + list(top) + [1], last_activation=False)

    def forward_bottom(self, dense):
        return self.bottom(dense)

    def forward_top(self, bottom_out, lookups):
        return self.top(interact(bottom_out, lookups)).squeeze(1)


class LocalTables(nn.Module):
    """The embedding tables one rank owns.

    Each table's initial values depend only on (seed, table index), never on which rank owns it,
    so runs with different placements or compressors start from the same model. Init is
    uniform(-1/sqrt(rows), 1/sqrt(rows)) as in the DLRM reference.

    Arguments:
        cardinalities: rows of every table (all T, in global order).
        owned: indices of the tables this rank holds.
        dim: embedding dimension D.
        seed: init seed.
        sparse: produce sparse gradients (cheap updates of big tables).
    """

    def __init__(self, cardinalities, owned, dim, seed, sparse=True):
        super().__init__()
        self.owned, self.dim = list(owned), dim
        self.tables = nn.ModuleList()
        for t in self.owned:
            n = cardinalities[t]
            emb = nn.Embedding(n, dim, sparse=sparse)
            gen = torch.Generator().manual_seed(seed * 1000 + t)
            bound = 1.0 / math.sqrt(n)
            with torch.no_grad():
                emb.weight.uniform_(-bound, bound, generator=gen)
            self.tables.append(emb)

    def forward(self, ids):
        """Lookups of the owned tables.

        Arguments:
            ids: (B, T) int64 ids of the whole global batch, all T tables.
        Returns:
            (n_owned, B, D) lookups, tables in `owned` order (one id a field: sum-pooling of a
            single id is the lookup itself).
        """
        if not self.owned:
            return torch.zeros((0, ids.shape[0], self.dim), device=ids.device)
        return torch.stack([emb(ids[:, t]) for t, emb in zip(self.owned, self.tables)])
