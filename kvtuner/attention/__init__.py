"""Attention that reads packed KV rows directly (fused Triton kernels, torch references).

Importing :mod:`.decode` imports triton: the package root stays light and imports it lazily.
"""

from __future__ import annotations

from typing import Any

from .layout import AttentionBatch, choose_splits
from .reference import decode_attention_reference, extend_attention_reference

__all__ = [
    "AttentionBatch",
    "attend",
    "choose_splits",
    "decode_attention",
    "decode_attention_reference",
    "extend_attention",
    "extend_attention_reference",
]


def attend(*args: Any, **kwargs: Any):
    """See :func:`kvtuner.attention.decode.attend` (imported on first use)."""
    from . import decode

    return decode.attend(*args, **kwargs)


def decode_attention(*args: Any, **kwargs: Any):
    """See :func:`kvtuner.attention.decode.decode_attention` (imported on first use)."""
    from . import decode

    return decode.decode_attention(*args, **kwargs)


def extend_attention(*args: Any, **kwargs: Any):
    """See :func:`kvtuner.attention.decode.extend_attention` (imported on first use)."""
    from . import decode

    return decode.extend_attention(*args, **kwargs)
