"""`kvtuner search --model M --budget 4bit [--output profile.json]`: the main command."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..search_spaces.preset_table import preset_help
from ..tuner.confirmation import CONFIRM_METRICS
from .calibrate import add_batch_size_argument, add_bits_argument, parse_bits
from .output import Verbosity, add_verbosity_arguments
from .placement_args import add_placement_arguments, placement_from_args
from .search_recipe import add_recipe_arguments, run_recipe
from .search_vllm import add_vllm_arguments, run_vllm

if TYPE_CHECKING:
    from ..tuner.search_settings import SearchSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help="search per-layer K/V bits within a memory budget and write a profile",
        description="Calibrate (unless --sensitivity is given), then run an Optuna study whose "
        "objective is the measured KL vs fp of whole configurations, and write the best "
        "profile that fits the budget.",
    )
    p.add_argument(
        "--model",
        required=True,
        help="hub id, local dir, .gguf, or alias: smollm2-135m, qwen2.5-0.5b, gemma3-270m",
    )
    p.add_argument(
        "--budget",
        help="nominal bits like 4bit / 3.5bits, or bytes vs fp16 like 0.30x (required, except "
        "for --target vllm with --max-skip or --ppl-within)",
    )
    p.add_argument("--output", default="profile.json", help="profile JSON (default %(default)s)")
    p.add_argument(
        "--sensitivity",
        help="sensitivity JSON from `kvtuner calibrate` (default: "
        "calibrate now, cached beside the output)",
    )
    p.add_argument(
        "--preset",
        default="per-token",
        help=preset_help("per-token"),
    )
    add_bits_argument(
        p,
        "widths to calibrate and choose from for keys and values; with --sensitivity, a subset "
        "of its widths, by default all of them; 16 is always an option",
    )
    p.add_argument("--num-clusters", type=int, help="layers with similar sensitivity share a pair")
    p.add_argument(
        "--n-trials",
        type=int,
        default=40,
        help="finished trials the study should hold; a rerun continues up to it",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds for the sampled trials (the seeds, "
        "among them every uniform config that fits, always run)",
    )
    p.add_argument("--seed", type=int, default=0, help="sampler seed")
    p.add_argument("--sampler", default="local", choices=("local", "tpe", "nsga2"))
    p.add_argument("--storage", help="optuna storage URL (default sqlite file beside --output)")
    p.add_argument("--study-name", help="default: derived from budget, preset and search space")
    p.add_argument("--dataset", help="calibration text (default: the embedded WikiText-2 slice)")
    p.add_argument(
        "--num-samples",
        type=int,
        default=2,
        help="calibration windows (default %(default)s; each trial runs them all)",
    )
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window (%(default)s)")
    add_batch_size_argument(p)
    add_placement_arguments(p)
    p.add_argument(
        "--context-length",
        type=int,
        help="context at which the budget counts a sliding-window layer at its capped size "
        "(window - 1 tokens); default: --seq-len. No effect on full-attention models",
    )
    p.add_argument(
        "--confirm-samples",
        type=int,
        default=4,
        help="re-measure the 4 best configurations and the best uniform one on this many more "
        "calibration windows (disjoint from the study's) and keep the best there: guards against "
        "noise-level wins on few tokens (default %(default)s; 0: off)",
    )
    p.add_argument(
        "--confirm-seq-len",
        type=int,
        help="tokens per confirmation window (default: --seq-len); the NLL metric wants "
        "thousands of tokens in all, e.g. --confirm-samples 16 --confirm-seq-len 1024",
    )
    p.add_argument(
        "--confirm-metric",
        choices=CONFIRM_METRICS,
        default="kl",
        help="what the confirmation ranks the finalists by: kl (the study's KL vs fp) or nll "
        "(the text's next-token NLL, what perplexity scores) (default %(default)s)",
    )
    p.add_argument("--pareto-dir", help="write every Pareto-optimal profile here")
    p.add_argument("--plot", help="Pareto-front PNG (needs matplotlib)")
    p.add_argument(
        "--all-baselines",
        action="store_true",
        help="also measure the uniform configs over the budget, for the summary",
    )
    add_vllm_arguments(p)
    add_recipe_arguments(p)
    add_verbosity_arguments(p)
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> SearchSettings:
    """The flags as :class:`SearchSettings` (validated: bad input fails here)."""
    from ..errors import KVTunerError
    from ..tuner.search_settings import SearchSettings
    from ..tuner.study import StudySettings

    if args.budget is None:
        raise KVTunerError("--budget is required (e.g. --budget 4bit)")
    where = placement_from_args(args)
    study = StudySettings(
        n_trials=args.n_trials,
        timeout=args.timeout,
        seed=args.seed,
        storage=args.storage,
        study_name=args.study_name,
        sampler=args.sampler,
    )
    return SearchSettings(
        model=args.model,
        budget=args.budget,
        output=args.output,
        sensitivity=args.sensitivity,
        preset=args.preset,
        bits=parse_bits(args.bits) if args.bits else None,
        study=study,
        num_clusters=args.num_clusters,
        dataset=args.dataset,
        num_samples=args.num_samples,
        seq_len=args.seq_len,
        context_length=args.context_length,
        confirm_samples=args.confirm_samples,
        confirm_seq_len=args.confirm_seq_len,
        confirm_metric=args.confirm_metric,
        pareto_dir=args.pareto_dir,
        plot=args.plot,
        baselines=args.all_baselines,
        device=where.device,
        dtype=where.dtype,
        batch_size=args.batch_size,
    )


TARGETS = {"vllm": run_vllm, "recipe": run_recipe}  # the engine targets; kvtuner's own below


def run(args: argparse.Namespace) -> int:
    from ..tuner.search import run_search

    if args.target in TARGETS:
        return TARGETS[args.target](args)
    verbosity = Verbosity.from_args(args)
    verbosity.apply()
    settings = settings_from_args(args)
    outcome = run_search(settings, log=verbosity.info, progress=verbosity.progress)
    print(outcome.summary)
    p = outcome.profile
    print(
        f"wrote {outcome.output}: KL {outcome.best.kl:.5f}, nominal {p.nominal_bits:.3f} bits, "
        f"effective {p.effective_bits:.3f} bits, {p.bytes_per_token:.0f} bytes/token, "
        f"{outcome.trials} trials, {outcome.seconds:.0f} s, hash {p.hash}"
    )
    return 0
