"""The pool target: per-layer K/V bits in kvtuner's own packed format, chosen by an Optuna study
of measured KL over a sensitivity-pruned space (:mod:`.search`)."""

from .output import SearchOutcome
from .search import TARGET
from .settings import SearchSettings

__all__ = ["TARGET", "SearchOutcome", "SearchSettings"]
