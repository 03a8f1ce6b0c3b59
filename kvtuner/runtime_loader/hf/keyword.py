"""The keyword a transformers model takes its cache by.

transformers 5.24 renamed ``past_key_values`` to ``cache`` in every model's ``forward``, in its
decoder layers and in ``generate``; the old name still works there, with a FutureWarning, until
5.40 (``generate``: 6.0). Releases before 5.24 know only ``past_key_values``. kvtuner passes
whichever name the installed release declares, so it runs quietly on both.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

__all__ = ["cache_keyword", "cache_kwargs"]


@cache
def cache_keyword() -> str:
    """``"cache"`` on transformers >= 5.24, else ``"past_key_values"``."""
    from transformers import GenerationMixin

    # deprecate_kwarg wraps with functools.wraps: the signature is the renamed one
    params = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(cache_object: Any) -> dict[str, Any]:
    """``{cache_keyword(): cache_object}`` for ``model(...)``, a decoder layer or ``generate``."""
    return {cache_keyword(): cache_object}
