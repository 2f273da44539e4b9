"""Evaluation metrics of a click model, in numpy (no scikit-learn needed)."""

import numpy as np


def auc(labels, scores):
    """Area under the ROC curve: the probability that a random positive scores above a random
    negative, ties counting one half (the Mann-Whitney U statistic over average ranks).

    Arguments:
        labels: (n,) 0/1.
        scores: (n,) any monotone score (logits or probabilities).
    Returns:
        float in [0, 1]; nan when only one class is present.
    """
    labels = np.asarray(labels, np.float64)
    scores = np.asarray(scores, np.float64)
    n_pos = labels.sum()
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    # Tied scores share the mean of the ranks they span (1-based).
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0
    ranks = mean_rank[inverse]
    return float((ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels, probs, eps=1e-7):
    """Mean binary cross-entropy in nats, probabilities clipped to [eps, 1-eps]."""
    p = np.clip(np.asarray(probs, np.float64), eps, 1.0 - eps)
    y = np.asarray(labels, np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)))


def accuracy(labels, probs):
    """Fraction of rows where (prob > 0.5) equals the label."""
    return float(np.mean((np.asarray(probs) > 0.5) == (np.asarray(labels) > 0.5)))


def evaluate(labels, logits):
    """auc, logloss and accuracy of logits against labels, as a dict."""
    probs = 1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64)))
    return {"auc": auc(labels, logits), "logloss": logloss(labels, probs),
            "accuracy": accuracy(labels, probs), "eval_rows": int(len(labels))}
