"""The vLLM target: which layers vLLM's ``--kv-cache-dtype-skip-layers`` keeps at the model
dtype for one ``--kv-cache-dtype`` (:mod:`.search`; the sets proposed, :mod:`.candidates`;
measured through vLLM's storage, :mod:`.kl`)."""

from .search import TARGET, VllmOutcome
from .settings import VllmGoal, VllmSettings

__all__ = ["TARGET", "VllmGoal", "VllmOutcome", "VllmSettings"]
