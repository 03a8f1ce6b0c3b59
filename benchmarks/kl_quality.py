"""Perplexity and KL(fp || config) of HF KV configs on the same test windows, paired.

``quality.py`` scores perplexity a row at a time (resumable, with decode speed); this scores
every config window by window beside fp, so each row also carries the mean per-token KL the
search minimises, measured on the test windows instead of the calibration ones. Where KL and
perplexity rank two configs differently, this is the table that shows it.
`kvtuner eval --kl` adds the same columns from the CLI, after its own perplexity pass.
Rows: fp, each ``--profile``, each ``--uniform`` name (quality.py's names). Perplexity as in
quality.py: K/V quantized before any query reads them (residual 0).

    OMP_NUM_THREADS=1 python benchmarks/kl_quality.py --model qwen2.5-0.5b \\
        --profile benchmarks/results/qwen25_profiles/kivi-4bit.json \\
        --uniform kivi-prerope-k5v4-g64 --name kl_qwen25_4bit

Writes benchmarks/results/<name>.json (rows with ``window_nll`` and ``window_kl``, the
``data`` block of quality.py: ``benchmarks/paired.py`` pairs its rows with quality.py's) and
prints a table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from kvtuner.calibration import load_model
from kvtuner.evaluation import hardware, load_eval_windows, parse_uniform
from kvtuner.evaluation.configs import profile_config
from kvtuner.evaluation.divergence import WindowScores, config_scores
from kvtuner.profile import ModelFingerprint, write_json_atomic

RESULTS = Path(__file__).parent / "results"


def _row(config, scores: WindowScores, fp_scores: WindowScores, fingerprint, seq_len: int) -> dict:
    fp = fp_scores.result
    acct = config.accounting(fingerprint, seq_len)
    return {
        "name": config.name,
        "kind": config.kind,
        "bytes_per_token": round(acct["bytes_per_token"], 2),
        "ppl": round(scores.result.ppl, 4),
        "delta_ppl_pct": round(scores.result.delta_pct(fp), 3),
        "delta_se_pct": round(scores.result.delta_se_pct(fp), 3),
        "window_nll": [round(x, 4) for x in scores.result.window_nll],
        **scores.divergence_fields(fp_scores),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--profile", action="append", default=[], help="profile JSON (repeatable)")
    p.add_argument("--uniform", default="", help="uniform rows, comma list (quality.py names)")
    p.add_argument("--num-windows", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--dataset", default=None)
    p.add_argument("--name", default="kl_quality", help="results file stem")
    args = p.parse_args(argv)
    cli = shlex.join(sys.argv[1:] if argv is None else argv)
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/kl_quality.py {cli}"
    model, tokenizer = load_model(args.model, device="cpu", dtype="float32")
    fingerprint = ModelFingerprint.from_config(model.config)
    configs = [profile_config(path, model.config) for path in args.profile]
    configs += parse_uniform(args.uniform, fingerprint) if args.uniform else []
    if not configs:
        p.error("nothing to score: pass --profile and/or --uniform")
    windows = load_eval_windows(
        tokenizer, dataset=args.dataset, num_windows=args.num_windows, seq_len=args.seq_len
    )
    scores = config_scores(model, windows, configs)
    fp = scores["fp"].result
    rows = [{"name": "fp", "kind": "fp", "ppl": round(fp.ppl, 4),
             "window_nll": [round(x, 4) for x in fp.window_nll]}]  # fmt: skip
    print(f"{'config':<34} {'B/token':>8} {'Δppl %':>16} {'KL vs fp':>20} {'top-1 = fp %':>16} "
          f"{'ΔNLL fp right / wrong':>22}")  # fmt: skip
    for config in configs:
        row = _row(config, scores[config.name], scores["fp"], fingerprint, windows.seq_len)
        rows.append(row)
        print(f"{row['name']:<34} {row['bytes_per_token']:>8.0f} "
              f"{row['delta_ppl_pct']:+8.3f} ± {row['delta_se_pct']:.3f} "
              f"{row['kl']:10.5f} ± {row['kl_se']:.5f} "
              f"{100 * row['top1_agree']:7.2f} ± {100 * row['top1_agree_se']:.2f} "
              f"{row['dnll_fp_right']:+10.4f} / {row['dnll_fp_wrong']:+.4f}")  # fmt: skip
    out = RESULTS / f"{args.name}.json"
    write_json_atomic(out, {"command": command, "hardware": hardware(), "model": args.model,
                            "data": windows.describe(), "rows": rows})  # fmt: skip
    share = scores["fp"].divergence_fields(scores["fp"])["fp_right_share"]
    print(f"fp ppl {fp.ppl:.4f}; fp's top-1 is the text's token at {100 * share:.1f}% of positions")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
