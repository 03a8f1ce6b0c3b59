"""Presenting an EvalReport: text and Markdown tables, JSON (atomic); the PNG is in plot.py."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..profile import write_json_atomic
from .compare import EvalReport

__all__ = ["format_markdown", "format_table", "write_report"]


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


_COLUMNS = (
    ("config", "<22"),
    ("kind", "<9"),
    ("nom.bits", ">8"),
    ("eff.bits", ">8"),
    ("B/token", ">9"),
    ("x fp16", ">6"),
    ("ppl", ">9"),
    ("Δppl % ± se", ">16"),
    ("tok/s", ">7"),
    ("x dflt", ">6"),
    ("copy tok/s", ">10"),
    ("x dflt", ">6"),
)


# with `kvtuner eval --kl`: KL(fp || row) per token and the share of argmax tokens equal to fp's
_DIVERGENCE_COLUMNS = (("KL vs fp", ">9"), ("top-1=fp", ">8"))


def _columns(rows: list[dict]) -> tuple[tuple[str, str], ...]:
    return _COLUMNS + (_DIVERGENCE_COLUMNS if any("kl" in r for r in rows) else ())


def _cells(r: dict, columns: tuple) -> list[str]:
    delta = (
        "" if r["kind"] == "fp" else f"{r['delta_ppl_pct']:+.2f} ± {_fmt(r['delta_se_pct'], '.2f')}"
    )
    cells = [
        r["name"],
        r["kind"],
        f"{r['nominal_bits']:.2f}",
        f"{r['effective_bits']:.2f}",
        f"{r['bytes_per_token']:.1f}",
        f"{r['ratio_to_fp16']:.3f}",
        f"{r['ppl']:.4f}",
        delta,
        _fmt(r.get("decode_tok_s"), ".1f"),
        _fmt(r.get("decode_ratio"), ".2f"),
        _fmt(r.get("decode_tok_s_copy"), ".1f"),
        _fmt(r.get("decode_ratio_copy"), ".2f"),
    ]
    if len(columns) > len(_COLUMNS):
        agree = r.get("top1_agree")
        cells += [_fmt(r.get("kl"), ".5f"), "-" if agree is None else f"{100 * agree:.2f}%"]
    return cells


def format_table(report: EvalReport) -> str:
    """Text table; ``tok/s`` = decode with the packed cache (or default / quanto cache), ``copy`` =
    kvtuner's cache with its dequantized working copy; ``x dflt`` = paired ratio to default."""
    d, hw = report.data, report.hardware
    columns = _columns(report.rows)
    head = " ".join(format(name, fmt) for name, fmt in columns)
    lines = [
        f"model {report.model}  ({report.fingerprint.architecture}, {report.fingerprint.num_layers}"
        f" layers)  data {d['dataset']}: {d['num_windows']} x {d['seq_len']} tokens",
        f"hardware {hw['cpu']}, {hw['cores']} cores, torch threads {hw['torch_threads']}; "
        f"wall {report.wall_s:.0f} s",
        head,
        "-" * len(head),
    ]
    for r in report.rows:
        lines.append(
            " ".join(
                format(c, fmt) for c, (_, fmt) in zip(_cells(r, columns), columns, strict=True)
            )
        )
    return "\n".join(lines)


def format_markdown(report: EvalReport) -> str:
    """The same rows as a Markdown table (for the docs/results/ pages)."""
    columns = _columns(report.rows)
    head = "| " + " | ".join(name for name, _ in columns) + " |"
    rule = "|" + "|".join("---" if fmt.startswith("<") else "---:" for _, fmt in columns) + "|"
    body = ["| " + " | ".join(_cells(r, columns)) + " |" for r in report.rows]
    return "\n".join([head, rule, *body])


def write_report(report: EvalReport, path: str | os.PathLike) -> Path:
    write_json_atomic(path, report.to_dict())
    return Path(path)
