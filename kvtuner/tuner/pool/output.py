"""The pool target's last two stages: ``profile`` (the chosen configuration's profile, with the
search's provenance and metrics) and ``export`` (the profile written atomically, the Pareto set,
the plot and the summary table, gathered in a :class:`SearchOutcome`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...placement import peak_memory_line
from ...profile import Profile, read_json, save_profile
from ..confirmation import Confirmed
from ..report import format_summary, plot_pareto, write_pareto_dir
from ..results import Baseline, Measured, pareto_set
from ..sensitivity_file import smoothing_provenance
from ..target import SearchRun
from .settings import SearchSettings
from .stages import Calibrated, Prepared, Studied

__all__ = ["SearchOutcome", "export", "profile"]


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


def _sig(x: float) -> float:
    """6 significant digits: KLs span 1e-5 .. 1e1."""
    return float(f"{x:.6g}")


def _provenance(prepared: Prepared, calibrated: Calibrated) -> dict:
    """The profile's ``calibration``: the study's tokens, where they ran, the sensitivity file."""
    out = {**prepared.data.describe(), **prepared.where.describe()}
    out["sensitivity"] = calibrated.sensitivity.name
    if calibrated.preset.smoothing is not None:
        out["key_smoothing"] = smoothing_provenance(calibrated.preset)
    return out


def _confirm_metrics(prepared: Prepared, confirmation: tuple[Confirmed, ...]) -> dict:
    if not confirmation or prepared.held is None:
        return {}
    best = confirmation[0]
    return {
        f"confirm_{best.metric}": _sig(best.score),
        "confirm_tokens": prepared.held.tokens.numel(),
        "confirm_finalists": len(confirmation),
    }


def profile_maker(
    settings: SearchSettings, prepared: Prepared, calibrated: Calibrated, studied: Studied
) -> Callable[..., Profile]:
    """``make(measured, **extra_metrics)``: that configuration's profile, with the search's
    provenance, budget accounting and metrics (the best uniform that fits among them)."""
    calibration = _provenance(prepared, calibrated)
    fp_ppl = read_json(calibrated.sensitivity, "sensitivity file").get("fp", {}).get("ppl")
    top = min((b for b in studied.baselines if b.fits), key=lambda b: b.kl, default=None)
    space, st = calibrated.space, studied.study
    accounting = {**prepared.budget.to_dict(), "preset": space.preset.name}

    def make(m: Measured, **extra: object) -> Profile:
        metrics = {
            "kl": _sig(m.kl),
            "kl_tokens": calibration["tokens"],
            "additive_kl": _sig(m.additive_kl),
            "fp_ppl": fp_ppl,
            "best_uniform": top.label if top else None,
            "best_uniform_kl": _sig(top.kl) if top else None,
            "trials": len(st.trials),
            "sampler": settings.study.sampler,
            "study": st.study_name,
            **extra,
        }
        made = Profile(
            settings.model, space.fingerprint, m.specs, calibration=calibration, metrics=metrics
        )
        return made.with_accounting(**accounting)

    return make


def profile(run: SearchRun, prepared: Prepared, calibrated: Calibrated, chosen: Studied) -> Profile:
    """The chosen configuration's profile, with the confirmation's metrics when there was one."""
    make = profile_maker(run.settings, prepared, calibrated, chosen)
    return make(chosen.best, **_confirm_metrics(prepared, chosen.confirmation))


def export(
    run: SearchRun, prepared: Prepared, calibrated: Calibrated, chosen: Studied, made: Profile
) -> SearchOutcome:
    """``made`` to ``settings.output``; with ``pareto_dir`` / ``plot``, those too."""
    settings, best = run.settings, chosen.best
    save_profile(made, settings.output)
    front = tuple(pareto_set(list(chosen.measured)))
    if settings.pareto_dir:
        make = profile_maker(settings, prepared, calibrated, chosen)
        write_pareto_dir(settings.pareto_dir, [make(m) for m in front])
    if settings.plot:
        label = f"{calibrated.preset.name} budget {prepared.budget.label}"
        title = f"{settings.model} {label}: {len(chosen.measured)} measured"
        plot_pareto(settings.plot, chosen.measured, front, best, chosen.baselines, title)
    seconds = time.monotonic() - run.started
    where = f"ran on {prepared.where.describe()['device']} in {prepared.where.dtype}; "
    summary = "\n".join(
        [
            format_summary(best, chosen.baselines, prepared.budget.label),
            where + peak_memory_line(prepared.where.torch_device),
        ]
    )
    trials = len(chosen.study.trials)
    return SearchOutcome(
        made, settings.output, best, chosen.baselines, front, trials, seconds, summary,
        chosen.confirmation,
    )  # fmt: skip
