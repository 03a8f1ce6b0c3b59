"""Heatmap of a sensitivity file: layer x (K, then V, at each measured width), log10 KL (viz)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..errors import KVTunerError
from .sensitivity import PARTS, Sensitivity

__all__ = ["plot_sensitivity"]


def _matrix(sens: Sensitivity) -> tuple[list[str], list[list[float]]]:
    """Column labels and rows [layer][column] of log10 KL (a 1e-12 floor keeps zeros finite)."""
    labels = [f"{p.upper()}{b}" for p in PARTS for b in sens.bits]
    rows = [
        [math.log10(max(sens.kl(i, p, b), 1e-12)) for p in PARTS for b in sens.bits]
        for i in range(len(sens.layers))
    ]
    return labels, rows


def plot_sensitivity(sens: Sensitivity, path: str | os.PathLike) -> Path:
    """Write the heatmap PNG; needs matplotlib (``pip install 'kvtuner[viz]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KVTunerError("--plot needs matplotlib: pip install 'kvtuner[viz]'") from None
    labels, rows = _matrix(sens)
    height = max(3.0, 0.22 * len(rows) + 1.5)
    fig, ax = plt.subplots(figsize=(5.0, height))
    image = ax.imshow(rows, aspect="auto", cmap="magma_r", interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yticks(range(len(rows)))
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("quantized tensor and bits (only this one, only this layer)")
    ax.set_ylabel("layer")
    d = sens.data
    ax.set_title(
        f"{sens.model_id}: KL vs fp\n{d.get('num_samples')}x{d.get('seq_len')} tokens", fontsize=9
    )
    fig.colorbar(image, ax=ax, label="log10 KL(fp || quantized)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
