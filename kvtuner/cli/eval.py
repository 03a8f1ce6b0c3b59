"""`kvtuner eval`: perplexity, KV bytes and decode speed of profiles and uniform baselines vs fp."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .eval_long import add_long_context_arguments, long_context_fields
from .output import Verbosity, add_verbosity_arguments
from .placement_args import add_placement_arguments

if TYPE_CHECKING:
    from ..evaluation.settings import EvalSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..evaluation.data import DEFAULT_NUM_WINDOWS, DEFAULT_SEQ_LEN
    from ..evaluation.settings import QUANTO_MODES
    from ..evaluation.speed import DecodeSettings

    d = DecodeSettings()
    p = sub.add_parser(
        "eval",
        help="perplexity / memory / decode speed of profiles and baselines vs fp",
        description="fp is always measured in the same run. Uniform names: kvB, kBvC (per-token "
        "g32 asym), kiviB / kivi-kBvC (keys per-channel g32); a had- / hadk- / hadv- prefix "
        "Hadamard-rotates K and V / K / V (kivi-hadv-kv4: KIVI keys, rotated values).",
    )
    p.add_argument("--model", default="smollm2-135m", help="hub id, local dir, .gguf, or alias")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="PATH",
        help="profile JSON to evaluate (repeatable)",
    )
    p.add_argument(
        "--uniform",
        action="append",
        default=[],
        metavar="NAMES",
        help="comma-separated uniform baselines, e.g. kv8,kv4,k8v4,kv2,kivi4,kivi2",
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="evaluation text (default: the WikiText-2 test split embedded in the package)",
    )
    p.add_argument("--num-windows", type=int, default=DEFAULT_NUM_WINDOWS)
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="tokens per window")
    p.add_argument(
        "--hf-quanto",
        choices=QUANTO_MODES,
        default="auto",
        help="add transformers' QuantizedCache (quanto, 4 and 2 bits) as a peer",
    )
    p.add_argument("--no-decode", action="store_true", help="skip the decode-speed measurement")
    p.add_argument("--decode-steps", type=int, default=d.steps)
    p.add_argument("--decode-prompt-tokens", type=int, default=d.prompt_tokens)
    p.add_argument("--decode-repeats", type=int, default=d.repeats)
    p.add_argument(
        "--residual-length",
        type=int,
        default=d.residual_length,
        help="unquantized newest tokens while decoding (perplexity always uses 0)",
    )
    p.add_argument(
        "--pack-chunk",
        type=int,
        default=d.pack_chunk,
        help="while decoding, tokens leave the residual window this many at a time",
    )
    p.add_argument(
        "--kl",
        action="store_true",
        help="also score KL(fp || row), top-1 agreement with fp and the NLL change where fp's "
        "top-1 is right / wrong, on the same windows (one more pass over them; perplexity "
        "task without --context-length)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    add_placement_arguments(p)
    add_long_context_arguments(p)
    p.add_argument("--output", default=None, help="write the report as JSON here")
    p.add_argument(
        "--plot",
        default=None,
        help="write a PNG here: Δppl vs effective bits (perplexity); accuracy vs length and "
        "PATH-depth.png, depth x length heat maps (retrieval tasks)",
    )
    add_verbosity_arguments(p)
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> EvalSettings:
    """The flags as :class:`~kvtuner.evaluation.settings.EvalSettings` (validated: bad input
    fails here, before the model loads)."""
    from ..evaluation.settings import EvalSettings

    return EvalSettings(
        model=args.model,
        profiles=args.profile,
        uniform=args.uniform,
        hf_quanto=args.hf_quanto,
        dataset=args.dataset,
        num_windows=args.num_windows,
        seq_len=args.seq_len,
        kl=args.kl,
        decode_speed=not args.no_decode,
        decode_prompt_tokens=args.decode_prompt_tokens,
        decode_steps=args.decode_steps,
        decode_repeats=args.decode_repeats,
        residual_length=args.residual_length,
        pack_chunk=args.pack_chunk,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        output=args.output,
        plot=args.plot,
        **long_context_fields(args),
    )


def run(args: argparse.Namespace) -> int:
    from ..evaluation.run import run_eval

    settings = settings_from_args(args)
    verbosity = Verbosity.from_args(args)
    verbosity.apply()
    outcome = run_eval(settings, log=verbosity.info, progress=verbosity.progress)
    for result in outcome.results:
        print(result.table)
        for path in result.written:
            print(f"wrote {path}")
    return 0
