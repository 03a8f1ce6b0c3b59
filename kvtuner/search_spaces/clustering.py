"""Layer clustering: layers with similar sensitivity share one (k_bits, v_bits) pair.

Shrinks the space from |pairs|^L to |pairs|^C. Deterministic k-means (Lloyd) on the log-KL
features of :meth:`LossTable.features`, initialised at quantiles of total sensitivity.
"""

from __future__ import annotations

import numpy as np

from ..errors import KVTunerError
from .losses import LossTable

__all__ = ["cluster_layers"]


def cluster_layers(losses: LossTable, num_clusters: int, *, iters: int = 100) -> list[list[int]]:
    """Partition layers 0..L-1 into <= num_clusters groups, each sorted, ordered by first layer."""
    n = losses.num_layers
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
        raise KVTunerError(f"--num-clusters must be a positive int, got {num_clusters!r}")
    if num_clusters >= n:
        return [[i] for i in range(n)]
    x = losses.features()  # [L, 6]
    order = np.argsort(x.sum(axis=1), kind="stable")
    picks = order[np.linspace(0, n - 1, num_clusters).round().astype(int)]
    centers = x[picks].copy()  # [C, 6]
    labels = np.full(n, -1)
    for _ in range(iters):
        new = np.argmin(((x[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)  # [L]
        if np.array_equal(new, labels):
            break
        labels = new
        for c in range(num_clusters):
            if (labels == c).any():  # an emptied cluster keeps its old centre
                centers[c] = x[labels == c].mean(axis=0)
    groups = [sorted(np.flatnonzero(labels == c).tolist()) for c in range(num_clusters)]
    return sorted((g for g in groups if g), key=lambda g: g[0])
