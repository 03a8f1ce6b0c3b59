"""The recipe target: a KV format per layer, among the formats an engine serves with its own
kernels (FP8, NVFP4, FP8-K/NVFP4-V, the model dtype), within a budget in ModelOpt's effective bits.

Its stages (every recipe measured is a trial of one Optuna study beside the output, so a rerun or
a killed run resumes; the study is keyed by the text, not by the formats or the budget, so
searches of one model share their measurements):

1. prepare: the model and text, the fp reference and each layer's K/V amax (the FP8/NVFP4
   scales), the study;
2. candidates: the one-layer tables (:mod:`.candidates`), ``isolated`` (ModelOpt's score) and
   ``in_context``, and the seeds they pick: ModelOpt's pick (the isolated knapsack over the
   formats it may pick, the model dtype excluded), the knapsack picks of both tables over every
   target format, and each uniform format that fits;
3. measure: the seeds, measured whole, then a local search from the best of them: ``n_trials``
   more recipes, one- and two-layer moves that fit, best predicted first; a move is taken when
   its measured KL is lower;
4. choose: the best finalists and ModelOpt's pick re-measured window by window on held-back
   text; the best replaces ModelOpt's pick only when it is better by more than two standard
   errors of the paired difference (else the search could lose to it by luck);
5. profile, export: the recipe profile, written atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import KVTunerError
from ...placement import placement_of
from ...profile.recipe_profile import RecipeProfile, save_recipe_profile
from ...quant.engine_recipe import LAYER_FORMATS, MODEL_DTYPE, EngineRecipe, format_bits
from ..budget import Budget
from ..loading import load_placed, load_text
from ..plan_kl import PlanKL
from ..study import StudySettings, measure_choices, open_measured_study
from ..target import Chosen, SearchRun, Target
from .candidates import Recipe, knapsack_pick, neighbours, recipe_bits
from .settings import RecipeGoal, RecipeSettings

if TYPE_CHECKING:
    from ...calibration import CalibrationData

__all__ = ["TARGET", "RecipeOutcome", "settings_of"]
CONFIRM_FINALISTS = 4
CONFIRM_MARGIN = 2.0  # standard errors a held-back gain must clear to replace ModelOpt's pick
Log = Callable[[str], None]


@dataclass(frozen=True)
class RecipeOutcome:
    profile: RecipeProfile
    output: Path
    kl: float
    modelopt_kl: float  # ModelOpt's additive pick, measured on the same windows
    trials: int
    summary: str


@dataclass(frozen=True)
class Prepared:
    """The model, its text and calibration, and the study's measure."""

    settings: RecipeSettings
    fingerprint: Any
    data: CalibrationData
    held: CalibrationData | None
    plan_kl: PlanKL
    base: EngineRecipe  # the calibration's amax, every layer in the model dtype
    study: Any

    @property
    def formats(self) -> tuple[str, ...]:
        return self.settings.goal.by_bits(self.fingerprint.head_dim)

    @property
    def bits(self) -> dict[str, Fraction]:
        head_dim = self.fingerprint.head_dim
        return {f: format_bits(f, head_dim) for f in (MODEL_DTYPE, *self.formats)}

    @property
    def capacity(self) -> Fraction:
        return self.settings.goal.capacity(self.fingerprint.num_layers)

    def measure(self, recipes: list[Recipe]) -> dict[Recipe, float]:
        """Measured KL of ``recipes`` and of every recipe the study holds (resumed ones free)."""
        options = list(LAYER_FORMATS)  # one study serves every format set and budget
        params = [{f"layer{i}": f for i, f in enumerate(r)} for r in recipes]
        kl_of = lambda p: self.plan_kl.kl(self.base.with_layers(_recipe_of(p)))  # noqa: E731
        done = measure_choices(self.study, params, kl_of, options)
        return {_recipe_of(dict(items)): kl for items, kl in done.items()}


def _recipe_of(params: dict) -> Recipe:
    return tuple(params[f"layer{i}"] for i in range(len(params)))


@dataclass(frozen=True)
class Seeds:
    isolated: list[dict[str, float]]  # [layer] -> format -> KL, that layer alone quantized
    in_context: list[dict[str, float]]  # [layer] -> format -> KL change among cheapest layers
    recipes: dict[str, Recipe]  # name -> seed recipe that fits; "modelopt" is ModelOpt's pick


@dataclass(frozen=True)
class Measured:
    kl: dict[Recipe, float]  # every fitting recipe the study holds
    searched: Recipe  # where the local search ended


def settings_of(
    *,
    engine: str = "vllm",
    budget: Budget | str | None = None,
    formats: tuple[str, ...] | None = None,
    n_trials: int = 24,
    storage: str | None = None,
    study_name: str | None = None,
    **keywords: Any,
) -> RecipeSettings:
    """``RecipeSettings(**keywords)`` (model, output, dataset, num_samples, ...): its
    :class:`RecipeGoal` from ``engine``, ``budget`` (effective bits, ``"5.4bit"`` or a
    :class:`Budget`) and ``formats`` (None: all the engine serves); its study from ``n_trials``,
    ``storage``, ``study_name``."""
    if budget is None:
        raise KVTunerError("the recipe target needs a budget in effective bits, e.g. 5.4bit")
    if isinstance(budget, str):
        budget = Budget.parse(budget)
    goal = RecipeGoal(engine, budget, None if formats is None else tuple(formats))
    study = StudySettings(n_trials=n_trials, storage=storage, study_name=study_name)
    return RecipeSettings(goal=goal, study=study, **keywords)


def prepare(run: SearchRun) -> Prepared:
    """Model and text, the fp reference, each layer's K/V amax, the study."""
    from ...calibration import fingerprint_of
    from ...calibration.kv_amax import kv_amax

    s = run.settings
    lm, tokenizer, _ = load_placed(s.model, s.device, s.dtype, run.loaded)
    fp = fingerprint_of(lm)
    s.goal.check_feasible(fp.num_layers, fp.head_dim)
    data, held = load_text(tokenizer, s, s.confirm_samples)
    s.output.parent.mkdir(parents=True, exist_ok=True)
    k_amax, v_amax = kv_amax(lm, data.tokens)
    base = EngineRecipe((MODEL_DTYPE,) * fp.num_layers, k_amax, v_amax)
    text = f"{data.seq_len}x{s.num_samples} seed {s.data_seed}"
    name = s.study.study_name or f"recipe {text}"
    study = open_measured_study(
        s.study.storage, name, model=f"{s.model} {fp.hash}", where=placement_of(lm)
    )
    return Prepared(s, fp, data, held, PlanKL.on(lm, data.tokens), base, study)


def candidates(run: SearchRun, prepared: Prepared) -> Seeds:
    """The one-layer tables and the seed recipes they pick."""
    isolated, in_context = _tables(prepared, run.log)
    return Seeds(isolated, in_context, _seeds(prepared, isolated, in_context))


def measure(run: SearchRun, prepared: Prepared, seeds: Seeds) -> Measured:
    """The seeds measured whole, then the local search from the best of them."""
    measured = prepared.measure(list(seeds.recipes.values()))
    start = min(seeds.recipes.values(), key=measured.get)
    searched = _local_search(prepared, start, seeds.in_context, run.log)
    fitting = {r: kl for r, kl in prepared.measure([]).items() if _fits(prepared, r)}
    return Measured(fitting, searched)


def choose(run: SearchRun, prepared: Prepared, seeds: Seeds, measured: Measured) -> Chosen:
    """The local search's end; with held-back windows, the confirmation decides between the
    best finalist and ModelOpt's pick."""
    kl, modelopt, best = measured.kl, seeds.recipes["modelopt"], measured.searched
    metrics = {"modelopt_kl": kl[modelopt], "modelopt_layers": list(modelopt)}
    if prepared.held is not None:
        best, confirmed = _confirm(prepared, kl, modelopt, run.log)
        metrics.update(confirmed)
    metrics["kl"] = kl[best]
    return Chosen(best, kl, metrics)


def _one_layer(run: Prepared, context: str, formats: tuple[str, ...]) -> list[dict[str, float]]:
    """[layer] -> format -> KL with that layer alone in the format, the rest in ``context``."""
    n = run.fingerprint.num_layers
    every = lambda i, f: tuple(f if j == i else context for j in range(n))  # noqa: E731
    measured = run.measure([every(i, f) for i in range(n) for f in formats])
    return [{f: measured[every(i, f)] for f in formats} for i in range(n)]


def _tables(run: Prepared, log: Log) -> tuple[list[dict], list[dict]]:
    """``isolated`` (each format among model-dtype layers, 0 for the model dtype) and
    ``in_context`` (each format among cheapest-format layers, the change from all-cheapest)."""
    quantized = tuple(f for f in run.formats if f != MODEL_DTYPE)
    isolated = _one_layer(run, MODEL_DTYPE, quantized)
    for row in isolated:
        row[MODEL_DTYPE] = 0.0
    cheapest = run.formats[0]
    floor = run.measure([(cheapest,) * run.fingerprint.num_layers])
    floor_kl = floor[(cheapest,) * run.fingerprint.num_layers]
    others = tuple(f for f in run.formats if f != cheapest)
    rows = _one_layer(run, cheapest, others)
    in_context = [{cheapest: 0.0, **{f: kl - floor_kl for f, kl in r.items()}} for r in rows]
    log(f"one-layer tables: {len(isolated)} layers x {len(run.formats)} formats measured")
    return isolated, in_context


def _seeds(run: Prepared, isolated, in_context) -> dict[str, Recipe]:
    """Named seed recipes; "modelopt" is ModelOpt's pick (it never picks the model dtype)."""
    quantized = [f for f in run.formats if f != MODEL_DTYPE]
    pick = lambda table, formats: knapsack_pick(table, formats, run.bits, run.capacity)  # noqa: E731
    n = run.fingerprint.num_layers
    seeds = {"modelopt": pick(isolated, quantized) or (run.formats[0],) * n,
             "isolated": pick(isolated, list(run.formats)),
             "in-context": pick(in_context, list(run.formats))}  # fmt: skip
    seeds.update({f"uniform {f}": (f,) * n for f in run.formats})
    return {name: r for name, r in seeds.items() if r is not None and _fits(run, r)}


def _fits(run: Prepared, recipe: Recipe) -> bool:
    """Within the budget, in the target's formats (the shared study holds other searches')."""
    allowed = set(run.formats)
    return set(recipe) <= allowed and recipe_bits(recipe, run.bits) <= run.capacity


def _local_search(run: Prepared, start: Recipe, predicted, log: Log) -> Recipe:
    """First-improvement descent: measure the next few unmeasured neighbours of the best, move
    when one is lower; ``n_trials`` new recipes at most."""
    best, budget = start, run.settings.study.n_trials
    measured = run.measure([])
    while budget > 0:
        fresh = [r for r in neighbours(best, run.formats, run.bits, run.capacity, predicted)
                 if r not in measured][: min(4, budget)]  # fmt: skip
        if not fresh:
            break
        measured, budget = run.measure(fresh), budget - len(fresh)
        top = min(fresh, key=measured.get)
        if measured[top] < measured[best]:
            log(f"local search: KL {measured[best]:.5g} -> {measured[top]:.5g}")
            best = top
    return best


def _confirm(run: Prepared, measured: dict[Recipe, float], modelopt: Recipe, log: Log):
    """The best finalists and ModelOpt's pick re-measured window by window on the held-back
    text. The best there replaces ModelOpt's pick only when its paired advantage exceeds
    ``CONFIRM_MARGIN`` standard errors: with a few windows the lowest of several measured means
    is partly luck, and ModelOpt's pick is the method to beat, not to lose to by chance."""
    tokens = run.held.tokens
    windows = [PlanKL.on(run.plan_kl.lm, tokens[i : i + 1]) for i in range(tokens.shape[0])]
    finalists = sorted(measured, key=lambda r: (measured[r], r))[:CONFIRM_FINALISTS]
    finalists = list(dict.fromkeys([*finalists, modelopt]))
    kls = {r: [w.kl(run.base.with_layers(r)) for w in windows] for r in finalists}  # [windows]
    mean = {r: sum(v) / len(v) for r, v in kls.items()}
    log(f"confirmation on {tokens.numel()} held-back tokens:")
    for r in finalists:
        log(f"  {_short(r)}: {measured[r]:.5g} -> {mean[r]:.5g}")
    lowest = min(finalists, key=lambda r: (mean[r], r))
    gain, se = _paired_gain(kls[modelopt], kls[lowest])
    best = lowest if gain > CONFIRM_MARGIN * se and gain > 0 else modelopt
    return best, {"confirm_kl": mean[best], "confirm_modelopt_kl": mean[modelopt],
                  "confirm_gain": gain, "confirm_gain_se": se,
                  "chosen": "modelopt" if best == modelopt else "search",
                  "confirm_tokens": tokens.numel()}  # fmt: skip


def _paired_gain(base: list[float], other: list[float]) -> tuple[float, float]:
    """Mean of ``base - other`` over windows and its standard error (0 for one window)."""
    d = [a - b for a, b in zip(base, other, strict=True)]
    m = sum(d) / len(d)
    if len(d) < 2:
        return m, 0.0
    return m, (sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d)) ** 0.5


def _short(recipe: Recipe) -> str:
    """Runs of one format: ``fp8 x3, nvfp4 x27``."""
    runs: list[list] = []
    for f in recipe:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return ", ".join(f"{f} x{k}" for f, k in runs)


def profile(run: SearchRun, prepared: Prepared, seeds: Seeds, chosen: Chosen) -> RecipeProfile:
    """The recipe profile of the chosen recipe: its formats and amax, bits, KL and ppl vs fp."""
    p, lm = prepared, prepared.plan_kl.lm
    s, recipe = run.settings, p.base.with_layers(chosen.best)
    metrics = {**chosen.metrics, "fp_ppl": p.plan_kl.reference.ppl, "ppl": p.plan_kl.ppl(recipe),
               "trials": len(p.study.trials)}  # fmt: skip
    bits = float(recipe.effective_bits(p.fingerprint.head_dim))
    budget = {"asked": s.goal.budget.label, "effective_bits": round(bits, 4),
              "formats": list(s.goal.formats)}  # fmt: skip
    calibration = {**p.data.describe(), **placement_of(lm).describe()}
    return RecipeProfile(s.model, p.fingerprint, s.goal.engine, recipe, budget, calibration,
                         metrics)  # fmt: skip


def export(
    run: SearchRun, prepared: Prepared, seeds: Seeds, chosen: Chosen, made: RecipeProfile
) -> RecipeOutcome:
    """The profile written (atomic) to ``settings.output``, and the outcome."""
    output = run.settings.output
    save_recipe_profile(made, output)
    return RecipeOutcome(made, output, chosen.kl[chosen.best], chosen.metrics["modelopt_kl"],
                         len(prepared.study.trials), _summary(made))  # fmt: skip


def _summary(profile: RecipeProfile) -> str:
    m = profile.metrics
    return (
        f"recipe for {profile.engine}: {_short(profile.recipe.layers)} -> KL {m['kl']:.5g} "
        f"(ModelOpt's additive pick: {m['modelopt_kl']:.5g}), ppl {m['ppl']:.4f} "
        f"(fp {m['fp_ppl']:.4f}), {profile.effective_bits:.3f} effective bits"
    )


TARGET = Target(
    name="recipe",
    settings_type=RecipeSettings,
    help="a format per layer among those --engine serves with its own kernels (FP8, NVFP4, ...)",
    settings=settings_of,
    prepare=prepare,
    candidates=candidates,
    measure=measure,
    choose=choose,
    profile=profile,
    export=export,
)
