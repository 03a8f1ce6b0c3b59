"""Which layers / tensors carry a profile's retrieval loss: the profile with one part raised.

Variants of PROFILE (exported_configs/MODEL/PROFILE.json), each evaluated on the same samples
as benchmarks/long_context.py (same results file, so fp and the profile's answers are reused):
- ``values>=B``: every value stream below B bits (``--to-bits``, default 3) raised to B bits;
- ``keys>=B``: every key stream below B bits raised to B bits;
- ``layer0-8bit``: layer 0's keys and values at 8 bits (the first layer's sink-heavy attention).

    OMP_NUM_THREADS=1 python benchmarks/long_context_ablation.py --profile per-token-3bit \
        --lengths 512 --depths 0.1 0.5 0.9 --samples 3 --no-chat-template

Prints the table; writes it with the command to
benchmarks/results/long_context-MODEL-ablation-PROFILE[-toB].{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import torch
from long_context import results_stem

from kvtuner.calibration import load_model
from kvtuner.evaluation import hardware
from kvtuner.evaluation.configs import EvalConfig, profile_config
from kvtuner.evaluation.retrieval import (
    RetrievalSettings,
    evaluate_retrieval,
    format_retrieval_table,
)
from kvtuner.profile import ModelFingerprint, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _raised(spec, bits: int):
    return spec if spec.bits >= bits else dataclasses.replace(spec, bits=bits)


def variants(base: EvalConfig, to_bits: int = 3) -> list[EvalConfig]:
    def row(name, fn):
        specs = tuple(fn(s) for s in base.specs)
        return EvalConfig(f"{base.name}:{name}", "profile", specs, source=base.source)

    return [
        row(f"values>={to_bits}", lambda s: dataclasses.replace(s, v=_raised(s.v, to_bits))),
        row(f"keys>={to_bits}", lambda s: dataclasses.replace(s, k=_raised(s.k, to_bits))),
        row(
            "layer0-8bit",
            lambda s: (
                s if s.layer else dataclasses.replace(s, k=_raised(s.k, 8), v=_raised(s.v, 8))
            ),
        ),  # fmt: skip
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--profile", default="per-token-3bit")
    p.add_argument("--task", default="passkey")
    p.add_argument("--haystack", default="noise")
    p.add_argument("--lengths", type=int, nargs="+", default=[512])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--to-bits", type=int, default=3, choices=(3, 4, 5, 8))
    args = p.parse_args()
    command = "OMP_NUM_THREADS=1 python benchmarks/long_context_ablation.py " + shlex.join(
        sys.argv[1:]
    )
    torch.set_num_threads(1)
    model, tokenizer = load_model(args.model, dtype=torch.float32)
    fingerprint = ModelFingerprint.from_config(model.config)
    base = profile_config(str(ROOT / "exported_configs" / args.model / f"{args.profile}.json"),
                          fingerprint)  # fmt: skip
    settings = RetrievalSettings(
        args.task, tuple(args.lengths), tuple(args.depths), args.samples, args.haystack,
        chat=not args.no_chat_template,
    )  # fmt: skip
    stem = results_stem(args.model, args.task, args.haystack)
    report = evaluate_retrieval(
        model, tokenizer, [base, *variants(base, args.to_bits)], settings,
        model_name=args.model, results_path=stem + ".jsonl",
    )  # fmt: skip
    table = format_retrieval_table(report, args.task)
    print(table)
    suffix = "" if args.to_bits == 3 else f"-to{args.to_bits}"
    out = RESULTS / f"long_context-{args.model}-ablation-{args.profile}{suffix}"
    write_json_atomic(Path(f"{out}.json"), {"command": command, "hardware": hardware(),
                                                 "report": report})  # fmt: skip
    tmp = Path(f"{out}.md.tmp")
    tmp.write_text(f"`{command}`\n\n```\n{table}\n```\n")
    tmp.replace(f"{out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
