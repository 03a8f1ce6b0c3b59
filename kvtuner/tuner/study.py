"""The Optuna study: measured KL of whole configurations, inside the budget, resumable.

Seeds first (every uniform configuration that fits, then the additive-model knapsack optimum at
the budget and at slightly smaller budgets), then the sampler. Trials live in the storage (sqlite
for the CLI), so a rerun with the same study name resumes and a killed run loses no finished
trial. Over-budget proposals are pruned before any forward pass and never become the output.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import optuna
from optuna.trial import TrialState

from ..errors import KVTunerError
from ..placement import Placement
from ..profile import LayerSpec
from ..search_spaces import Pair, SearchSpace, pair_label
from .additive_optimum import dp_optimum
from .local_search import LocalSearchSampler

__all__ = [
    "SAMPLERS",
    "Evaluate",
    "StudySettings",
    "dp_optimum",
    "measure_choices",
    "open_measured_study",
    "run_study",
    "seed_choices",
]

SAMPLERS = ("local", "tpe", "nsga2")
DP_SCALES = (Fraction(1), Fraction(39, 40), Fraction(19, 20), Fraction(37, 40), Fraction(9, 10))
Evaluate = Callable[[Sequence[LayerSpec]], float]  # layer specs -> measured KL vs fp


@dataclass(frozen=True)
class StudySettings:
    """n_trials: finished trials the study should hold (a rerun continues up to it)."""

    n_trials: int = 40
    timeout: float | None = None
    seed: int = 0
    storage: str | None = None  # an SQLAlchemy URL, e.g. sqlite:///kvtuner.db; None = memory
    study_name: str | None = None
    sampler: str = "local"

    def __post_init__(self) -> None:
        if (
            isinstance(self.n_trials, bool)
            or not isinstance(self.n_trials, int)
            or self.n_trials < 0
        ):
            raise KVTunerError(f"--n-trials must be a non-negative int, got {self.n_trials!r}")
        if self.timeout is not None and not self.timeout > 0:
            raise KVTunerError(f"--timeout must be positive seconds, got {self.timeout!r}")
        if self.sampler not in SAMPLERS:
            raise KVTunerError(f"--sampler must be one of {', '.join(SAMPLERS)}")
        if self.storage is not None and not re.match(r"^[a-z0-9+]+://", self.storage):
            raise KVTunerError(
                f"--storage must be a database URL like sqlite:///kvtuner.db, got {self.storage!r}"
            )


def seed_choices(space: SearchSpace) -> list[tuple[str, tuple[Pair, ...]]]:
    """(origin, choice): fitting uniform configs, most memory first, then DP optima (deduped)."""
    cost = lambda p: space.total_cost(space.uniform(p))  # noqa: E731
    seeds = [
        (f"uniform {pair_label(p)}", space.uniform(p))
        for p in sorted(space.uniform_pairs, key=lambda p: (-cost(p), p))
    ]
    for scale in DP_SCALES:
        choice = dp_optimum(space, scale)
        if choice is not None:
            seeds.append((f"dp@{float(scale):.3g}x budget", choice))
    unique, seen = [], set()
    for origin, choice in seeds:
        if choice not in seen:
            unique.append((origin, choice))
            seen.add(choice)
    return unique


def _sampler(space: SearchSpace, settings: StudySettings) -> optuna.samplers.BaseSampler:
    """TPE and NSGA-II see the budget through ``trial.set_constraint`` (optuna >= 5)."""
    if settings.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=10)
    if settings.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=settings.seed, population_size=16)
    return LocalSearchSampler(space, seed=settings.seed)


def _storage(url: str) -> optuna.storages.RDBStorage:
    import sqlalchemy.exc

    try:
        return optuna.storages.RDBStorage(url)
    except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KVTunerError(f"cannot open --storage {url}: {first}") from None


def _check_numerics(study: optuna.Study, name: str, where: Placement | None) -> None:
    """A study's KLs are measured in one dtype (its identity); the device is not part of it:
    fp32 on a GPU measures what fp32 on the CPU does up to float rounding, so a study started
    on one device resumes on another. bf16 and fp32 KLs are different measurements."""
    if where is None:
        return
    known = study.user_attrs.get("dtype")
    if known is not None and known != where.dtype:
        raise KVTunerError(
            f"study {name!r} was measured in {known}, this run is {where.dtype}: pass "
            f"--dtype {known} to resume it, or a new --study-name"
        )
    study.set_user_attr("dtype", where.dtype)
    devices = study.user_attrs.get("devices", [])
    device = where.describe()["device"]
    if device not in devices:
        study.set_user_attr("devices", [*devices, device])


def _create(storage: str | None, name: str, sampler=None) -> optuna.Study:
    """Create or resume ``name``; trials a killed run left RUNNING are marked FAIL."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=_storage(storage) if storage else None,
        study_name=name,
        direction="minimize",
        sampler=sampler,
        load_if_exists=True,
    )
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    return study


def open_measured_study(
    storage: str | None, name: str, *, model: str, where: Placement | None = None
) -> optuna.Study:
    """A study that records configurations measured in an order the caller decides (the
    engine targets: skip sets, recipes): resumable; a killed run's RUNNING trials, and the
    WAITING ones an older kvtuner (enqueue, then ask) could leave, are marked FAIL, so no
    measurement is ever told to another configuration's trial. ``model``: what the KLs were
    measured on (id and fingerprint hash), ``where``: their dtype; both must match on resume."""
    study = _create(storage, name)
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    _claim(study, name, "model", model, f"{storage}: it was measured on another model")
    _check_numerics(study, name, where)
    return study


def _claim(study: optuna.Study, name: str, key: str, value: str, why: str) -> None:
    """Record ``value`` as the study's ``key``; a resumed study must hold the same one."""
    known = study.user_attrs.get(key)
    if known is not None and known != value:
        raise KVTunerError(f"study {name!r} in {why}; pass a new --study-name")
    study.set_user_attr(key, value)


def measure_choices(
    study: optuna.Study,
    choices: Sequence[dict[str, Any]],
    measure: Callable[[dict[str, Any]], float],
    options: Sequence[Any],
) -> dict[tuple, float]:
    """Measure each ``choice`` (param -> one of ``options``, every param the same categorical
    options) the study has not finished (a rerun resumes, a killed run loses no finished trial);
    returns every finished one, keyed by its sorted items."""
    key = lambda params: tuple(sorted(params.items()))  # noqa: E731
    done = {key(t.params): t.value for t in study.trials if t.state == TrialState.COMPLETE}
    dist = optuna.distributions.CategoricalDistribution(list(options))
    for params in choices:
        if key(params) in done:
            continue
        value = float(measure(params))
        # recorded whole once measured: a kill leaves no WAITING or RUNNING trial behind
        trial = optuna.trial.create_trial(
            params=params, distributions=dict.fromkeys(params, dist), value=value
        )
        study.add_trial(trial)
        done[key(params)] = value
    return done


def open_study(
    space: SearchSpace, settings: StudySettings, where: Placement | None = None
) -> optuna.Study:
    """Create or resume; trials a killed run left RUNNING are marked FAIL and their seeds redone.
    ``where``: the device and dtype trials run in (recorded; the dtype must match on resume)."""
    name = settings.study_name or f"kvtuner-{space.budget.label}-{space.preset.name}-{space.hash}"
    study = _create(settings.storage, name, _sampler(space, settings))
    why = f"{settings.storage} was made for another search space"
    why += " (model, sensitivity, preset or budget)"
    _claim(study, name, "space_hash", space.hash, why)
    _check_numerics(study, name, where)
    return study


def _enqueue_seeds(study: optuna.Study, space: SearchSpace) -> int:
    alive = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING)
    present = {tuple(sorted(t.params.items())) for t in study.get_trials(states=alive)}
    present |= {
        tuple(sorted(t.system_attrs.get("fixed_params", {}).items()))
        for t in study.get_trials(states=(TrialState.WAITING,))
    }
    added = 0
    for origin, choice in seed_choices(space):
        params = space.to_params(choice)
        if tuple(sorted(params.items())) not in present:
            study.enqueue_trial(params, user_attrs={"origin": origin})
            added += 1
    return added


def _objective(space: SearchSpace, evaluate: Evaluate):
    capacity = space.budget.capacity(space.fingerprint)
    dists = LocalSearchSampler(space).distributions()

    def objective(trial: optuna.Trial) -> float:
        params = {name: trial.suggest_categorical(name, d.choices) for name, d in dists.items()}
        choice = space.from_params(params)
        specs = space.layer_specs(choice)
        cost = space.total_cost(choice)
        trial.set_user_attr("cost", float(cost))
        trial.set_constraint("budget", float(cost - capacity))  # <= 0 is feasible
        trial.set_user_attr("additive_kl", sum(space.loss(g, p) for g, p in enumerate(choice)))
        if cost > capacity:  # never measured, never the output
            raise optuna.TrialPruned(f"over budget: {float(cost):g} > {float(capacity):g}")
        return float(evaluate(specs))

    return objective


def _finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def run_study(
    space: SearchSpace,
    evaluate: Evaluate,
    settings: StudySettings,
    *,
    progress: bool = True,
    placement: Placement | None = None,
) -> optuna.Study:
    """Seeds (never cut by the timeout: the uniform ones are the quality floor), then sampling.
    ``placement``: where ``evaluate`` runs the model, recorded in the study (see open_study)."""
    start = time.monotonic()
    study = open_study(space, settings, placement)
    _enqueue_seeds(study, space)
    objective = _objective(space, evaluate)
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if waiting:
        study.optimize(objective, n_trials=waiting, show_progress_bar=progress)
    remaining = settings.n_trials - _finished(study)
    left = None if settings.timeout is None else settings.timeout - (time.monotonic() - start)
    if remaining > 0 and (left is None or left > 0):
        study.optimize(objective, n_trials=remaining, timeout=left, show_progress_bar=progress)
    return study
