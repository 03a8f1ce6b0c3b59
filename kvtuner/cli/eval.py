"""`kvtuner eval`: perplexity, KV bytes and decode speed of profiles and uniform baselines vs fp."""

from __future__ import annotations

import argparse

from ..errors import KVTunerError
from .eval_long import add_long_context_arguments, check_long_context_args, run_retrieval
from .output import Verbosity, add_verbosity_arguments
from .placement_args import add_placement_arguments, placement_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..evaluation.data import DEFAULT_NUM_WINDOWS, DEFAULT_SEQ_LEN
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
        choices=("auto", "on", "off"),
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


def _quanto_rows(mode: str, fingerprint):
    from ..evaluation.configs import QUANTO_BITS, EvalConfig
    from ..evaluation.quanto import quanto_missing

    if mode == "off":
        return []
    missing = quanto_missing()
    if fingerprint.layer_types is not None:
        missing = "transformers' QuantizedCache refuses sliding-window layers"
    if missing:
        if mode == "on":
            raise KVTunerError(f"--hf-quanto on: {missing}")
        return []
    return [EvalConfig(f"hf-quanto{b}", "hf-quanto", quanto_bits=b) for b in QUANTO_BITS]


def build_configs(args: argparse.Namespace, fingerprint) -> list:
    """Every requested row, validated against the model's fingerprint (before loading weights)."""
    from ..evaluation.configs import parse_uniform, profile_config

    configs = [profile_config(p, fingerprint) for p in args.profile]
    configs += parse_uniform(args.uniform, fingerprint) if args.uniform else []
    configs += _quanto_rows(args.hf_quanto, fingerprint)
    names = [c.name for c in configs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise KVTunerError(f"two configs share the name {dupes[0]!r}; rename a profile file")
    return configs


def run(args: argparse.Namespace) -> int:
    import torch

    from ..calibration import load_model, model_fingerprint
    from ..evaluation import (
        DecodeSettings,
        evaluate,
        format_table,
        load_eval_windows,
        plot_report,
        write_report,
    )

    retrieval = args.task != "perplexity"
    if not args.profile and not args.uniform and not retrieval:
        raise KVTunerError("nothing to evaluate: give --profile PATH and/or --uniform NAMES")
    check_long_context_args(args)
    if args.kl and (retrieval or args.context_length):
        raise KVTunerError(
            "--kl scores whole windows: use it with --task perplexity and no --context-length"
        )
    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    decode = (
        None
        if args.no_decode
        else DecodeSettings(
            args.decode_prompt_tokens,
            args.decode_steps,
            args.decode_repeats,
            args.residual_length,
            args.pack_chunk,
        )
    )
    where = placement_from_args(args)
    configs = build_configs(args, model_fingerprint(args.model))
    verbosity = Verbosity.from_args(args)
    verbosity.apply()
    model, tokenizer = load_model(args.model, device=where.device, dtype=where.dtype)
    if retrieval:
        run_retrieval(args, model, tokenizer, configs)
        return 0
    if args.context_length:
        from .eval_long import run_perplexity_lengths

        kw = dict(tokenizer=tokenizer, decode=decode, log=verbosity.info)
        run_perplexity_lengths(args, model, configs, kw)
        return 0
    windows = load_eval_windows(
        tokenizer, dataset=args.dataset, num_windows=args.num_windows, seq_len=args.seq_len
    )
    report = evaluate(
        model, windows, configs, model_name=args.model, decode=decode, log=verbosity.info
    )
    if args.kl:
        from ..evaluation.divergence import add_divergence

        add_divergence(report, model, windows, configs)
    print(format_table(report))
    if args.output:
        print(f"wrote {write_report(report, args.output)}")
    if args.plot:
        print(f"wrote {plot_report(report, args.plot)}")
    return 0
