"""The write stage of a search: the profile (atomic), with the search's provenance and metrics,
the Pareto set, the plot and the summary table, gathered in a :class:`SearchOutcome`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..placement import peak_memory_line
from ..profile import Profile, read_json, save_profile
from .confirmation import Confirmed
from .report import format_summary, plot_pareto, write_pareto_dir
from .results import Baseline, Measured, pareto_set
from .search_settings import SearchSettings
from .search_stages import Calibrated, Prepared, Studied
from .sensitivity_file import smoothing_provenance

__all__ = ["SearchOutcome", "write"]


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


def _provenance(run: Prepared, calibrated: Calibrated) -> dict:
    """The profile's ``calibration``: the study's tokens, where they ran, the sensitivity file."""
    out = {**run.data.describe(), **run.where.describe()}
    out["sensitivity"] = calibrated.sensitivity.name
    if calibrated.preset.smoothing is not None:
        out["key_smoothing"] = smoothing_provenance(calibrated.preset)
    return out


def _confirm_metrics(run: Prepared, confirmation: tuple[Confirmed, ...]) -> dict:
    if not confirmation or run.held is None:
        return {}
    best = confirmation[0]
    return {
        f"confirm_{best.metric}": _sig(best.score),
        "confirm_tokens": run.held.tokens.numel(),
        "confirm_finalists": len(confirmation),
    }


def profile_maker(
    settings: SearchSettings, run: Prepared, calibrated: Calibrated, studied: Studied
) -> Callable[..., Profile]:
    """``make(measured, **extra_metrics)``: that configuration's profile, with the search's
    provenance, budget accounting and metrics (the best uniform that fits among them)."""
    calibration = _provenance(run, calibrated)
    fp_ppl = read_json(calibrated.sensitivity, "sensitivity file").get("fp", {}).get("ppl")
    top = min((b for b in studied.baselines if b.fits), key=lambda b: b.kl, default=None)
    space, st = calibrated.space, studied.study
    accounting = {**run.budget.to_dict(), "preset": space.preset.name}

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
        profile = Profile(
            settings.model, space.fingerprint, m.specs, calibration=calibration, metrics=metrics
        )
        return profile.with_accounting(**accounting)

    return make


def write(
    settings: SearchSettings,
    run: Prepared,
    calibrated: Calibrated,
    studied: Studied,
    started: float,
) -> SearchOutcome:
    """The profile to ``settings.output``; with ``pareto_dir`` / ``plot``, those too."""
    make, best = profile_maker(settings, run, calibrated, studied), studied.best
    profile = make(best, **_confirm_metrics(run, studied.confirmation))
    save_profile(profile, settings.output)
    front = tuple(pareto_set(list(studied.measured)))
    if settings.pareto_dir:
        write_pareto_dir(settings.pareto_dir, [make(m) for m in front])
    if settings.plot:
        label = f"{calibrated.preset.name} budget {run.budget.label}"
        title = f"{settings.model} {label}: {len(studied.measured)} measured"
        plot_pareto(settings.plot, studied.measured, front, best, studied.baselines, title)
    seconds = time.monotonic() - started
    where = f"ran on {run.where.describe()['device']} in {run.where.dtype}; "
    summary = "\n".join(
        [
            format_summary(best, studied.baselines, run.budget.label),
            where + peak_memory_line(run.where.torch_device),
        ]
    )
    trials = len(studied.study.trials)
    return SearchOutcome(
        profile, settings.output, best, studied.baselines, front, trials, seconds, summary,
        studied.confirmation,
    )  # fmt: skip
