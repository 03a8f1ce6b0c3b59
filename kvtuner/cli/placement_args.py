"""``--device`` and ``--dtype``: added to every command that runs a model, parsed in one place."""

from __future__ import annotations

import argparse

from ..placement import DTYPE_CHOICES, Placement, placement


def add_placement_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when one is visible, else cpu), cpu, cuda or cuda:N (default %(default)s)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="model weights and activations; auto = bfloat16 on CUDA, float32 on cpu",
    )


def placement_from_args(args: argparse.Namespace) -> Placement:
    """The resolved placement; one clear line (exit 2) for a device that is not there."""
    return placement(args.device, args.dtype)
