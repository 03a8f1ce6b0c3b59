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
    p.add_argument(
        "--recipe",
        help="a recipe profile (--target recipe): also write ModelOpt's per-layer KV map "
        "(hf_quant_config.json, config.json's quantization_config) and the per-layer "
        "k_scale/v_scale, the checkpoint form vLLM's and TensorRT-LLM's ModelOpt readers take",
    )
    p.set_defaults(func=run)


def _recipe_writer(path: str, model: str):
    from ..calibration import model_fingerprint
    from ..profile.recipe_profile import load_recipe_profile
    from ..runtime_loader.engines import quant_config, write_checkpoint_kv

    profile = load_recipe_profile(path)
    profile.check_model(model_fingerprint(model))
    quant_config(profile.recipe.layers)  # one line now, before the export, if it has no map
    return lambda folder: write_checkpoint_kv(folder, profile.recipe)


def run(args: argparse.Namespace) -> int:
    from ..calibration.hf_export import export_hf

    finish = _recipe_writer(args.recipe, args.model) if args.recipe else None
    result = export_hf(args.model, args.output, dtype=args.dtype, finish=finish)
    how = "wrote" if result.written else "using the existing"
    extra = f" with the KV recipe of {args.recipe}" if args.recipe else ""
    print(f"kvtuner export-hf: {how} HF folder {result.path}{extra}")
    return 0
