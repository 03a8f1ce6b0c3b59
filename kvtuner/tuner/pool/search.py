"""The pool target (kvtuner's own packed format): calibration (unless a sensitivity file is
given) -> pruned space -> Optuna study of measured KL -> the best feasible profile, the Pareto
set, a plot and a summary table.

The objective of every trial is :func:`kvtuner.calibration.measure_kl` of the whole mixed
configuration on the calibration tokens. Uniform configurations that fit are always measured
(they seed the study), so the written profile is never worse, by measured KL, than the best of
them. With ``confirm_samples`` the finalists (the best uniform among them) are measured again on
held-back calibration windows and that KL decides instead.

Its stages (:mod:`.stages`, :mod:`.output`) over one :class:`~.settings.SearchSettings`:
prepare -> measure_sensitivity (candidates) -> study (measure) -> confirm (choose) -> profile ->
export.
"""

from __future__ import annotations

from typing import Any

from ..target import Target
from . import output, stages
from .settings import SearchSettings

__all__ = ["TARGET", "settings_of"]


def settings_of(**keywords: Any) -> SearchSettings:
    """``SearchSettings(**keywords)`` (model, budget, output, sensitivity, preset, bits, study,
    ...; see :class:`SearchSettings`); ``study=None`` means the default study settings."""
    if keywords.get("study", 0) is None:
        del keywords["study"]
    return SearchSettings(**keywords)


TARGET = Target(
    name="pool",
    settings_type=SearchSettings,
    help="per-layer packed K/V bits, served by kvtuner's own caches (default)",
    settings=settings_of,
    prepare=stages.prepare,
    candidates=stages.measure_sensitivity,
    measure=stages.study,
    choose=stages.confirm,
    profile=output.profile,
    export=output.export,
)
