"""`kvtuner search --target vllm --kv-cache-dtype D ...`: the skip set for one vLLM KV dtype; its
flags, their :class:`~kvtuner.tuner.vllm.VllmSettings` and the printed summary."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .placement_args import placement_from_args

if TYPE_CHECKING:
    from ..tuner.vllm import VllmOutcome, VllmSettings


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM target (see docs/engines.md)")
    g.add_argument("--kv-cache-dtype", help="the vLLM dtype, e.g. fp8_e4m3 (--target vllm)")
    g.add_argument("--max-skip", type=int, help="skip at most this many layers (--target vllm)")
    g.add_argument(
        "--ppl-within",
        type=float,
        metavar="PCT",
        help="the fewest skipped layers whose calibration perplexity stays within PCT %% of "
        "fp's (--target vllm)",
    )
    g.add_argument(
        "--model-dtype",
        default="bfloat16",
        choices=("bfloat16", "float16", "float32"),
        help="the dtype vLLM serves the model in (skipped layers' bytes; default %(default)s)",
    )


def engine_run_kwargs(args: argparse.Namespace) -> dict:
    """The keywords every engine target's settings take from the flags: model, output, study,
    text and placement."""
    from ..tuner.study import StudySettings

    where = placement_from_args(args)
    study = StudySettings(n_trials=args.n_trials, storage=args.storage, study_name=args.study_name)
    return dict(model=args.model, output=args.output, study=study, dataset=args.dataset,
                num_samples=args.num_samples, seq_len=args.seq_len,
                confirm_samples=args.confirm_samples, device=where.device,
                dtype=where.dtype)  # fmt: skip


def check_no_pool_flags(args: argparse.Namespace) -> None:
    """The confirmation flags only the pool target reads: refused, in one line, elsewhere."""
    from ..errors import KVTunerError

    if args.confirm_metric != "kl" or args.confirm_seq_len is not None:
        raise KVTunerError("--confirm-metric and --confirm-seq-len are for --target pool")


def settings_from_args(args: argparse.Namespace) -> VllmSettings:
    """The flags as :class:`VllmSettings` (validated: bad input fails here)."""
    from ..errors import KVTunerError
    from ..tuner.budget import Budget
    from ..tuner.vllm import VllmGoal, VllmSettings

    if not args.kv_cache_dtype:
        raise KVTunerError("--target vllm needs --kv-cache-dtype (e.g. fp8_e4m3)")
    check_no_pool_flags(args)
    goal = VllmGoal(
        args.kv_cache_dtype,
        budget=Budget.parse(args.budget) if args.budget else None,
        max_skip=args.max_skip,
        ppl_within=args.ppl_within,
        model_dtype=args.model_dtype,
    )
    return VllmSettings(goal=goal, **engine_run_kwargs(args))


def report(outcome: VllmOutcome) -> None:
    """The summary and the `wrote ...` line with vLLM's serve flags, on stdout."""
    print(outcome.summary)
    flags = " ".join(outcome.profile.plan.cli_args())
    print(f"wrote {outcome.output} (hash {outcome.profile.hash}); vllm serve flags: {flags}")
