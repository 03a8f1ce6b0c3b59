"""`kvtuner vllm-args profile.json`: the vLLM flags a vLLM profile stands for."""

from __future__ import annotations

import argparse
import shlex


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "vllm-args",
        help="print the vllm serve flags of a vLLM profile (--target vllm)",
        description="Print `--dtype ... --kv-cache-dtype D --kv-cache-dtype-skip-layers ...` "
        "for a profile written by `kvtuner search --target vllm`.",
    )
    p.add_argument("profile", help="vLLM profile JSON")
    p.add_argument("--model", help="also check the profile was made for this model (HF folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..profile import load_vllm_profile
    from ..runtime_loader.vllm.engine import check_model_dir, vllm_args

    profile = load_vllm_profile(args.profile)
    if args.model:
        check_model_dir(profile, args.model)
    print(shlex.join(vllm_args(profile)))
    return 0
