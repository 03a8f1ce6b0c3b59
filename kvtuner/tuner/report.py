"""Outputs of a search besides the profile: summary table, Pareto-set files, Pareto-front plot."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..profile import Profile, write_json_atomic
from .results import Baseline, Measured

__all__ = ["Baseline", "format_summary", "write_pareto_dir", "plot_pareto"]


def format_summary(best: Measured, baselines: Sequence[Baseline], budget_label: str) -> str:
    """Chosen profile vs uniform baselines, most memory first."""
    head = (
        f"{'config':<22} {'nominal':>7} {'effect.':>7} {'bytes/tok':>9} {'KL vs fp':>10}  "
        f"{'vs chosen':>9}  budget {budget_label}"
    )
    rows = [head, "-" * len(head)]
    rows.append(
        f"{'searched (trial ' + str(best.number) + ')':<22} {best.nominal_bits:>7.3f} "
        f"{best.effective_bits:>7.3f} {best.bytes_per_token:>9.0f} {best.kl:>10.5f}  "
        f"{'1.00x':>9}  fits"
    )
    for b in sorted(baselines, key=lambda b: (-b.bytes_per_token, b.label)):
        ratio = b.kl / best.kl if best.kl > 0 else float("inf")
        rows.append(
            f"{'uniform ' + b.label:<22} {b.nominal_bits:>7.3f} {b.effective_bits:>7.3f} "
            f"{b.bytes_per_token:>9.0f} {b.kl:>10.5f}  {ratio:>8.2f}x  "
            f"{'fits' if b.fits else 'over'}"
        )
    return "\n".join(rows)


def write_pareto_dir(directory: str | os.PathLike, profiles: Sequence[Profile]) -> list[Path]:
    """One profile per Pareto point (fewest bytes first) plus ``pareto.json`` listing them."""
    directory = Path(directory)
    paths, index = [], []
    for i, profile in enumerate(profiles):
        path = directory / f"pareto-{i:02d}-{profile.effective_bits:.3f}bits.json"
        write_json_atomic(path, profile.to_dict())
        paths.append(path)
        index.append(
            {
                "file": path.name,
                "kl": profile.metrics.get("kl"),
                "hash": profile.hash,
                "nominal_bits": profile.budget["nominal_bits"],
                "effective_bits": profile.budget["effective_bits"],
                "bytes_per_token": profile.budget["bytes_per_token"],
            }
        )
    write_json_atomic(directory / "pareto.json", {"pareto": index})
    return paths


def plot_pareto(
    path: str | os.PathLike,
    measured: Sequence[Measured],
    front: Sequence[Measured],
    best: Measured,
    baselines: Sequence[Baseline],
    title: str,
) -> Path:
    """KL vs effective bits: every measured trial, the Pareto front, uniforms, the choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.scatter(
        [m.effective_bits for m in measured],
        [m.kl for m in measured],
        s=10,
        color="0.7",
        label="measured trials",
    )
    ax.step(
        [m.effective_bits for m in front],
        [m.kl for m in front],
        where="post",
        color="tab:blue",
        label="Pareto front",
    )
    for b in baselines:
        ax.scatter([b.effective_bits], [b.kl], marker="x", color="tab:red", s=40)
        ax.annotate(
            b.label, (b.effective_bits, b.kl), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.scatter([], [], marker="x", color="tab:red", label="uniform baselines")
    ax.scatter(
        [best.effective_bits],
        [best.kl],
        marker="*",
        s=160,
        color="tab:green",
        zorder=5,
        label=f"chosen (KL {best.kl:.4f})",
    )
    ax.set_yscale("log")
    ax.set_xlabel("effective bits per element (scales and zeros included)")
    ax.set_ylabel("KL(fp || quantized), nats/token")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return path
