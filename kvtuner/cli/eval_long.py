"""`kvtuner eval --task ...`: the flags of retrieval tasks and long-context perplexity."""

from __future__ import annotations

import argparse
from typing import Any


def add_long_context_arguments(p: argparse.ArgumentParser) -> None:
    from ..evaluation.retrieval import DEFAULT_DEPTHS, HAYSTACKS
    from ..evaluation.settings import DEFAULT_SCORE_TOKENS, TASK_CHOICES

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
        default=DEFAULT_SCORE_TOKENS,
        help="perplexity with --context-length: score the last this many tokens of each window",
    )


def long_context_fields(args: argparse.Namespace) -> dict[str, Any]:
    """These flags as :class:`~kvtuner.evaluation.settings.EvalSettings` keywords."""
    return {
        "task": args.task,
        "context_lengths": args.context_length,
        "depths": args.depths,
        "samples": args.samples,
        "haystack": args.haystack,
        "seed": args.seed,
        "results": args.results,
        "chat": not args.no_chat_template,
        "score_tokens": args.score_tokens,
    }
