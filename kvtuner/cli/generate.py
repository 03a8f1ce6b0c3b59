"""`kvtuner generate`: a greedy completion through the packed cache, and the KV memory it used."""

from __future__ import annotations

import argparse

from ..errors import KVTunerError
from .output import Verbosity, add_verbosity_arguments
from .placement_args import add_placement_arguments, placement_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="complete a prompt with a profile's packed KV cache")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", default="smollm2-135m", help="hub id, local dir, .gguf, or alias")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", help="profile JSON")
    which.add_argument("--uniform", help="a uniform config name instead, e.g. kivi4")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--residual-length",
        type=int,
        help="newest tokens kept unquantized (KIVI-style window; default 128)",
    )
    p.add_argument(
        "--pack-chunk",
        type=int,
        help="tokens leave the residual window this many at a time (1 = exactly the window; "
        "default 32)",
    )
    p.add_argument(
        "--static",
        action="store_true",
        help="a static packed cache: every token quantized, the decode step compiled on CUDA "
        "(CUDA graphs)",
    )
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="feed the prompt as raw text even if the tokenizer has a chat template",
    )
    add_verbosity_arguments(p)
    add_placement_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..calibration import load_model, model_fingerprint
    from ..evaluation.configs import uniform_specs
    from ..evaluation.generation import generate_text
    from ..profile import load_profile

    if args.max_new_tokens <= 0:
        raise KVTunerError("--max-new-tokens must be positive")
    if not args.prompt.strip():
        raise KVTunerError("empty prompt")
    window = {"residual_length": args.residual_length, "pack_chunk": args.pack_chunk}
    if args.static and any(v is not None for v in window.values()):
        raise KVTunerError("--static quantizes every token: drop --residual-length/--pack-chunk")
    defaults = {"residual_length": 128, "pack_chunk": 32}
    window = {k: defaults[k] if v is None else v for k, v in window.items()}
    where = placement_from_args(args)
    fingerprint = model_fingerprint(args.model)  # config only: check inputs before the weights
    if args.profile:
        specs = load_profile(args.profile, fingerprint)
    else:
        specs = uniform_specs(args.uniform, fingerprint)
    Verbosity.from_args(args).apply()
    model, tokenizer = load_model(args.model, device=where.device, dtype=where.dtype)
    done = generate_text(
        model,
        tokenizer,
        args.prompt,
        specs,
        max_new_tokens=args.max_new_tokens,
        **({"static": True} if args.static else window),
        chat=not args.no_chat_template,
    )
    print(done.text)
    print(done.memory_line())
    return 0
