"""Paired comparison of two rows of a quality results JSON, window by window.

Each row of ``benchmarks/quality.py`` (and ``vllm_quality.py``) keeps ``window_nll``: the summed
NLL of every evaluation window, the same windows for every row. For ``A:B`` this prints the mean
per-window difference of A's NLL minus B's, in nats per predicted token (negative: A is better),
its standard error over the windows, and on how many windows A is better; with both rows' bytes
per token, so "equal or fewer bytes" can be read off.

    python benchmarks/paired.py benchmarks/results/quality_qwen25_32.json \\
        kivi-3bit:kivi3 kivi-0.263x:kivi3+8bit-l22 [--out paired.json]

``--also FILE`` adds the rows of another results JSON measured on the same windows (its
``data`` must equal the first file's), so rows from separate runs can be paired.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from kvtuner.profile import write_json_atomic


def paired(rows: dict[str, dict], a: str, b: str, tokens: int) -> dict:
    """A minus B per window, in nats per predicted token: mean, standard error, A's wins."""
    da, db = rows[a]["window_nll"], rows[b]["window_nll"]
    diffs = [(x - y) / tokens for x, y in zip(da, db, strict=True)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) if len(diffs) > 1 else 0.0
    return {
        "a": a,
        "b": b,
        "a_bytes_per_token": rows[a].get("bytes_per_token"),
        "b_bytes_per_token": rows[b].get("bytes_per_token"),
        "mean_nats_per_token": round(mean, 5),
        "se": round(math.sqrt(var / len(diffs)), 5),
        "a_better_windows": sum(d < 0 for d in diffs),
        "windows": len(diffs),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a quality results JSON with window_nll per row")
    ap.add_argument("pairs", nargs="+", help="A:B row names (A minus B)")
    ap.add_argument("--out", type=Path, help="write the comparisons as JSON too")
    ap.add_argument(
        "--also", type=Path, action="append", default=[], help="rows of another results JSON"
    )
    args = ap.parse_args(argv)
    paths = [args.results, *args.also]
    results = [json.loads(path.read_text()) for path in paths]
    windows = results[0].get("data") or results[0]["windows"]  # quality.py / vllm_quality.py
    rows = {}
    for path, result in zip(paths, results, strict=True):
        if (result.get("data") or result["windows"]) != windows:
            print(f"paired.py: {path} was measured on other windows", file=sys.stderr)
            return 2
        rows |= {r["name"]: r for r in result["rows"] if "window_nll" in r}
    tokens = windows["seq_len"] - 1  # predicted tokens per window
    out = []
    for pair in args.pairs:
        a, sep, b = pair.partition(":")
        if not sep or a not in rows or b not in rows:
            print(f"paired.py: {pair!r} is not A:B of rows in {args.results}", file=sys.stderr)
            return 2
        out.append(paired(rows, a, b, tokens))
    print(f"{'A':>22} {'B':>22} {'bytes A/B':>13} {'A - B nats/tok':>18} {'A better':>9}")
    for c in out:
        nbytes = f"{c['a_bytes_per_token']:.0f}/{c['b_bytes_per_token']:.0f}"
        diff = f"{c['mean_nats_per_token']:+.4f} ± {c['se']:.4f}"
        wins = f"{c['a_better_windows']}/{c['windows']}"
        print(f"{c['a']:>22} {c['b']:>22} {nbytes:>13} {diff:>18} {wins:>9}")
    if args.out:
        write_json_atomic(args.out, {"results": [str(p) for p in paths], "comparisons": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
