"""`search_vllm()`: which layers ``--kv-cache-dtype-skip-layers`` should keep at the model's
dtype, for one vLLM ``--kv-cache-dtype``, within a memory budget.

Per layer there are two choices, D or the model dtype, and (full attention) every skipped layer
costs the same bytes, so the budget is a largest skip count k (bytes counted as vLLM allocates
them, :class:`~kvtuner.runtime_loader.vllm.VllmLayout`). Steps:

1. sensitivity: KL vs fp with only layer l stored in D, each l (cached in the study);
2. an Optuna study (sqlite beside the output, resumable) of measured KL over the skip sets four
   rules propose (:mod:`.skip_candidates`): additive top-k and swaps (``n_trials`` of them),
   greedy forward selection, the boundary layers, the layers with the largest fp keys; D on
   every layer is always measured;
3. confirmation: the best finalists and D-everywhere re-measured on held-back windows; the
   profile records which rule proposed the winner.

``ppl_within=X`` asks instead for the fewest skipped layers (most sensitive first) whose
perplexity on the calibration windows stays within X % of fp's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KVTunerError
from ..placement import placement_of
from ..profile import VllmProfile, save_vllm_profile
from ..runtime_loader.vllm import VllmLayout
from .search_stages import load_placed, load_text
from .skip_candidates import additive, boundary, greedy, largest_keys, merge_rules
from .skip_kl import SkipKL
from .study import StudySettings, measure_choices, open_measured_study
from .vllm_settings import VllmSettings, VllmTarget

if TYPE_CHECKING:
    from ..calibration import CalibrationData

__all__ = ["VllmOutcome", "VllmSettings", "VllmTarget", "run_vllm_search", "search_vllm"]
CONFIRM_FINALISTS = 4


@dataclass(frozen=True)
class VllmOutcome:
    profile: VllmProfile
    output: Path
    kl: float
    uniform_kl: float  # D on every layer
    sensitivity: tuple[float, ...]
    trials: int
    summary: str


def _layer_sensitivity(study, measure, num_layers: int, dtype: str, log) -> list[float]:
    """KL with only layer l in ``dtype`` (the rest at the model dtype); cached in the study."""
    key = f"sensitivity {dtype}"
    if key in study.user_attrs:
        return list(study.user_attrs[key])
    everyone = set(range(num_layers))
    out = [measure(tuple(sorted(everyone - {layer}))) for layer in range(num_layers)]
    study.set_user_attr(key, out)
    log(f"sensitivity: {num_layers} layers measured in {dtype}")
    return out


def _run_study(study, measure, candidates, num_layers: int) -> dict[tuple[int, ...], float]:
    """Measure each candidate not yet in the study (a rerun resumes); returns all measured."""
    params_of = lambda skip: {f"skip{i}": i in skip for i in range(num_layers)}  # noqa: E731
    done = measure_choices(study, [params_of(s) for s in candidates],
                           lambda p: measure(_skip_of(p, num_layers)), [False, True])  # fmt: skip
    return {_skip_of(dict(items), num_layers): kl for items, kl in done.items()}


def _skip_of(params: dict, num_layers: int) -> tuple[int, ...]:
    return tuple(i for i in range(num_layers) if params.get(f"skip{i}"))


def _fewest_within(measure_ppl, order: list[int], cap: int, limit: float, log) -> tuple[int, ...]:
    for k in range(cap + 1):
        skip = tuple(sorted(order[:k]))
        ppl = measure_ppl(skip)
        log(f"  skip {k:>2} layers {list(skip)}: ppl {ppl:.4f} (limit {limit:.4f})")
        if ppl <= limit:
            return skip
    raise KVTunerError(f"no skip set of up to {cap} layers keeps the perplexity under {limit:.4f}")


def search_vllm(
    *,
    n_trials: int = 12,
    storage: str | None = None,
    study_name: str | None = None,
    log: Callable[[str], None] = print,
    loaded: tuple[Any, Any] | None = None,
    progress: bool = False,
    **settings: Any,
) -> VllmOutcome:
    """:func:`run_vllm_search` over ``VllmSettings(**settings)`` (keywords: model, target,
    output, dataset, num_samples, ...), its study from ``n_trials``, ``storage``, ``study_name``."""
    study = StudySettings(n_trials=n_trials, storage=storage, study_name=study_name)
    settings = VllmSettings(study=study, **settings)
    return run_vllm_search(settings, log=log, loaded=loaded, progress=progress)


def run_vllm_search(
    settings: VllmSettings,
    *,
    log: Callable[[str], None] = print,
    loaded: tuple[Any, Any] | None = None,
    progress: bool = False,
) -> VllmOutcome:
    """Search the skip set for ``settings.target`` and write a vLLM profile (atomic): the model
    and text as :func:`kvtuner.tuner.search.run_search` prepares them, then sensitivity and study
    (or the fewest layers within ``ppl_within``), confirmation, write. ``progress``: a bar
    counting the skip sets measured."""
    s, target = settings, settings.target
    run = _prepare(s, loaded)
    text = f"{run.data.seq_len}x{s.num_samples}"
    name = s.study.study_name or f"vllm {target.kv_cache_dtype} cap {run.cap} {text}"
    study = open_measured_study(s.study.storage, name)
    skip_kl = run.skip_kl
    with _counting(skip_kl.kl, progress) as measure:
        sens = _layer_sensitivity(study, measure, skip_kl.num_layers, target.kv_cache_dtype, log)
        order = sorted(range(skip_kl.num_layers), key=lambda i: (-sens[i], i))
        best, measured, metrics = _choose(target, study, run, measure, order, s.study.n_trials, log)
    if run.held is not None:
        best, confirmed = _confirm(skip_kl, run.held.tokens, measured, log)
        metrics.update(confirmed)
    metrics["rule"] = metrics.pop("rules", {}).get(best, "ppl-within")
    metrics.update({"layer_kl": [float(f"{x:.6g}") for x in sens],
                    "trials": len(study.trials), "study": name})  # fmt: skip
    profile = _profile(s, run, best, measured, metrics)
    save_vllm_profile(profile, s.output)
    return VllmOutcome(profile, s.output, measured[best], measured[()], tuple(sens),
                       len(study.trials), _summary(profile, target))  # fmt: skip


@dataclass(frozen=True)
class _Prepared:
    layout: VllmLayout
    cap: int  # the most layers the target lets stay at the model dtype
    data: CalibrationData
    held: CalibrationData | None
    skip_kl: SkipKL  # on ``data``


def _prepare(settings: VllmSettings, loaded: tuple[Any, Any] | None) -> _Prepared:
    """Model and text (shared with the kvtuner search), vLLM's layout, the skip cap."""
    from ..calibration import fingerprint_of

    s, target = settings, settings.target
    lm, tokenizer, _ = load_placed(s.model, s.device, s.dtype, loaded)
    fp = fingerprint_of(lm)
    layout = VllmLayout(fp, target.model_dtype)
    cap = target.skip_cap(layout)
    confirm = 0 if target.ppl_within is not None else s.confirm_samples  # no study to confirm
    data, held = load_text(tokenizer, s, confirm)
    s.output.parent.mkdir(parents=True, exist_ok=True)
    skip_kl = SkipKL.on(lm, target.kv_cache_dtype, fp.num_layers, data.tokens)
    return _Prepared(layout, cap, data, held, skip_kl)


@contextmanager
def _counting(measure: Callable[[tuple[int, ...]], float], enabled: bool):
    """``measure`` with a progress bar counting its calls (the sets measured)."""
    from tqdm.auto import tqdm

    with tqdm(desc="skip sets", unit="set", disable=not enabled, dynamic_ncols=True) as bar:

        def counted(skip: tuple[int, ...]) -> float:
            bar.update()
            return measure(skip)

        yield counted


def _choose(target, study, run: _Prepared, measure, order, n_trials: int, log):
    """(best skip set, KL of every measured one, metrics): the fewest within ``ppl_within``, or
    the least KL over the sets the rules propose (``metrics["rules"]``: set -> rule)."""
    skip_kl, cap = run.skip_kl, run.cap
    if target.ppl_within is not None:
        limit = skip_kl.reference.ppl * (1 + target.ppl_within / 100)
        best = _fewest_within(skip_kl.ppl, order, cap, limit, log)
        measured = {best: skip_kl.kl(best), (): skip_kl.kl(())}
        return best, measured, {"ppl_within_pct": target.ppl_within}
    layers = skip_kl.num_layers
    measure_all = lambda sets: _run_study(study, measure, sets, layers)  # noqa: E731
    rules = merge_rules({
        "additive": additive(order, cap, n_trials),
        "greedy": greedy(measure_all, layers, cap, log),
        "boundary": boundary(layers, cap),
        "largest-keys": largest_keys(_key_peaks(study, skip_kl, run.data.tokens), cap),
    })  # fmt: skip
    measured = measure_all(list(rules))
    measured = {s: measured[s] for s in rules}  # the proposed sets, not the greedy side steps
    best = min(measured, key=lambda s: (measured[s], len(s)))
    log(f"study: {len(measured)} proposed sets; best {list(best)} by {rules[best]}")
    return best, measured, {"rules": rules}


def _key_peaks(study, skip_kl: SkipKL, tokens) -> list[float]:
    """Per layer, the fp max|k| over the calibration tokens (post-RoPE, as vLLM stores keys);
    cached in the study."""
    if "key peaks" not in study.user_attrs:
        from ..calibration.smoothing import key_magnitudes

        mags = key_magnitudes(skip_kl.lm, tokens, quantile=1.0)
        study.set_user_attr("key peaks", [float(m.max()) for m in mags])
    return list(study.user_attrs["key peaks"])


def _confirm(skip_kl: SkipKL, tokens, measured, log):
    """The best finalists and D-everywhere re-measured on held-back windows; the best there."""
    held = SkipKL.on(skip_kl.lm, skip_kl.kv_cache_dtype, skip_kl.num_layers, tokens)
    finalists = sorted(measured, key=lambda s: (measured[s], len(s)))[:CONFIRM_FINALISTS]
    finalists = list(dict.fromkeys([*finalists, ()]))
    again = {s: held.kl(s) for s in finalists}
    log(f"confirmation on {tokens.numel()} held-back tokens:")
    for s in finalists:
        log(f"  skip {list(s)}: {measured[s]:.5g} -> {again[s]:.5g}")
    best = min(again, key=lambda s: (again[s], len(s)))
    return best, {"confirm_kl": again[best], "confirm_uniform_kl": again[()],
                  "confirm_tokens": tokens.numel()}  # fmt: skip


def _profile(settings: VllmSettings, run: _Prepared, best, measured, metrics) -> VllmProfile:
    """The vLLM profile of ``best``: its plan, vLLM's bytes for it, KL and ppl vs fp."""
    target, layout, skip_kl = settings.target, run.layout, run.skip_kl
    final, fp_ppl = skip_kl.plan(best), skip_kl.reference.ppl
    metrics = {"kl": measured[best], "uniform_kl": measured[()], "fp_ppl": fp_ppl,
               "ppl": skip_kl.ppl(best), **metrics}  # fmt: skip
    bytes_tok = layout.bytes_per_token(final)
    budget = {"skip_cap": run.cap, "bytes_per_token": bytes_tok,
              "ratio_to_model_dtype": round(bytes_tok / layout.fp_bytes_per_token(), 4),
              **({} if target.budget is None else {"asked": target.budget.label}),
              **({} if target.max_skip is None else {"max_skip": target.max_skip})}  # fmt: skip
    calibration = {**run.data.describe(), **placement_of(skip_kl.lm).describe()}
    return VllmProfile(settings.model, layout.fingerprint, final, target.model_dtype, budget,
                       calibration, metrics)  # fmt: skip


def _summary(profile: VllmProfile, target: VllmTarget) -> str:
    m, b, d = profile.metrics, profile.budget, target.kv_cache_dtype
    return (
        f"vLLM {d}: skip {list(profile.plan.skip_layers)} -> KL {m['kl']:.5g} "
        f"(every layer {d}: {m['uniform_kl']:.5g}), ppl {m['ppl']:.4f} "
        f"(fp {m['fp_ppl']:.4f}), {b['bytes_per_token']} bytes/token "
        f"({b['ratio_to_model_dtype']}x of {target.model_dtype})"
    )
