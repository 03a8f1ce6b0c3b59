"""`kvtuner search --target recipe --engine E --budget 5.4bit ...`: a KV format per layer among
the formats engine E serves (see docs/engines.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .output import Verbosity
from .search_vllm import engine_run_kwargs

if TYPE_CHECKING:
    from ..tuner.recipe_settings import RecipeSettings


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
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


def recipe_settings_from_args(args: argparse.Namespace) -> RecipeSettings:
    """The flags as :class:`RecipeSettings` (validated: bad input fails here)."""
    from ..errors import KVTunerError
    from ..tuner.budget import Budget
    from ..tuner.recipe_settings import RecipeSettings, RecipeTarget

    if not args.budget:
        raise KVTunerError("--target recipe needs --budget in effective bits, e.g. 5.4bit")
    if args.confirm_metric != "kl" or args.confirm_seq_len is not None:
        raise KVTunerError("--confirm-metric and --confirm-seq-len are for --target kvtuner")
    formats = tuple(f.strip() for f in args.formats.split(",")) if args.formats else None
    target = RecipeTarget(args.engine, Budget.parse(args.budget), formats)
    return RecipeSettings(target=target, **engine_run_kwargs(args))


def run_recipe(args: argparse.Namespace) -> int:
    from ..tuner.recipe_search import run_recipe_search

    verbosity = Verbosity.from_args(args)
    verbosity.apply()
    outcome = run_recipe_search(recipe_settings_from_args(args), log=verbosity.info)
    print(outcome.summary)
    print(
        f"wrote {outcome.output} (hash {outcome.profile.hash}); "
        f"engine forms: kvtuner recipe-args {outcome.output} --engine {outcome.profile.engine}"
    )
    return 0
