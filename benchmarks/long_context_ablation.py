"""Which layers / tensors carry a profile's retrieval loss: the profile with one part raised.

Variants of PROFILE (exported_configs/MODEL/PROFILE.json), each evaluated on the same samples
as benchmarks/long_context.py (same results file, so fp and the profile's answers are reused):
- ``values>=3``: every value stream below 3 bits raised to 3 bits;
- ``keys>=3``: every key stream below 3 bits raised to 3 bits;
- ``layer0-8bit``: layer 0's keys and values at 8 bits (the first layer's sink-heavy attention).

    OMP_NUM_THREADS=1 python benchmarks/long_context_ablation.py --profile per-token-3bit \
        --lengths 512 --depths 0.1 0.5 0.9 --samples 3 --no-chat-template
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
from long_context import results_stem

from kvtuner.calibration import load_model
from kvtuner.evaluation.configs import EvalConfig, profile_config
from kvtuner.evaluation.retrieval import (
    RetrievalSettings,
    evaluate_retrieval,
    format_retrieval_table,
)
from kvtuner.profile import ModelFingerprint

ROOT = Path(__file__).resolve().parents[1]


def _raised(spec, bits: int):
    return spec if spec.bits >= bits else dataclasses.replace(spec, bits=bits)


def variants(base: EvalConfig) -> list[EvalConfig]:
    def row(name, fn):
        specs = tuple(fn(s) for s in base.specs)
        return EvalConfig(f"{base.name}:{name}", "profile", specs, source=base.source)

    return [
        row("values>=3", lambda s: dataclasses.replace(s, v=_raised(s.v, 3))),
        row("keys>=3", lambda s: dataclasses.replace(s, k=_raised(s.k, 3))),
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
    args = p.parse_args()
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
        model, tokenizer, [base, *variants(base)], settings, model_name=args.model,
        results_path=stem + ".jsonl",
    )  # fmt: skip
    print(format_retrieval_table(report, args.task))
    return 0


if __name__ == "__main__":
    sys.exit(main())
