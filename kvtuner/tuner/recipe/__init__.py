"""The recipe target: a KV format per layer among those an engine serves with its own kernels,
within a budget in ModelOpt's effective bits (:mod:`.search`; the tables and moves,
:mod:`.candidates`)."""

from .search import TARGET, RecipeOutcome
from .settings import RecipeGoal, RecipeSettings

__all__ = ["TARGET", "RecipeGoal", "RecipeOutcome", "RecipeSettings"]
