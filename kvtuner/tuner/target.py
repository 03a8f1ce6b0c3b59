"""The one shape of a search target, and the one driver that runs any target's stages in order.

A :class:`Target` is its stages: ``settings`` (keywords -> its validated settings record), then
``prepare`` (the model, its text, what every later stage measures on), ``candidates`` (what the
study may measure: a pruned space, skip sets, seed recipes), ``measure`` (the study), ``choose``
(the best, confirmed on held-back windows where the target confirms), ``profile`` (the chosen
configuration as the target's profile) and ``export`` (written atomically, with the outcome the
caller reads). :meth:`Target.run` runs them; every stage sees the :class:`SearchRun` (settings,
log, progress bars, an already loaded model), what ``prepare`` made and the stage before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..errors import KVTunerError

__all__ = ["STAGES", "Chosen", "SearchRun", "Target"]

STAGES = ("settings", "prepare", "candidates", "measure", "choose", "profile", "export")
Log = Callable[[str], None]


@dataclass(frozen=True)
class SearchRun:
    """What every stage of one run sees. loaded: an already loaded ``(model, tokenizer)`` used
    as is (``settings.model`` then only names it); started: ``time.monotonic()`` at the start."""

    settings: Any
    log: Log = print
    progress: bool = True
    loaded: tuple[Any, Any] | None = None
    started: float = 0.0


@dataclass(frozen=True)
class Chosen:
    """What a ``choose`` stage hands on: the best configuration, the KL of every one measured
    (keyed as the target keys them: skip sets, recipes) and the metrics the profile records."""

    best: Any
    kl: dict[Any, float]
    metrics: dict[str, Any]


@dataclass(frozen=True)
class Target:
    """A search target: its name (``kvtuner search --target NAME``), the settings record its
    ``settings`` stage builds, one line for ``--help``, and its stages (see the module)."""

    name: str
    settings_type: type
    help: str
    settings: Callable[..., Any]  # keywords -> settings_type
    prepare: Callable[[SearchRun], Any]
    candidates: Callable[[SearchRun, Any], Any]  # (run, prepared)
    measure: Callable[[SearchRun, Any, Any], Any]  # (run, prepared, candidates)
    choose: Callable[[SearchRun, Any, Any, Any], Any]  # (run, prepared, candidates, measured)
    profile: Callable[[SearchRun, Any, Any, Any], Any]  # (run, prepared, candidates, chosen)
    export: Callable[[SearchRun, Any, Any, Any, Any], Any]  # (..., chosen, profile) -> outcome

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise KVTunerError(f"a target's name is one word, got {self.name!r}")
        stages = [f.name for f in fields(self) if f.name in STAGES]
        missing = [name for name in stages if not callable(getattr(self, name))]
        if missing:
            raise KVTunerError(f"target {self.name}: stages {missing} are not callable")

    def run(
        self,
        settings: Any,
        *,
        log: Log = print,
        progress: bool = True,
        loaded: tuple[Any, Any] | None = None,
    ) -> Any:
        """Every stage over ``settings`` (a ``settings_type``), in order; the export's outcome."""
        if not isinstance(settings, self.settings_type):
            kind = type(settings).__name__
            raise KVTunerError(f"target {self.name} runs {self.settings_type.__name__}, got {kind}")
        run = SearchRun(settings, log, progress, loaded, time.monotonic())
        prepared = self.prepare(run)
        candidates = self.candidates(run, prepared)
        measured = self.measure(run, prepared, candidates)
        chosen = self.choose(run, prepared, candidates, measured)
        profile = self.profile(run, prepared, candidates, chosen)
        return self.export(run, prepared, candidates, chosen, profile)

    def search(
        self,
        *,
        log: Log = print,
        progress: bool = True,
        loaded: tuple[Any, Any] | None = None,
        **keywords: Any,
    ) -> Any:
        """:meth:`run` over the ``settings`` stage's record of ``keywords``."""
        return self.run(self.settings(**keywords), log=log, progress=progress, loaded=loaded)
