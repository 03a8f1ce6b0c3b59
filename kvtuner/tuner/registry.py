"""The search targets, by name: :data:`TARGETS` (what ``kvtuner search --target`` offers) and
:func:`search`, which runs one (``kvtuner.search``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import KVTunerError
from .pool import TARGET as POOL
from .recipe import TARGET as RECIPE
from .target import Target
from .vllm import TARGET as VLLM

__all__ = ["TARGETS", "search", "target_named"]

TARGETS: dict[str, Target] = {t.name: t for t in (POOL, VLLM, RECIPE)}  # the default first


def target_named(name: str) -> Target:
    """The target called ``name``; an unknown name is one line naming the choices."""
    if name not in TARGETS:
        raise KVTunerError(f"unknown search target {name!r}; choose from {', '.join(TARGETS)}")
    return TARGETS[name]


def search(
    *,
    target: str = "pool",
    log: Callable[[str], None] = print,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    **settings: Any,
) -> Any:
    """Search a profile for ``target`` (``pool``, ``vllm`` or ``recipe``) and write it to
    ``settings["output"]``; ``settings`` are that target's settings keywords (pool:
    :class:`~.pool.SearchSettings`, ``study=None`` the default study; vllm and recipe: their
    settings' fields with the study as ``n_trials``, ``storage``, ``study_name``). log:
    informational lines; progress: bars; loaded: an already loaded ``(model, tokenizer)`` used
    as is. Returns the target's outcome (its profile, where it was written, a summary)."""
    chosen = target_named(target)
    return chosen.search(log=log, progress=progress, loaded=loaded, **settings)
