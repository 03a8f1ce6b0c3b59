"""`kvtuner search --target pool` (the default): per-layer packed K/V bits; its flags, their
:class:`~kvtuner.tuner.pool.SearchSettings` and the printed summary."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..search_spaces.preset_table import preset_help
from ..tuner.confirmation import CONFIRM_METRICS
from ..tuner.study import SAMPLERS
from .calibrate import add_batch_size_argument, add_bits_argument, parse_bits
from .placement_args import placement_from_args

if TYPE_CHECKING:
    from ..tuner.pool import SearchOutcome, SearchSettings


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pool target (the default; see docs/search.md)")
    g.add_argument(
        "--sensitivity",
        help="sensitivity JSON from `kvtuner calibrate` (default: "
        "calibrate now, cached beside the output)",
    )
    g.add_argument("--preset", default="per-token", help=preset_help("per-token"))
    add_bits_argument(
        g,
        "widths to calibrate and choose from for keys and values; with --sensitivity, a subset "
        "of its widths, by default all of them; 16 is always an option",
    )
    g.add_argument("--num-clusters", type=int, help="layers with similar sensitivity share a pair")
    g.add_argument(
        "--timeout",
        type=float,
        help="seconds for the sampled trials (the seeds, "
        "among them every uniform config that fits, always run)",
    )
    g.add_argument("--seed", type=int, default=0, help="sampler seed")
    g.add_argument("--sampler", default="local", choices=SAMPLERS)
    add_batch_size_argument(g)
    g.add_argument(
        "--context-length",
        type=int,
        help="context at which the budget counts a sliding-window layer at its capped size "
        "(window - 1 tokens); default: --seq-len. No effect on full-attention models",
    )
    g.add_argument(
        "--confirm-seq-len",
        type=int,
        help="tokens per confirmation window (default: --seq-len); the NLL metric wants "
        "thousands of tokens in all, e.g. --confirm-samples 16 --confirm-seq-len 1024",
    )
    g.add_argument(
        "--confirm-metric",
        choices=CONFIRM_METRICS,
        default="kl",
        help="what the confirmation ranks the finalists by: kl (the study's KL vs fp) or nll "
        "(the text's next-token NLL, what perplexity scores) (default %(default)s)",
    )
    g.add_argument("--pareto-dir", help="write every Pareto-optimal profile here")
    g.add_argument("--plot", help="Pareto-front PNG (needs matplotlib)")
    g.add_argument(
        "--all-baselines",
        action="store_true",
        help="also measure the uniform configs over the budget, for the summary",
    )


def settings_from_args(args: argparse.Namespace) -> SearchSettings:
    """The flags as :class:`SearchSettings` (validated: bad input fails here)."""
    from ..errors import KVTunerError
    from ..tuner.pool import SearchSettings
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


def report(outcome: SearchOutcome) -> None:
    """The summary table and the `wrote ...` line, on stdout."""
    print(outcome.summary)
    p = outcome.profile
    print(
        f"wrote {outcome.output}: KL {outcome.best.kl:.5f}, nominal {p.nominal_bits:.3f} bits, "
        f"effective {p.effective_bits:.3f} bits, {p.bytes_per_token:.0f} bytes/token, "
        f"{outcome.trials} trials, {outcome.seconds:.0f} s, hash {p.hash}"
    )
