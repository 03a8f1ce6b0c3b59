"""The pool target's measuring stages, each a function of the run and of what the stages before it
made: prepare (model, text, budget) -> measure_sensitivity (the target's ``candidates``: the
sensitivity, given, cached or measured, and the space it prunes) -> study (``measure``: Optuna,
measured KL of whole configurations) -> confirm (``choose``: finalists on held-back windows). The
profile and export stages are :mod:`.output`; :data:`.search.TARGET` wires them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import KVTunerError
from ...placement import Placement, placement
from ...profile import ModelFingerprint
from ...search_spaces import DEFAULT_BITS, LossTable, SearchPreset, SearchSpace, build_space
from ..budget import Budget
from ..confirmation import Confirmed, confirm_on_held_back
from ..loading import load_placed, load_text
from ..results import Baseline, Measured, best_measured, measured_trials, uniform_baselines
from ..sensitivity_file import calibrated_smoothing, load_or_calibrate, sensitivity_path
from ..study import Evaluate, run_study
from ..target import SearchRun
from .settings import SearchSettings

if TYPE_CHECKING:
    import optuna

    from ...calibration import CalibrationData

__all__ = [
    "Calibrated",
    "Prepared",
    "Studied",
    "confirm",
    "measure_sensitivity",
    "prepare",
    "study",
]


@dataclass(frozen=True)
class Prepared:
    """The model where it runs, the budget stated at the context, and the text: ``data`` for the
    study, ``held`` (None without confirmation) disjoint windows for the confirmation."""

    lm: Any
    tokenizer: Any
    where: Placement
    fingerprint: ModelFingerprint
    budget: Budget
    data: CalibrationData
    held: CalibrationData | None
    preset: SearchPreset  # the settings' preset at the model's head_dim


@dataclass(frozen=True)
class Calibrated:
    preset: SearchPreset  # key smoothing (if any) calibrated on the study's tokens
    sensitivity: Path  # the file read or written
    space: SearchSpace


@dataclass(frozen=True)
class Studied:
    study: optuna.Study
    measured: tuple[Measured, ...]
    best: Measured  # least KL; after confirmation, the best on the held-back windows
    baselines: tuple[Baseline, ...]
    confirmation: tuple[Confirmed, ...] = ()  # finalists re-measured, best first


def prepare(run: SearchRun) -> Prepared:
    """Model, budget and text; a budget below the cheapest configuration fails here, before
    any calibration."""
    from ...calibration import fingerprint_of

    s: SearchSettings = run.settings
    placement(s.device, s.dtype)  # resolved: a missing CUDA device fails before anything is written
    s.output.parent.mkdir(parents=True, exist_ok=True)  # the study's default storage lives there
    lm, tokenizer, where = load_placed(s.model, s.device, s.dtype, run.loaded)
    fp = fingerprint_of(lm)
    budget = s.budget.at_context(fp, s.context)
    preset = s.preset.for_head_dim(fp.head_dim)
    _check_feasible(budget, preset, fp, min(s.bits or DEFAULT_BITS))
    data, held = load_text(tokenizer, s, s.confirm_samples, s.confirm_seq_len)
    return Prepared(lm, tokenizer, where, fp, budget, data, held, preset)


def _check_feasible(budget: Budget, preset: SearchPreset, fp: ModelFingerprint, low: int) -> None:
    cheapest = [preset.layer_spec(i, low, low) for i in range(fp.num_layers)]
    if not budget.fits(cheapest, fp):
        need, cap = float(budget.cost(cheapest, fp)), float(budget.capacity(fp))
        raise KVTunerError(
            f"budget {budget.label} is below the cheapest configuration "
            f"(all {low}-bit: {need:g} vs capacity {cap:g})"
        )


def measure_sensitivity(run: SearchRun, prepared: Prepared) -> Calibrated:
    """Key smoothing, then the per-layer sensitivity: the given file, the one cached beside the
    output when it matches, or measured now; then the space it prunes (the study's candidates)."""
    s, p = run.settings, prepared
    preset = calibrated_smoothing(p.lm, p.preset, p.data, run.log, s.batch_size)
    path = s.sensitivity or sensitivity_path(s.output)
    sens = load_or_calibrate(
        p.lm,
        model_id=s.model,
        fp=p.fingerprint,
        data=p.data,
        preset=preset,
        bits=s.bits or DEFAULT_BITS,
        path=path,
        given=s.sensitivity is not None,
        log=run.log,
        progress=run.progress,
        batch_size=s.batch_size,
    )
    losses = LossTable.from_sensitivity(sens, p.fingerprint.num_layers)
    space = build_space(
        losses, preset, p.fingerprint, p.budget, num_clusters=s.num_clusters, bits=s.bits
    )
    return Calibrated(preset, path, space)


def kl_evaluator(lm: Any, tokens: Any, batch_size: int | None = None) -> Evaluate:
    """Layer specs -> KL(fp || quantized) on ``tokens`` (int64 [samples, seq]); fp once."""
    from ...calibration import fp_reference, measure_kl

    reference = fp_reference(lm, tokens, batch_size=batch_size)
    return lambda specs: measure_kl(lm, tokens, specs, reference)


def study(run: SearchRun, prepared: Prepared, calibrated: Calibrated) -> Studied:
    """The Optuna study (resumed when its storage holds it), its best feasible configuration and
    the uniform baselines."""
    s, p = run.settings, prepared
    space, options = calibrated.space, [len(g.options) for g in calibrated.space.groups]
    evaluate = kl_evaluator(p.lm, p.data.tokens, s.batch_size)
    name = s.study.study_name or "auto"
    run.log(
        f"search: {len(space.groups)} groups, options per group {min(options)}-{max(options)}"
        f", study {name} in {s.study.storage}"
    )
    st = run_study(space, evaluate, s.study, progress=run.progress, placement=p.where)
    measured = measured_trials(st, space)
    best = best_measured(measured)
    if best is None:
        raise KVTunerError("the study holds no finished feasible trial; raise --n-trials/--timeout")
    baselines = uniform_baselines(st, space, measured, evaluate, s.baselines)
    return Studied(st, tuple(measured), best, baselines)


def confirm(
    run: SearchRun, prepared: Prepared, calibrated: Calibrated, studied: Studied
) -> Studied:
    """With held-back windows: the finalists measured again there, the best of them kept."""
    if prepared.held is None:
        return studied
    again = confirm_on_held_back(
        prepared.lm,
        studied.measured,
        prepared.held,
        run.log,
        metric=run.settings.confirm_metric,
        batch_size=run.settings.batch_size,
    )
    return dataclasses.replace(studied, best=again[0].measured, confirmation=again)
