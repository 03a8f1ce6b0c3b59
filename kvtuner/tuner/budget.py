"""Re-export: :class:`Budget` lives in :mod:`kvtuner.search_spaces.budget`, below the search."""

from ..search_spaces.budget import Budget, layer_bytes

__all__ = ["Budget", "layer_bytes"]
