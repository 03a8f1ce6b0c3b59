"""`kvtuner search --target recipe --engine E --budget 5.4bit ...`: a KV format per layer among
the formats engine E serves (see docs/engines.md); its flags, their
:class:`~kvtuner.tuner.recipe.RecipeSettings` and the printed summary."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .search_vllm import check_no_pool_flags, engine_run_kwargs

if TYPE_CHECKING:
    from ..tuner.recipe import RecipeOutcome, RecipeSettings


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..quant.engine_recipe import ENGINE_FORMATS

    g = p.add_argument_group("recipe target (see docs/engines.md)")
    engines = "; ".join(f"{e}: {', '.join(f)}" for e, f in ENGINE_FORMATS.items())
    g.add_argument(
        "--engine",
        choices=tuple(ENGINE_FORMATS),
        default="vllm",
        help=f"the engine whose per-layer formats to choose from ({engines}; default "
        "%(default)s; --target recipe)",
    )
    g.add_argument(
        "--formats",
        help="comma-separated subset of the engine's formats, e.g. fp8,nvfp4 (ModelOpt's own "
        "candidates; --target recipe)",
    )


def settings_from_args(args: argparse.Namespace) -> RecipeSettings:
    """The flags as :class:`RecipeSettings` (validated: bad input fails here)."""
    from ..errors import KVTunerError
    from ..tuner.budget import Budget
    from ..tuner.recipe import RecipeGoal, RecipeSettings

    if not args.budget:
        raise KVTunerError("--target recipe needs --budget in effective bits, e.g. 5.4bit")
    check_no_pool_flags(args)
    formats = tuple(f.strip() for f in args.formats.split(",")) if args.formats else None
    goal = RecipeGoal(args.engine, Budget.parse(args.budget), formats)
    return RecipeSettings(goal=goal, **engine_run_kwargs(args))


def report(outcome: RecipeOutcome) -> None:
    """The summary and the `wrote ...` line with the command that prints the engine's forms."""
    print(outcome.summary)
    print(
        f"wrote {outcome.output} (hash {outcome.profile.hash}); "
        f"engine forms: kvtuner recipe-args {outcome.output} --engine {outcome.profile.engine}"
    )
