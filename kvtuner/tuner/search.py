"""`search()`: calibration (unless a sensitivity file is given) -> pruned space -> Optuna study
of measured KL -> the best feasible profile, the Pareto set, a plot and a summary table.

The objective of every trial is :func:`kvtuner.calibration.measure_kl` of the whole mixed
configuration on the calibration tokens. Uniform configurations that fit are always measured
(they seed the study), so the written profile is never worse, by measured KL, than the best of
them. With ``confirm_samples`` the finalists (the best uniform among them) are measured again on
held-back calibration windows and that KL decides instead.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from ..placement import peak_memory_line, placement, placement_of, reset_peak_memory
from ..profile import ModelFingerprint, Profile, read_json, save_profile
from ..quant import QUANTIZED_BITS
from ..search_spaces import (
    DEFAULT_BITS,
    LossTable,
    SearchSpace,
    build_space,
    load_preset,
    pair_label,
)
from .budget import Budget
from .confirmation import Confirmed, confirm_on_held_back, held_back
from .report import Baseline, format_summary, plot_pareto, write_pareto_dir
from .results import Measured, best_measured, measured_trials, pareto_set
from .sensitivity_file import (
    calibrated_smoothing,
    load_or_calibrate,
    sensitivity_path,
    smoothing_provenance,
)
from .study import StudySettings, run_study

__all__ = ["SearchOutcome", "default_storage", "search"]


@dataclass(frozen=True)
class SearchOutcome:
    profile: Profile
    output: Path
    best: Measured
    baselines: tuple[Baseline, ...]
    pareto: tuple[Measured, ...]
    trials: int
    seconds: float
    summary: str
    confirmation: tuple[Confirmed, ...] = ()  # finalists re-measured on held-back windows


def default_storage(output: Path) -> str:
    """``sqlite:///<output without .json>.optuna.db`` beside the profile."""
    return f"sqlite:///{output.resolve().with_suffix('.optuna.db')}"


def _baselines(study, space: SearchSpace, measured: list[Measured], evaluate, extra: bool):
    """Uniform configs over the space's widths: the fitting ones come from the study; the others
    are measured once and cached in the study's user attributes (a rerun does not measure them
    again)."""
    known = {m.choice[0]: m for m in measured if len(set(m.choice)) == 1}
    widths = [b for b in space.widths if b < 16]
    out = []
    for k in widths:
        for v in widths:
            pair = (k, v)
            choice = space.uniform(pair)
            kl = known[pair].kl if pair in known else study.user_attrs.get(f"baseline {k}-{v}")
            if kl is None and not extra:
                continue
            if kl is None:
                kl = float(evaluate(space.layer_specs(choice)))
                study.set_user_attr(f"baseline {k}-{v}", kl)
            m = Measured.of(space, choice, kl)
            out.append(
                Baseline(
                    pair_label(pair),
                    m.nominal_bits,
                    m.effective_bits,
                    m.bytes_per_token,
                    kl,
                    space.fits(choice),
                )
            )
    return tuple(out)


def _check_bits(bits: Sequence[int] | None) -> tuple[int, ...] | None:
    if bits is None:
        return None
    widths = tuple(sorted(set(bits)))
    if not widths or any(isinstance(b, bool) or b not in QUANTIZED_BITS for b in widths):
        raise KVTunerError(f"bits must be among {QUANTIZED_BITS}, got {tuple(bits)}")
    return widths


def _check_feasible(budget: Budget, preset, fp: ModelFingerprint, low: int) -> None:
    cheapest = [preset.layer_spec(i, low, low) for i in range(fp.num_layers)]
    if not budget.fits(cheapest, fp):
        need, cap = float(budget.cost(cheapest, fp)), float(budget.capacity(fp))
        raise KVTunerError(
            f"budget {budget.label} is below the cheapest configuration "
            f"(all {low}-bit: {need:g} vs capacity {cap:g})"
        )


def _sig(x: float) -> float:
    """6 significant digits: KLs span 1e-5 .. 1e1."""
    return float(f"{x:.6g}")


def _confirm_metrics(held, confirmation: tuple[Confirmed, ...]) -> dict:
    if not confirmation:
        return {}
    return {
        "confirm_kl": _sig(confirmation[0].kl),
        "confirm_tokens": held.tokens.numel(),
        "confirm_finalists": len(confirmation),
    }


def _profile(
    model_id, space, best, calibration, budget, settings, study, baselines, fp_ppl, extra=None
):
    """calibration: the profile's provenance of the study's tokens (data, device, dtype)."""
    fits = [b for b in baselines if b.fits]
    top = min(fits, key=lambda b: b.kl, default=None)
    metrics = {
        "kl": _sig(best.kl),
        "kl_tokens": calibration["tokens"],
        "additive_kl": _sig(best.additive_kl),
        "fp_ppl": fp_ppl,
        "best_uniform": top.label if top else None,
        "best_uniform_kl": _sig(top.kl) if top else None,
        "trials": len(study.trials),
        "sampler": settings.sampler,
        "study": study.study_name,
        **(extra or {}),
    }
    profile = Profile(
        model_id, space.fingerprint, best.specs, calibration=calibration, metrics=metrics
    )
    return profile.with_accounting(**budget.to_dict(), preset=space.preset.name)


def search(
    *,
    model: str,
    budget: str | Budget,
    output: str | Path = "profile.json",
    sensitivity: str | Path | None = None,
    preset: str = "per-token",
    bits: Sequence[int] | None = None,
    study: StudySettings | None = None,
    num_clusters: int | None = None,
    dataset: str | None = None,
    num_samples: int = 2,
    seq_len: int = 256,
    context_length: int | None = None,
    data_seed: int = 0,
    confirm_samples: int = 4,
    pareto_dir: str | Path | None = None,
    plot: str | Path | None = None,
    baselines: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    device: str = "auto",
    dtype: str = "auto",
    batch_size: int | None = None,
    loaded: tuple[Any, Any] | None = None,
) -> SearchOutcome:
    """Search a profile for ``model`` within ``budget`` and write it to ``output`` (atomic).

    bits: the widths keys and values choose from (16 is always an option). Calibration measures
    them (default :data:`DEFAULT_BITS`); with a ``sensitivity`` file they must be among its widths
    (default: all of them).

    device, dtype: where the model runs (see :mod:`kvtuner.placement`): calibration, every
    trial and the confirmation pass. batch_size: calibration windows per forward (None: as many
    as keep one forward's fp32 logits under 256 MiB). The outcome reports the peak GPU memory.
    loaded: an already loaded ``(model, tokenizer)`` (e.g. built from a config), used as is
    instead of loading ``model``, which then only names it in the profile.
    context_length: the context at which a hybrid model's window layers are capped in the budget
    (default ``seq_len``, the calibration length); no effect on full-attention models.
    """
    start = time.monotonic()
    budget = budget if isinstance(budget, Budget) else Budget.parse(budget)
    search_preset, output = load_preset(preset), Path(output)  # bad input fails before loading
    bits = _check_bits(bits)
    if isinstance(confirm_samples, bool) or not isinstance(confirm_samples, int):
        raise KVTunerError(f"confirm_samples must be an integer, got {confirm_samples!r}")
    if confirm_samples < 0:
        raise KVTunerError(f"confirm_samples must be >= 0, got {confirm_samples}")
    if sensitivity is not None and not Path(sensitivity).is_file():
        raise KVTunerError(f"sensitivity file not found: {sensitivity}")
    where = placement(device, dtype)

    from ..calibration import (
        check_batch_size,
        fingerprint_of,
        fp_reference,
        load_calibration_data,
        load_model,
        measure_kl,
    )

    check_batch_size(batch_size)
    study = study or StudySettings()
    output.parent.mkdir(parents=True, exist_ok=True)  # the default storage lives beside it
    if study.storage is None:
        study = dataclasses.replace(study, storage=default_storage(output))
    if loaded is not None:
        (lm, tokenizer), where = loaded, placement_of(loaded[0])
    reset_peak_memory(where.torch_device)
    if loaded is None:
        lm, tokenizer = load_model(model, device=where.device, dtype=where.dtype)
    fp = fingerprint_of(lm)
    budget = budget.at_context(fp, seq_len if context_length is None else context_length)
    _check_feasible(budget, search_preset, fp, min(bits or DEFAULT_BITS))  # before calibration
    data = load_calibration_data(
        tokenizer, dataset=dataset, num_samples=num_samples, seq_len=seq_len, seed=data_seed
    )
    held = held_back(tokenizer, dataset, data, confirm_samples) if confirm_samples else None
    search_preset = calibrated_smoothing(lm, search_preset, data, log, batch_size)
    sens_path = Path(sensitivity) if sensitivity else sensitivity_path(output)
    sens = load_or_calibrate(
        lm,
        model_id=model,
        fp=fp,
        data=data,
        preset=search_preset,
        bits=bits or DEFAULT_BITS,
        path=sens_path,
        given=sensitivity is not None,
        log=log,
        progress=progress,
        batch_size=batch_size,
    )
    space = build_space(
        LossTable.from_sensitivity(sens, fp.num_layers),
        search_preset,
        fp,
        budget,
        num_clusters=num_clusters,
        bits=bits,
    )
    reference = fp_reference(lm, data.tokens, batch_size=batch_size)
    evaluate = lambda specs: measure_kl(lm, data.tokens, specs, reference)  # noqa: E731
    log(
        f"search: {len(space.groups)} groups, options per group "
        f"{min(len(g.options) for g in space.groups)}-{max(len(g.options) for g in space.groups)}"
        f", study {study.study_name or 'auto'} in {study.storage}"
    )
    st = run_study(space, evaluate, study, progress=progress, placement=where)
    measured = measured_trials(st, space)
    best = best_measured(measured)
    if best is None:
        raise KVTunerError("the study holds no finished feasible trial; raise --n-trials/--timeout")
    confirmation = (
        confirm_on_held_back(lm, measured, held, log, batch_size=batch_size)
        if held is not None
        else ()
    )
    if confirmation:
        best = confirmation[0].measured
    base = _baselines(st, space, measured, evaluate, baselines)
    fp_ppl = read_json(sens_path, "sensitivity file").get("fp", {}).get("ppl")
    extra = _confirm_metrics(held, confirmation)
    calibration = {**data.describe(), **where.describe(), "sensitivity": sens_path.name}
    if search_preset.smoothing is not None:
        calibration["key_smoothing"] = smoothing_provenance(search_preset)
    profile = _profile(model, space, best, calibration, budget, study, st, base, fp_ppl, extra)
    save_profile(profile, output)
    front = tuple(pareto_set(measured))
    if pareto_dir:
        write_pareto_dir(
            pareto_dir,
            [
                _profile(model, space, m, calibration, budget, study, st, base, fp_ppl)
                for m in front
            ],
        )
    if plot:
        title = f"{model} {search_preset.name} budget {budget.label}: {len(measured)} measured"
        plot_pareto(plot, measured, front, best, base, title)
    seconds = time.monotonic() - start
    where_line = f"ran on {where.describe()['device']} in {where.dtype}; "
    summary = "\n".join(
        [
            format_summary(best, base, budget.label),
            where_line + peak_memory_line(where.torch_device),
        ]
    )
    return SearchOutcome(
        profile, output, best, base, front, len(st.trials), seconds, summary, confirmation
    )
