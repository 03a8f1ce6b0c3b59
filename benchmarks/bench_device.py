"""The device a GPU benchmark runs on: ``cuda``, or ``cpu`` with Triton's interpreter (tiny
shapes, to prove a script works where there is no GPU)."""

from __future__ import annotations

import os
import sys


def prepare_device(device: str) -> None:
    """Call before anything imports triton. CPU: kernels run under ``TRITON_INTERPRET=1``;
    ``cuda`` without a GPU: one line and exit 2."""
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read once, when triton is imported
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        sys.exit(2)
