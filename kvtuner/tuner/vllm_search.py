"""`search_vllm()`: which layers ``--kv-cache-dtype-skip-layers`` should keep at the model's
dtype, for one vLLM ``--kv-cache-dtype``, within a memory budget.

Per layer there are two choices, D or the model dtype, and (full attention) every skipped layer
costs the same bytes, so the budget is a largest skip count k (bytes counted as vLLM allocates
them, :class:`~kvtuner.runtime_loader.vllm.VllmLayout`). Steps:

1. sensitivity: KL vs fp with only layer l stored in D, each l (cached in the study);
2. an Optuna study (sqlite beside the output, resumable) of measured KL over skip sets: the
   additive optimum (the k most sensitive layers) at k and below, then swaps of its least
   sensitive member for the next most sensitive layers; D on every layer is always measured;
3. confirmation: the best finalists and D-everywhere re-measured on held-back windows.

``ppl_within=X`` asks instead for the fewest skipped layers (most sensitive first) whose
perplexity on the calibration windows stays within X % of fp's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..errors import KVTunerError
from ..placement import placement, placement_of
from ..profile import VllmProfile, save_vllm_profile
from ..runtime_loader.vllm import VllmLayout, VllmPlan
from .budget import Budget
from .search import default_storage

__all__ = ["VllmOutcome", "VllmTarget", "search_vllm"]
CONFIRM_FINALISTS = 4


@dataclass(frozen=True)
class VllmTarget:
    """What the skip set may cost: ``budget`` (bytes vs vLLM's cache at the model dtype, ``0.6x``,
    or mean bits per element, ``10bit``), ``max_skip`` layers, or both; ``ppl_within``: percent."""

    kv_cache_dtype: str
    budget: Budget | None = None
    max_skip: int | None = None
    ppl_within: float | None = None
    model_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        VllmPlan(self.kv_cache_dtype, 1)  # one line for an unknown dtype
        m = self.max_skip
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise KVTunerError(f"--max-skip must be a non-negative int, got {m!r}")
        p = self.ppl_within
        if p is not None and not (isinstance(p, int | float) and 0 < p < 1000):
            raise KVTunerError(f"--ppl-within must be a percentage > 0, got {p!r}")
        if self.budget is None and m is None and p is None:
            raise KVTunerError("the vLLM target needs --budget, --max-skip or --ppl-within")

    def ratio_cap(self) -> Fraction | None:
        if self.budget is None:
            return None
        value = self.budget.value
        return value if self.budget.kind == "ratio" else value / 16

    def skip_cap(self, layout: VllmLayout) -> int:
        """The most layers that may be skipped: --max-skip and the bytes budget, as vLLM counts."""
        n = layout.fingerprint.num_layers
        cap, ratio = n if self.max_skip is None else min(self.max_skip, n), self.ratio_cap()
        fp = layout.fp_bytes_per_token()

        def fits(k: int) -> bool:
            cost = layout.bytes_per_token(VllmPlan(self.kv_cache_dtype, n, tuple(range(k))))
            return ratio is None or Fraction(cost, fp) <= ratio

        if not fits(0):
            cost = layout.bytes_per_token(VllmPlan(self.kv_cache_dtype, n))
            raise KVTunerError(
                f"budget {self.budget.label} is below {self.kv_cache_dtype} on every layer "
                f"({cost / fp:.4f}x of {self.model_dtype})"
            )
        return max(k for k in range(cap + 1) if fits(k))


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


def _candidates(order: list[int], cap: int, n_trials: int) -> list[tuple[int, ...]]:
    """Skip sets to measure: additive optima (top-k by sensitivity, k = cap..0), then the top-cap
    set with its least sensitive member swapped for each next most sensitive layer; D on every
    layer (no skip) first, always."""
    seeds = [tuple(sorted(order[:k])) for k in range(cap, -1, -1)]
    swaps = []
    if 0 < cap < len(order):
        for j in range(cap, len(order)):
            swaps.append(tuple(sorted([*order[: cap - 1], order[j]])))
    unique = list(dict.fromkeys([(), *seeds[:2], *swaps, *seeds[2:]]))  # () = D everywhere
    return unique[: max(n_trials, 2)]


def _run_study(study, measure, candidates, num_layers: int) -> dict[tuple[int, ...], float]:
    """Measure each candidate not yet in the study (a rerun resumes); returns all measured."""

    def skip_of(params: dict) -> tuple[int, ...]:
        return tuple(i for i in range(num_layers) if params.get(f"skip{i}"))

    done = {skip_of(t.params): t.value for t in study.trials if t.value is not None}
    for skip in candidates:
        if skip in done:
            continue
        params = {f"skip{i}": i in skip for i in range(num_layers)}
        study.enqueue_trial(params)
        trial = study.ask()
        for k in params:  # the enqueued values come back
            trial.suggest_categorical(k, [False, True])
        value = measure(skip)
        study.tell(trial, value)
        done[skip] = value
    return done


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
    model: str,
    target: VllmTarget,
    output: str | Path = "profile.json",
    n_trials: int = 12,
    storage: str | None = None,
    study_name: str | None = None,
    dataset: str | None = None,
    num_samples: int = 2,
    seq_len: int = 256,
    data_seed: int = 0,
    confirm_samples: int = 4,
    device: str = "auto",
    dtype: str = "auto",
    log: Callable[[str], None] = print,
    loaded: tuple[Any, Any] | None = None,
) -> VllmOutcome:
    """Search the skip set for ``target`` on ``model`` and write a vLLM profile (atomic)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from ..calibration import fingerprint_of, fp_reference, load_calibration_data, load_model
    from ..calibration.kl import measure_with_cache
    from ..runtime_loader.hf.vllm_cache import make_vllm_cache

    output = Path(output)
    where = placement(device, dtype)
    lm, tokenizer = loaded or load_model(model, device=where.device, dtype=where.dtype)
    fp = fingerprint_of(lm)
    layout = VllmLayout(fp, target.model_dtype)
    cap = target.skip_cap(layout)
    data = load_calibration_data(
        tokenizer, dataset=dataset, num_samples=num_samples, seq_len=seq_len, seed=data_seed
    )
    reference = fp_reference(lm, data.tokens)

    def plan(skip) -> VllmPlan:
        return VllmPlan(target.kv_cache_dtype, fp.num_layers, tuple(skip))

    def run(skip, ref=reference, tokens=data.tokens, nll=False):
        new_cache = lambda: make_vllm_cache(lm, plan(skip))  # noqa: E731
        return measure_with_cache(lm, tokens, ref, new_cache, nll=nll)

    output.parent.mkdir(parents=True, exist_ok=True)
    name = study_name or f"vllm {target.kv_cache_dtype} cap {cap} {data.seq_len}x{num_samples}"
    study = optuna.create_study(
        storage=storage or default_storage(output), study_name=name, load_if_exists=True
    )
    kl_of = lambda skip: run(skip)[0]  # noqa: E731
    sens = _layer_sensitivity(study, kl_of, fp.num_layers, target.kv_cache_dtype, log)
    order = sorted(range(fp.num_layers), key=lambda i: (-sens[i], i))
    metrics: dict[str, Any] = {}
    if target.ppl_within is not None:
        limit = reference.ppl * (1 + target.ppl_within / 100)
        best = _fewest_within(lambda s: math.exp(run(s, nll=True)[1]), order, cap, limit, log)
        measured = {best: run(best)[0], (): run(())[0]}
        metrics["ppl_within_pct"] = target.ppl_within
    else:
        candidates = _candidates(order, cap, n_trials)
        measured = _run_study(study, kl_of, candidates, fp.num_layers)
        best = min(measured, key=lambda s: (measured[s], len(s)))
        if confirm_samples:
            best, metrics = _confirm(lm, tokenizer, dataset, data, confirm_samples, measured,
                                     run, log)  # fmt: skip
    final = plan(best)
    ppl = math.exp(run(best, nll=True)[1])
    metrics.update({"kl": measured[best], "uniform_kl": measured[()], "fp_ppl": reference.ppl,
                    "ppl": ppl, "layer_kl": [float(f"{x:.6g}") for x in sens],
                    "trials": len(study.trials), "study": name})  # fmt: skip
    bytes_tok = layout.bytes_per_token(final)
    budget = {"skip_cap": cap, "bytes_per_token": bytes_tok,
              "ratio_to_model_dtype": round(bytes_tok / layout.fp_bytes_per_token(), 4),
              **({} if target.budget is None else {"asked": target.budget.label}),
              **({} if target.max_skip is None else {"max_skip": target.max_skip})}  # fmt: skip
    calibration = {**data.describe(), **placement_of(lm).describe()}
    profile = VllmProfile(model, fp, final, target.model_dtype, budget, calibration, metrics)
    save_vllm_profile(profile, output)
    summary = (
        f"vLLM {target.kv_cache_dtype}: skip {list(best)} -> KL {measured[best]:.5g} "
        f"(every layer {target.kv_cache_dtype}: {measured[()]:.5g}), ppl {ppl:.4f} "
        f"(fp {reference.ppl:.4f}), {bytes_tok} bytes/token ({budget['ratio_to_model_dtype']}x "
        f"of {target.model_dtype})"
    )
    return VllmOutcome(profile, output, measured[best], measured[()], tuple(sens),
                       len(study.trials), summary)  # fmt: skip


def _confirm(lm, tokenizer, dataset, data, samples, measured, run, log):
    """The best finalists and D-everywhere re-measured on held-back windows; the best there."""
    from ..calibration import fp_reference
    from .confirmation import held_back

    held = held_back(tokenizer, dataset, data, samples)
    ref = fp_reference(lm, held.tokens)
    finalists = sorted(measured, key=lambda s: (measured[s], len(s)))[:CONFIRM_FINALISTS]
    finalists = list(dict.fromkeys([*finalists, ()]))
    again = {s: run(s, ref=ref, tokens=held.tokens)[0] for s in finalists}
    log(f"confirmation on {held.tokens.numel()} held-back tokens:")
    for s in finalists:
        log(f"  skip {list(s)}: {measured[s]:.5g} -> {again[s]:.5g}")
    best = min(again, key=lambda s: (again[s], len(s)))
    return best, {"confirm_kl": again[best], "confirm_uniform_kl": again[()],
                  "confirm_tokens": held.tokens.numel()}  # fmt: skip
