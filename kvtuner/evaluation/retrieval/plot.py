"""Retrieval plots: accuracy vs context length (one line per config, 95 % bars), and a
depth x length heat map per config (one panel each)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["plot_retrieval"]


def _lines(plt, report: dict[str, Any]):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    configs = dict.fromkeys(r["config"] for r in report["rows"])
    for c in configs:
        rows = sorted((r for r in report["rows"] if r["config"] == c), key=lambda r: r["length"])
        x = [r["length"] for r in rows]
        y = [100 * r["accuracy"] for r in rows]
        err = [[y_ - 100 * r["ci95"][0] for y_, r in zip(y, rows, strict=True)],
               [100 * r["ci95"][1] - y_ for y_, r in zip(y, rows, strict=True)]]  # fmt: skip
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=c)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accuracy % (95 % Wilson interval)")
    ax.set_ylim(-3, 103)
    ax.set_title(f"{report['model']}: {report['settings']['task']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _heat(plt, report: dict[str, Any]):
    configs = list(dict.fromkeys(r["config"] for r in report["rows"]))
    lengths = sorted({c["length"] for c in report["cells"]})
    depths = sorted({c["depth"] for c in report["cells"]})
    fig, axes = plt.subplots(1, len(configs), figsize=(2.2 + 2.2 * len(configs), 3.8),
                             squeeze=False)  # fmt: skip
    for ax, name in zip(axes[0], configs, strict=True):
        grid = [[float("nan")] * len(lengths) for _ in depths]
        for c in report["cells"]:
            if c["config"] == name:
                grid[depths.index(c["depth"])][lengths.index(c["length"])] = 100 * c["accuracy"]
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("length")
    axes[0][0].set_ylabel("depth")
    fig.colorbar(im, ax=axes[0].tolist(), label="accuracy %")
    return fig


def plot_retrieval(report: dict[str, Any], path: str | os.PathLike) -> list[Path]:
    """PATH: accuracy vs length; PATH's stem + ``-depth.png``: the heat maps. Both atomic."""
    from ..plot import pyplot, save_figure

    plt = pyplot()
    path = Path(path)
    heat = path.with_name(f"{path.stem}-depth.png")
    return [save_figure(_lines(plt, report), path), save_figure(_heat(plt, report), heat)]
