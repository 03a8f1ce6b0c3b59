"""Δppl-vs-bits PNG of an EvalReport (matplotlib): a labelled front and a panel naming every row.

Many configs share an effective width (every 4-bit config stores 5 bits), so labelling every
point piles names on each other. The left panel labels only the Pareto front (no other row has
fewer or equal bits and lower Δppl) and the named peers (HF quanto); the right panel lists every
row as a bar, grouped by effective bits, so each name is readable.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import KVTunerError
from ..search_spaces import pareto
from .compare import EvalReport

__all__ = ["front_rows", "plot_report"]

STYLES = {  # kind -> (marker, colour)
    "uniform": ("o", "tab:blue"),
    "profile": ("*", "tab:red"),
    "hf-quanto": ("s", "tab:gray"),
}
LABELLED_KINDS = ("hf-quanto",)  # named peers: labelled wherever they fall
FLOOR = 1e-3  # Δppl % shown at least this (log axis; fp-identical rows stay visible)


def _delta(row: dict) -> float:
    return max(row["delta_ppl_pct"], FLOOR)


def front_rows(rows: list[dict]) -> list[dict]:
    """Rows no other row beats: fewer-or-equal effective bits and lower Δppl, or equal Δppl and
    fewer bits (rows tied on both are all kept). Sorted by effective bits."""
    items = [(r["effective_bits"], _delta(r), i) for i, r in enumerate(rows)]
    return [rows[i] for i in pareto.pareto_front(items, keep_ties=True)]


def _labels(front: list[dict], rows: list[dict]) -> dict[tuple[float, float], list[str]]:
    """Point -> names to write there: the front and the named peers; rows tied on both axes
    share one label (their names would print over each other)."""
    labelled = [*front, *(r for r in rows if r["kind"] in LABELLED_KINDS and r not in front)]
    names: dict[tuple[float, float], list[str]] = {}
    for r in labelled:
        names.setdefault((r["effective_bits"], _delta(r)), []).append(r["name"])
    return names


def _scatter_panel(ax, rows: list[dict]) -> None:
    for kind, (marker, color) in STYLES.items():
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            xs, ys = [r["effective_bits"] for r in mine], [_delta(r) for r in mine]
            ax.scatter(
                xs, ys, marker=marker, color=color, s=80 if kind == "profile" else 40, label=kind
            )
    front = front_rows(rows)
    ax.plot(
        [r["effective_bits"] for r in front],
        [_delta(r) for r in front],
        color="black",
        lw=0.8,
        ls="--",
        label="Pareto front",
    )
    for (x, y), names in _labels(front, rows).items():
        ax.annotate(" = ".join(names), (x, y), xytext=(5, 4), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("effective bits per element (scales/zeros included)")
    ax.set_ylabel("Δ perplexity vs fp, % (log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.margins(y=0.08)
    ax.legend(loc="upper right")


def _bar_panel(ax, rows: list[dict]) -> None:
    ordered = sorted(rows, key=lambda r: (-r["effective_bits"], -_delta(r)))
    ys = range(len(ordered))
    ax.barh(
        ys,
        [_delta(r) for r in ordered],
        color=[STYLES.get(r["kind"], ("", "tab:green"))[1] for r in ordered],
    )
    ax.set_yticks(ys, [f"{r['name']}  ({r['effective_bits']:g} b)" for r in ordered], fontsize=7)
    for y, r in zip(ys, ordered, strict=True):
        ax.annotate(
            f"{r['delta_ppl_pct']:+.2f}",
            (_delta(r), y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=6,
        )
    ax.set_xscale("log")
    ax.set_xlabel("Δ perplexity vs fp, % (log)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.margins(x=0.15)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or one line naming the ``viz`` extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KVTunerError("--plot needs matplotlib: pip install 'kvtuner[viz]'") from None
    return plt


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` as PNG at ``path`` atomically (temp file, then rename) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    fig.clf()
    pyplot().close(fig)
    os.replace(tmp, path)
    return path


def plot_report(report: EvalReport, path: str | os.PathLike) -> Path:
    """Write the two-panel PNG (needs matplotlib: ``pip install 'kvtuner[viz]'``), atomically."""
    plt = pyplot()
    rows = [r for r in report.rows if r["kind"] != "fp"]
    height = max(4.5, 0.2 * len(rows) + 1.2)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, height), gridspec_kw={"width_ratios": [3, 2]}
    )
    _scatter_panel(left, rows)
    _bar_panel(right, rows)
    fig.suptitle(f"{report.model}: {report.data['num_windows']}×{report.data['seq_len']} tokens")
    fig.tight_layout()
    return save_figure(fig, path)
