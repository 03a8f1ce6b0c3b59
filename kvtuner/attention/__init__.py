"""Attention that reads packed KV rows directly (fused Triton kernels, torch references).

Importing :mod:`.decode` imports triton: the package root stays light and imports it lazily.
"""

from __future__ import annotations

from typing import Any

from .layout import DecodeBatch, choose_splits
from .reference import decode_attention_reference

__all__ = ["DecodeBatch", "choose_splits", "decode_attention", "decode_attention_reference"]


def decode_attention(*args: Any, **kwargs: Any):
    """See :func:`kvtuner.attention.decode.decode_attention` (imported on first use)."""
    from .decode import decode_attention as fused

    return fused(*args, **kwargs)
