"""Accuracy per config x length (and x depth) with 95 % Wilson intervals; table and JSON."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

Z95 = 1.959964

__all__ = ["format_retrieval_table", "summarize", "wilson"]


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` successes in ``n`` trials (0, 1 when n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _cell(records: list[dict[str, Any]]) -> dict[str, Any]:
    n, k = len(records), sum(bool(r["correct"]) for r in records)
    lo, hi = wilson(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi]}


def summarize(
    records: Iterable[dict[str, Any]], kv_bytes: dict[tuple[str, int], dict[str, int]]
) -> dict[str, list[dict[str, Any]]]:
    """``rows``: one per (config, length), in first-seen order, with KV bytes at that length
    (``kv_bytes[(config, length)]`` = {"kv_bytes", "fp16_bytes"}); ``cells``: per depth too."""
    by_row: dict[tuple, list] = defaultdict(list)
    by_cell: dict[tuple, list] = defaultdict(list)
    for r in records:
        by_row[(r["config"], r["length"])].append(r)
        by_cell[(r["config"], r["length"], float(r["depth"]))].append(r)
    rows = [
        {"config": c, "length": n, **_cell(rs), **kv_bytes.get((c, n), {})}
        for (c, n), rs in by_row.items()
    ]
    cells = [
        {"config": c, "length": n, "depth": d, **_cell(rs)}
        for (c, n, d), rs in sorted(by_cell.items(), key=lambda kv: kv[0][1:])
    ]
    return {"rows": rows, "cells": cells}


def format_retrieval_table(summary: dict[str, list[dict[str, Any]]], task: str) -> str:
    """Plain-text table: config, length, samples, accuracy, 95 % interval, KV MiB, x fp16."""
    head = (
        f"{'config':<28} {'length':>7} {'n':>4} {'acc %':>6} {'95% CI':>13} {'KV MiB':>8} "
        f"{'xfp16':>6}"
    )
    lines = [f"task {task}", head, "-" * len(head)]
    for r in summary["rows"]:
        lo, hi = (100 * x for x in r["ci95"])
        kv = r.get("kv_bytes")
        ratio = kv / r["fp16_bytes"] if kv and r.get("fp16_bytes") else float("nan")
        lines.append(
            f"{r['config']:<28} {r['length']:>7} {r['n']:>4} {100 * r['accuracy']:>6.1f} "
            f"{f'[{lo:.0f}, {hi:.0f}]':>13} {(kv or 0) / 2**20:>8.2f} {ratio:>6.3f}"
        )
    return "\n".join(lines)
