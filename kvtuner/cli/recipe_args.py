"""`kvtuner recipe-args PROFILE --engine E`: a recipe profile in engine E's own form."""

from __future__ import annotations

import argparse
import json
import shlex

FORMS = ("vllm", "trtllm", "modelopt")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "recipe-args",
        help="print a recipe profile (--target recipe) in an engine's own form",
        description="vllm: the `vllm serve` KV flags; trtllm: TensorRT-LLM's per-layer "
        "KvCacheConfig.dtype; modelopt: hf_quant_config.json's quantization section (the map "
        "vLLM's and TensorRT-LLM's ModelOpt readers take). `kvtuner export-hf --recipe` writes "
        "it, with the per-layer scales, into the HF folder it makes.",
    )
    p.add_argument("profile", help="recipe profile JSON")
    p.add_argument("--engine", choices=FORMS, required=True, help="the form to print")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..profile.recipe_profile import load_recipe_profile
    from ..runtime_loader.engines import quant_config, recipe_vllm_args, trtllm_kv_dtype

    layers = load_recipe_profile(args.profile).recipe.layers
    if args.engine == "trtllm":
        print(trtllm_kv_dtype(layers))
    elif args.engine == "modelopt":
        print(json.dumps(quant_config(layers), indent=2))
    else:
        flags, needs_map = recipe_vllm_args(layers)
        print(shlex.join(flags))
        if needs_map:
            print("# mixed formats: vLLM reads the per-layer map from the checkpoint "
                  "(kvtuner export-hf --recipe); vLLM 0.32 has no reader for it yet")  # fmt: skip
    return 0
