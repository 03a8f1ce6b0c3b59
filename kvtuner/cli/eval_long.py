"""`kvtuner eval --task ...`: retrieval tasks and long-context perplexity (arguments and run)."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import KVTunerError

TASK_CHOICES = ("perplexity", "passkey", "niah", "niah-multikey", "niah-multivalue", "vt")


def add_long_context_arguments(p: argparse.ArgumentParser) -> None:
    from ..evaluation.retrieval import DEFAULT_DEPTHS, HAYSTACKS

    g = p.add_argument_group("long context (retrieval tasks, long-context perplexity)")
    g.add_argument("--task", choices=TASK_CHOICES, default="perplexity")
    g.add_argument(
        "--context-length",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="prompt lengths in tokens (retrieval; required) / window lengths (perplexity)",
    )
    g.add_argument(
        "--depths",
        type=float,
        nargs="+",
        default=list(DEFAULT_DEPTHS),
        metavar="D",
        help="needle depths as fractions of the context (default: 0 0.25 0.5 0.75 1)",
    )
    g.add_argument("--samples", type=int, default=5, help="samples per length and depth")
    g.add_argument("--haystack", choices=HAYSTACKS, default="noise")
    g.add_argument("--seed", type=int, default=0, help="sample seed")
    g.add_argument(
        "--results",
        default=None,
        metavar="PATH",
        help="JSON-lines file of answered samples: a rerun skips what it holds (resume)",
    )
    g.add_argument(
        "--no-chat-template",
        action="store_true",
        help="raw prompts even if the tokenizer has a chat template",
    )
    g.add_argument(
        "--score-tokens",
        type=int,
        default=1024,
        help="perplexity with --context-length: score the last this many tokens of each window",
    )


def check_long_context_args(args: argparse.Namespace) -> None:
    """One-line errors before the model loads."""
    if args.task != "perplexity" and not args.context_length:
        raise KVTunerError(f"--task {args.task} needs --context-length N [N ...]")
    short = args.context_length and min(args.context_length) <= args.score_tokens
    if args.task == "perplexity" and short:
        raise KVTunerError("--context-length must exceed --score-tokens")
    if args.task != "perplexity":
        _settings(args)  # validates, before any weights load


def _settings(args: argparse.Namespace):
    from ..evaluation.retrieval import RetrievalSettings

    return RetrievalSettings(
        task=args.task,
        lengths=tuple(args.context_length),
        depths=tuple(args.depths),
        samples=args.samples,
        haystack=args.haystack,
        seed=args.seed,
        residual_length=args.residual_length,
        pack_chunk=args.pack_chunk,
        chat=not args.no_chat_template,
    )


def _per_length(path: str | None, n: int, many: bool) -> str | None:
    """``out.json`` -> ``out-8192.json`` when several lengths each write one."""
    if path is None or not many:
        return path
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}-{n}{p.suffix}"))


def run_perplexity_lengths(args, model, configs, evaluate_kw: dict[str, Any]) -> list:
    """One perplexity report per --context-length, each window's last --score-tokens scored;
    with several lengths, --output / --plot names get a ``-N`` suffix per length."""
    from ..evaluation import evaluate, format_table, load_eval_windows, plot_report, write_report

    reports = []
    for n in args.context_length:
        windows = load_eval_windows(
            evaluate_kw["tokenizer"], dataset=args.dataset, num_windows=args.num_windows, seq_len=n
        )
        report = evaluate(
            model,
            windows,
            configs,
            model_name=args.model,
            decode=evaluate_kw["decode"],
            log=evaluate_kw["log"],
            score_last=args.score_tokens,
        )
        print(format_table(report))
        many = len(args.context_length) > 1
        if args.output:
            print(f"wrote {write_report(report, _per_length(args.output, n, many))}")
        if args.plot:
            print(f"wrote {plot_report(report, _per_length(args.plot, n, many))}")
        reports.append(report)
    return reports


def run_retrieval(args, model, tokenizer, configs) -> dict[str, Any]:
    """Answer, score, print the table; write JSON (--output) and plots (--plot)."""
    from ..evaluation.retrieval import (
        evaluate_retrieval,
        format_retrieval_table,
        plot_retrieval,
        write_retrieval_report,
    )

    if any(c.kind == "hf-quanto" for c in configs):
        configs = [c for c in configs if c.kind != "hf-quanto"]
    report = evaluate_retrieval(
        model,
        tokenizer,
        configs,
        _settings(args),
        model_name=args.model,
        results_path=args.results,
        progress=not (args.no_progress or args.quiet),
    )
    print(format_retrieval_table(report, args.task))
    if args.output:
        print(f"wrote {write_retrieval_report(report, args.output)}")
    if args.plot:
        for path in plot_retrieval(report, args.plot):
            print(f"wrote {path}")
    return report
