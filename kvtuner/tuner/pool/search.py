"""`search()`: calibration (unless a sensitivity file is given) -> pruned space -> Optuna study
of measured KL -> the best feasible profile, the Pareto set, a plot and a summary table.

The objective of every trial is :func:`kvtuner.calibration.measure_kl` of the whole mixed
configuration on the calibration tokens. Uniform configurations that fit are always measured
(they seed the study), so the written profile is never worse, by measured KL, than the best of
them. With ``confirm_samples`` the finalists (the best uniform among them) are measured again on
held-back calibration windows and that KL decides instead.

The stages (:mod:`.search_stages`, :mod:`.search_output`) run over one
:class:`~.search_settings.SearchSettings`: prepare -> calibrate -> study -> confirm -> write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import search_stages as stages
from .search_output import SearchOutcome, write
from .search_settings import SearchSettings, default_storage

__all__ = ["SearchOutcome", "SearchSettings", "default_storage", "run_search", "search"]


def run_search(
    settings: SearchSettings,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
) -> SearchOutcome:
    """Search a profile for ``settings.model`` within ``settings.budget`` and write it to
    ``settings.output`` (atomic). log: informational lines; progress: bars. loaded: an already
    loaded ``(model, tokenizer)`` used as is (e.g. built from a config); ``settings.model`` then
    only names it in the profile. The outcome's summary reports the peak GPU memory."""
    started = time.monotonic()
    run = stages.prepare(settings, loaded)  # bad budget or text: fails before calibration
    calibrated = stages.calibrate(settings, run, log, progress)
    studied = stages.study(settings, run, calibrated, log, progress)
    studied = stages.confirm(settings, run, studied, log)
    return write(settings, run, calibrated, studied, started)


def search(
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    **settings: Any,
) -> SearchOutcome:
    """:func:`run_search` over ``SearchSettings(**settings)`` (keywords: model, budget, output,
    sensitivity, preset, bits, study, ...; see :class:`SearchSettings`). ``study=None`` means the
    default study settings."""
    if settings.get("study", 0) is None:
        del settings["study"]
    return run_search(SearchSettings(**settings), log=log, progress=progress, loaded=loaded)
