"""The vLLM target: which layers ``--kv-cache-dtype-skip-layers`` should keep at the model's
dtype, for one vLLM ``--kv-cache-dtype``, within a memory budget.

Per layer there are two choices, D or the model dtype, and (full attention) every skipped layer
costs the same bytes, so the budget is a largest skip count k (bytes counted as vLLM allocates
them, :class:`~kvtuner.runtime_loader.vllm.VllmLayout`). Its stages:

1. prepare: the model and text (as every target loads them), vLLM's layout, the skip cap, the
   study (sqlite beside the output, resumable);
2. candidates: the sensitivity, KL vs fp with only layer l stored in D, each l (cached in the
   study), then the skip sets four rules propose (:mod:`.candidates`): additive top-k and swaps
   (``n_trials`` of them), greedy forward selection (measured as it goes), the boundary layers,
   the layers with the largest fp keys; D on every layer is always one;
3. measure: every proposed set's KL, a trial of the study each;
4. choose: the least KL; with confirmation, the best finalists and D-everywhere re-measured on
   held-back windows decide; the profile records which rule proposed the winner;
5. profile, export: the vLLM profile, written atomically.

``ppl_within=X`` asks instead for the fewest skipped layers (most sensitive first) whose
perplexity on the calibration windows stays within X % of fp's: the candidates are the most
sensitive k layers, k = 0..cap, measured in that order until one is within.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import KVTunerError
from ...placement import placement_of
from ...profile import VllmProfile, save_vllm_profile
from ...runtime_loader.vllm import VllmLayout
from ..budget import Budget
from ..loading import load_placed, load_text
from ..study import StudySettings, measure_choices, open_measured_study
from ..target import Chosen, SearchRun, Target
from .candidates import Skip, additive, boundary, greedy, largest_keys, merge_rules
from .kl import SkipKL
from .settings import VllmGoal, VllmSettings

if TYPE_CHECKING:
    import optuna

    from ...calibration import CalibrationData

__all__ = ["TARGET", "VllmOutcome", "settings_of"]
CONFIRM_FINALISTS = 4
PPL_WITHIN = "ppl-within"  # the rule that proposes every set with --ppl-within


@dataclass(frozen=True)
class VllmOutcome:
    profile: VllmProfile
    output: Path
    kl: float
    uniform_kl: float  # D on every layer
    sensitivity: tuple[float, ...]
    trials: int
    summary: str


class _Counted:
    """``measure`` with a progress bar counting its calls (the sets measured), opened on the
    first call and closed by :meth:`close` (a bar spans two stages, so it is no context)."""

    def __init__(self, measure: Callable[[Skip], float], enabled: bool) -> None:
        self.measure, self.enabled, self.bar = measure, enabled, None

    def __call__(self, skip: Skip) -> float:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc="skip sets", unit="set", disable=not self.enabled,
                            dynamic_ncols=True)  # fmt: skip
        self.bar.update()
        return self.measure(skip)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass(frozen=True)
class Prepared:
    layout: VllmLayout
    cap: int  # the most layers the goal lets stay at the model dtype
    data: CalibrationData
    held: CalibrationData | None
    skip_kl: SkipKL  # on ``data``
    study: optuna.Study
    counted_kl: _Counted  # ``skip_kl.kl``, its calls counted by a bar


@dataclass(frozen=True)
class Candidates:
    sensitivity: tuple[float, ...]  # [layer] KL with only that layer in D
    rules: dict[Skip, str]  # every proposed set, in proposal order -> the rules proposing it


@dataclass(frozen=True)
class Measured:
    kl: dict[Skip, float]  # the proposed sets measured (not the greedy side steps)
    best: Skip  # least KL (then fewest layers), or the fewest within ppl_within
    metrics: dict[str, Any]


def settings_of(
    *,
    kv_cache_dtype: str | None = None,
    budget: Budget | str | None = None,
    max_skip: int | None = None,
    ppl_within: float | None = None,
    model_dtype: str = "bfloat16",
    n_trials: int = 12,
    storage: str | None = None,
    study_name: str | None = None,
    **keywords: Any,
) -> VllmSettings:
    """``VllmSettings(**keywords)`` (model, output, dataset, num_samples, ...): its
    :class:`VllmGoal` from ``kv_cache_dtype``, ``budget`` (``"0.55x"``, ``"10bit"`` or a
    :class:`Budget`), ``max_skip``, ``ppl_within``, ``model_dtype``; its study from ``n_trials``,
    ``storage``, ``study_name``."""
    if not kv_cache_dtype:
        raise KVTunerError("the vllm target needs kv_cache_dtype (e.g. fp8_e4m3)")
    if isinstance(budget, str):
        budget = Budget.parse(budget)
    goal = VllmGoal(kv_cache_dtype, budget, max_skip, ppl_within, model_dtype)
    study = StudySettings(n_trials=n_trials, storage=storage, study_name=study_name)
    return VllmSettings(goal=goal, study=study, **keywords)


def prepare(run: SearchRun) -> Prepared:
    """Model and text (as every target loads them), vLLM's layout, the skip cap, the study."""
    from ...calibration import fingerprint_of

    s, goal = run.settings, run.settings.goal
    lm, tokenizer, _ = load_placed(s.model, s.device, s.dtype, run.loaded)
    fp = fingerprint_of(lm)
    layout = VllmLayout(fp, goal.model_dtype)
    cap = goal.skip_cap(layout)
    confirm = 0 if goal.ppl_within is not None else s.confirm_samples  # no study to confirm
    data, held = load_text(tokenizer, s, confirm)
    s.output.parent.mkdir(parents=True, exist_ok=True)
    skip_kl = SkipKL.on(lm, goal.kv_cache_dtype, fp.num_layers, data.tokens)
    text = f"{data.seq_len}x{s.num_samples}"
    name = s.study.study_name or f"vllm {goal.kv_cache_dtype} cap {cap} {text}"
    study = open_measured_study(
        s.study.storage, name, model=f"{s.model} {fp.hash}", where=placement_of(lm)
    )
    return Prepared(layout, cap, data, held, skip_kl, study, _Counted(skip_kl.kl, run.progress))


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


def _run_study(study, measure, candidates, num_layers: int) -> dict[Skip, float]:
    """Measure each candidate not yet in the study (a rerun resumes); returns all measured."""
    params_of = lambda skip: {f"skip{i}": i in skip for i in range(num_layers)}  # noqa: E731
    done = measure_choices(study, [params_of(s) for s in candidates],
                           lambda p: measure(_skip_of(p, num_layers)), [False, True])  # fmt: skip
    return {_skip_of(dict(items), num_layers): kl for items, kl in done.items()}


def _skip_of(params: dict, num_layers: int) -> Skip:
    return tuple(i for i in range(num_layers) if params.get(f"skip{i}"))


def _measure_all(prepared: Prepared) -> Callable[[list[Skip]], dict[Skip, float]]:
    """Sets -> the KL of every set the study holds, the missing ones measured (counted)."""
    p = prepared
    return lambda sets: _run_study(p.study, p.counted_kl, sets, p.skip_kl.num_layers)


def candidates(run: SearchRun, prepared: Prepared) -> Candidates:
    """The layers' sensitivity, then the sets the rules propose (greedy measures as it goes);
    with ``ppl_within``, the most sensitive k layers for k = 0..cap."""
    goal, p, log = run.settings.goal, prepared, run.log
    layers, cap = p.skip_kl.num_layers, p.cap
    sens = _layer_sensitivity(p.study, p.counted_kl, layers, goal.kv_cache_dtype, log)
    order = sorted(range(layers), key=lambda i: (-sens[i], i))
    if goal.ppl_within is not None:
        prefixes = [tuple(sorted(order[:k])) for k in range(cap + 1)]
        return Candidates(tuple(sens), dict.fromkeys(prefixes, PPL_WITHIN))
    rules = merge_rules({
        "additive": additive(order, cap, run.settings.study.n_trials),
        "greedy": greedy(_measure_all(p), layers, cap, log),
        "boundary": boundary(layers, cap),
        "largest-keys": largest_keys(_key_peaks(p.study, p.skip_kl, p.data.tokens), cap),
    })  # fmt: skip
    return Candidates(tuple(sens), rules)


def _key_peaks(study, skip_kl: SkipKL, tokens) -> list[float]:
    """Per layer, the fp max|k| over the calibration tokens (post-RoPE, as vLLM stores keys);
    cached in the study."""
    if "key peaks" not in study.user_attrs:
        from ...calibration.smoothing import key_magnitudes

        mags = key_magnitudes(skip_kl.lm, tokens, quantile=1.0)
        study.set_user_attr("key peaks", [float(m.max()) for m in mags])
    return list(study.user_attrs["key peaks"])


def measure(run: SearchRun, prepared: Prepared, proposed: Candidates) -> Measured:
    """Every proposed set's KL (a trial each) and the least; with ``ppl_within``, the sets'
    perplexity in order until one is within, and the KL of it and of D everywhere."""
    try:
        if run.settings.goal.ppl_within is not None:
            return _fewest_within(run, prepared, list(proposed.rules))
        measured = _measure_all(prepared)(list(proposed.rules))
    finally:
        prepared.counted_kl.close()
    measured = {s: measured[s] for s in proposed.rules}  # the proposed sets, not the side steps
    best = min(measured, key=lambda s: (measured[s], len(s)))
    run.log(f"study: {len(measured)} proposed sets; best {list(best)} by {proposed.rules[best]}")
    return Measured(measured, best, {})


def _fewest_within(run: SearchRun, prepared: Prepared, prefixes: list[Skip]) -> Measured:
    skip_kl, pct = prepared.skip_kl, run.settings.goal.ppl_within
    limit = skip_kl.reference.ppl * (1 + pct / 100)
    for k, skip in enumerate(prefixes):
        ppl = skip_kl.ppl(skip)
        run.log(f"  skip {k:>2} layers {list(skip)}: ppl {ppl:.4f} (limit {limit:.4f})")
        if ppl <= limit:
            measured = {skip: skip_kl.kl(skip), (): skip_kl.kl(())}
            return Measured(measured, skip, {"ppl_within_pct": pct})
    raise KVTunerError(
        f"no skip set of up to {prepared.cap} layers keeps the perplexity under {limit:.4f}"
    )


def choose(run: SearchRun, prepared: Prepared, proposed: Candidates, measured: Measured) -> Chosen:
    """The least KL measured; with held-back windows, the best finalist there."""
    if prepared.held is None:
        return Chosen(measured.best, measured.kl, dict(measured.metrics))
    best, confirmed = _confirm(prepared.skip_kl, prepared.held.tokens, measured.kl, run.log)
    return Chosen(best, measured.kl, {**measured.metrics, **confirmed})


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


def profile(
    run: SearchRun, prepared: Prepared, proposed: Candidates, chosen: Chosen
) -> VllmProfile:
    """The vLLM profile of the chosen set: its plan, vLLM's bytes for it, KL and ppl vs fp, the
    rule that proposed it."""
    goal, p, best = run.settings.goal, prepared, chosen.best
    final, fp_ppl = p.skip_kl.plan(best), p.skip_kl.reference.ppl
    metrics = {"kl": chosen.kl[best], "uniform_kl": chosen.kl[()], "fp_ppl": fp_ppl,
               "ppl": p.skip_kl.ppl(best), **chosen.metrics, "rule": proposed.rules[best],
               "layer_kl": [float(f"{x:.6g}") for x in proposed.sensitivity],
               "trials": len(p.study.trials), "study": p.study.study_name}  # fmt: skip
    bytes_tok = p.layout.bytes_per_token(final)
    budget = {"skip_cap": p.cap, "bytes_per_token": bytes_tok,
              "ratio_to_model_dtype": round(bytes_tok / p.layout.fp_bytes_per_token(), 4),
              **({} if goal.budget is None else {"asked": goal.budget.label}),
              **({} if goal.max_skip is None else {"max_skip": goal.max_skip})}  # fmt: skip
    calibration = {**p.data.describe(), **placement_of(p.skip_kl.lm).describe()}
    return VllmProfile(run.settings.model, p.layout.fingerprint, final, goal.model_dtype,
                       budget, calibration, metrics)  # fmt: skip


def export(
    run: SearchRun, prepared: Prepared, proposed: Candidates, chosen: Chosen, made: VllmProfile
) -> VllmOutcome:
    """The profile written (atomic) to ``settings.output``, and the outcome."""
    output, best = run.settings.output, chosen.best
    save_vllm_profile(made, output)
    return VllmOutcome(made, output, chosen.kl[best], chosen.kl[()], proposed.sensitivity,
                       len(prepared.study.trials), _summary(made, run.settings.goal))  # fmt: skip


def _summary(profile: VllmProfile, goal: VllmGoal) -> str:
    m, b, d = profile.metrics, profile.budget, goal.kv_cache_dtype
    return (
        f"vLLM {d}: skip {list(profile.plan.skip_layers)} -> KL {m['kl']:.5g} "
        f"(every layer {d}: {m['uniform_kl']:.5g}), ppl {m['ppl']:.4f} "
        f"(fp {m['fp_ppl']:.4f}), {b['bytes_per_token']} bytes/token "
        f"({b['ratio_to_model_dtype']}x of {goal.model_dtype})"
    )


TARGET = Target(
    name="vllm",
    settings_type=VllmSettings,
    help="which layers vLLM's --kv-cache-dtype-skip-layers keeps at the model dtype, the rest "
    "in --kv-cache-dtype",
    settings=settings_of,
    prepare=prepare,
    candidates=candidates,
    measure=measure,
    choose=choose,
    profile=profile,
    export=export,
)
