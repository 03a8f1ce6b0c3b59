"""`kvtuner export-hf --model M --output DIR`: the plain HF folder SGLang serves, from a GGUF."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-hf",
        help="write a model (GGUF, alias) as the plain HF folder SGLang serves",
        description="Load the model (a .gguf file, an alias such as smollm2-135m, an HF folder "
        "or hub id) and save it with its tokenizer as an HF folder for "
        "`python -m sglang.launch_server --model-path DIR`. An existing HF folder at --output is "
        "used as is; two exports of the same model at once both succeed.",
    )
    p.add_argument("--model", required=True, help="hub id, local dir, .gguf or alias")
    p.add_argument("--output", required=True, help="the HF folder to write")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="weight dtype of the saved folder",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..calibration.hf_export import export_hf

    result = export_hf(args.model, args.output, dtype=args.dtype)
    how = "wrote" if result.written else "using the existing"
    print(f"kvtuner export-hf: {how} HF folder {result.path}")
    return 0
