"""`kvtuner search --model M --budget 4bit [--target T] [--output profile.json]`: the main command.

The targets are the registry's (:data:`kvtuner.tuner.registry.TARGETS`); each has a CLI adapter,
``search_<name>.py`` in this package: ``add_arguments`` (its flags), ``settings_from_args``
(flags -> its settings) and ``report`` (the printed summary). The run itself is the target's.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from ..tuner.registry import TARGETS
from .output import Verbosity, add_verbosity_arguments
from .placement_args import add_placement_arguments

ADAPTERS: dict[str, ModuleType] = {
    name: importlib.import_module(f"{__package__}.search_{name}") for name in TARGETS
}
assert ADAPTERS.keys() == TARGETS.keys()  # one adapter per registered target, by its name


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help="search per-layer K/V bits within a memory budget and write a profile",
        description="Measure what each candidate configuration costs in KL vs fp on calibration "
        "text, in a resumable Optuna study, and write the best one that fits the budget. The "
        "default target calibrates (unless --sensitivity is given) and samples whole "
        "configurations of kvtuner's packed K/V bits.",
    )
    p.add_argument(
        "--target",
        choices=tuple(TARGETS),
        default=next(iter(TARGETS)),
        help="; ".join(f"{name}: {t.help}" for name, t in TARGETS.items()),
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
        "--n-trials",
        type=int,
        default=40,
        help="finished trials the study should hold; a rerun continues up to it",
    )
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
    add_placement_arguments(p)
    p.add_argument(
        "--confirm-samples",
        type=int,
        default=4,
        help="re-measure the 4 best configurations and the best uniform one on this many more "
        "calibration windows (disjoint from the study's) and keep the best there: guards against "
        "noise-level wins on few tokens (default %(default)s; 0: off)",
    )
    for adapter in ADAPTERS.values():
        adapter.add_arguments(p)
    add_verbosity_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target, adapter = TARGETS[args.target], ADAPTERS[args.target]
    verbosity = Verbosity.from_args(args)
    verbosity.apply()
    settings = adapter.settings_from_args(args)
    outcome = target.run(settings, log=verbosity.info, progress=verbosity.progress)
    adapter.report(outcome)
    return 0
