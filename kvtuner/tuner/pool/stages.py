"""The stages of a search, each a function of the settings and of what the stages before it made:
prepare (model, text, budget) -> calibrate (sensitivity, cached -> pruned space) -> study (Optuna:
measured KL of whole configurations) -> confirm (finalists on held-back windows). The last stage,
write, is :mod:`.search_output`; :func:`.search.run_search` runs them in order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KVTunerError
from ..placement import Placement, placement, placement_of, reset_peak_memory
from ..profile import ModelFingerprint
from ..search_spaces import DEFAULT_BITS, LossTable, SearchPreset, SearchSpace, build_space
from .budget import Budget
from .confirmation import Confirmed, confirm_on_held_back, held_back
from .results import Baseline, Measured, best_measured, measured_trials, uniform_baselines
from .search_settings import SearchSettings
from .sensitivity_file import calibrated_smoothing, load_or_calibrate, sensitivity_path
from .study import Evaluate, run_study

if TYPE_CHECKING:
    import optuna

    from ..calibration import CalibrationData
    from .vllm_settings import VllmSettings

__all__ = ["Calibrated", "Prepared", "Studied", "calibrate", "confirm", "prepare", "study"]

Log = Callable[[str], None]


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


def load_placed(
    model: str, device: str, dtype: str, loaded: tuple[Any, Any] | None = None
) -> tuple[Any, Any, Placement]:
    """(model, tokenizer, placement): ``loaded`` as is, else ``model`` loaded where asked. The
    peak GPU memory count starts here."""
    from ..calibration import load_model

    where = placement(device, dtype) if loaded is None else placement_of(loaded[0])
    reset_peak_memory(where.torch_device)
    lm, tokenizer = loaded or load_model(model, device=where.device, dtype=where.dtype)
    return lm, tokenizer, where


def load_text(
    tokenizer: Any,
    settings: SearchSettings | VllmSettings,
    confirm_samples: int,
    confirm_seq_len: int | None = None,
) -> tuple[CalibrationData, CalibrationData | None]:
    """The study's windows (``settings``' dataset, num_samples, seq_len, data_seed) and, with
    ``confirm_samples``, as many more disjoint ones of ``confirm_seq_len`` tokens (None: the
    study's length; no windows without ``confirm_samples``)."""
    from ..calibration import load_calibration_data

    s = settings
    data = load_calibration_data(
        tokenizer, dataset=s.dataset, num_samples=s.num_samples, seq_len=s.seq_len, seed=s.data_seed
    )
    if not confirm_samples:
        return data, None
    return data, held_back(tokenizer, s.dataset, data, confirm_samples, confirm_seq_len)


def prepare(settings: SearchSettings, loaded: tuple[Any, Any] | None = None) -> Prepared:
    """Model, budget and text; a budget below the cheapest configuration fails here, before
    any calibration."""
    from ..calibration import fingerprint_of

    s = settings
    placement(s.device, s.dtype)  # resolved: a missing CUDA device fails before anything is written
    s.output.parent.mkdir(parents=True, exist_ok=True)  # the study's default storage lives there
    lm, tokenizer, where = load_placed(s.model, s.device, s.dtype, loaded)
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


def calibrate(settings: SearchSettings, run: Prepared, log: Log, progress: bool) -> Calibrated:
    """Key smoothing, then the sensitivity: the given file, the one cached beside the output
    when it matches, or a fresh calibration; then the space it prunes."""
    s = settings
    preset = calibrated_smoothing(run.lm, run.preset, run.data, log, s.batch_size)
    path = s.sensitivity or sensitivity_path(s.output)
    sens = load_or_calibrate(
        run.lm,
        model_id=s.model,
        fp=run.fingerprint,
        data=run.data,
        preset=preset,
        bits=s.bits or DEFAULT_BITS,
        path=path,
        given=s.sensitivity is not None,
        log=log,
        progress=progress,
        batch_size=s.batch_size,
    )
    losses = LossTable.from_sensitivity(sens, run.fingerprint.num_layers)
    space = build_space(
        losses, preset, run.fingerprint, run.budget, num_clusters=s.num_clusters, bits=s.bits
    )
    return Calibrated(preset, path, space)


def kl_evaluator(lm: Any, tokens: Any, batch_size: int | None = None) -> Evaluate:
    """Layer specs -> KL(fp || quantized) on ``tokens`` (int64 [samples, seq]); fp once."""
    from ..calibration import fp_reference, measure_kl

    reference = fp_reference(lm, tokens, batch_size=batch_size)
    return lambda specs: measure_kl(lm, tokens, specs, reference)


def study(
    settings: SearchSettings, run: Prepared, calibrated: Calibrated, log: Log, progress: bool
) -> Studied:
    """The Optuna study (resumed when its storage holds it), its best feasible configuration and
    the uniform baselines."""
    space, options = calibrated.space, [len(g.options) for g in calibrated.space.groups]
    evaluate = kl_evaluator(run.lm, run.data.tokens, settings.batch_size)
    name = settings.study.study_name or "auto"
    log(
        f"search: {len(space.groups)} groups, options per group {min(options)}-{max(options)}"
        f", study {name} in {settings.study.storage}"
    )
    st = run_study(space, evaluate, settings.study, progress=progress, placement=run.where)
    measured = measured_trials(st, space)
    best = best_measured(measured)
    if best is None:
        raise KVTunerError("the study holds no finished feasible trial; raise --n-trials/--timeout")
    baselines = uniform_baselines(st, space, measured, evaluate, settings.baselines)
    return Studied(st, tuple(measured), best, baselines)


def confirm(settings: SearchSettings, run: Prepared, studied: Studied, log: Log) -> Studied:
    """With held-back windows: the finalists measured again there, the best of them kept."""
    if run.held is None:
        return studied
    again = confirm_on_held_back(
        run.lm,
        studied.measured,
        run.held,
        log,
        metric=settings.confirm_metric,
        batch_size=settings.batch_size,
    )
    return dataclasses.replace(studied, best=again[0].measured, confirmation=again)
