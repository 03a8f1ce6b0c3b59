"""The study: seeds first, budget never violated, never worse than uniform, resumable."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from kvtuner import KVTunerError
from kvtuner.placement import Placement
from kvtuner.tuner.results import best_measured, measured_trials, pareto_set
from kvtuner.tuner.study import (
    StudySettings,
    dp_optimum,
    measure_choices,
    open_measured_study,
    run_study,
    seed_choices,
)

sys.path.insert(0, str(Path(__file__).parent))
import synthetic  # noqa: E402


@pytest.mark.parametrize("sampler", ["local", "tpe", "nsga2"])
@pytest.mark.parametrize("budget", ["2.5bit", "4bit", "0.3x"])
def test_budget_never_violated_and_uniform_never_beaten(sampler, budget):
    space, evaluate = synthetic.space(budget), synthetic.evaluate_factory()
    study = run_study(space, evaluate, StudySettings(n_trials=30, sampler=sampler), progress=False)
    measured = measured_trials(study, space)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(measured) == len(complete)  # every measured trial fits
    capacity = float(space.budget.capacity(space.fingerprint))
    for t in study.get_trials(states=(TrialState.PRUNED,)):
        assert t.user_attrs["cost"] > capacity
    best = best_measured(measured)
    assert space.fits(best.choice)
    uniforms = [evaluate(space.layer_specs(space.uniform(p))) for p in space.uniform_pairs]
    assert best.kl <= min(uniforms)
    front = pareto_set(measured)
    assert best in front and all(a.kl > b.kl for a, b in zip(front[:-1], front[1:], strict=True))


def test_first_trials_are_the_seeds_and_local_search_improves_on_them():
    space, evaluate = synthetic.space("3bit"), synthetic.evaluate_factory()
    seeds = seed_choices(space)
    assert seeds[0][0].startswith("uniform") and any(o.startswith("dp@") for o, _ in seeds)
    assert dp_optimum(space) in [c for _, c in seeds]
    study = run_study(space, evaluate, StudySettings(n_trials=60, seed=3), progress=False)
    trials = study.get_trials()
    assert [space.from_params(t.params) for t in trials[: len(seeds)]] == [c for _, c in seeds]
    seed_best = min(t.value for t in trials[: len(seeds)])
    assert study.best_value < seed_best  # the objective is not additive: measuring pays
    assert len({tuple(sorted(t.params.items())) for t in trials}) == len(trials)  # no repeats


def test_bad_settings_are_one_line_errors():
    for kw in ({"n_trials": -1}, {"timeout": 0}, {"sampler": "grid"}, {"storage": "kvtuner.db"}):
        with pytest.raises(KVTunerError):
            StudySettings(**kw)


def test_resumed_study_must_match_its_space(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    settings = StudySettings(n_trials=3, storage=url, study_name="s")
    run_study(synthetic.space("4bit"), synthetic.evaluate_factory(), settings, progress=False)
    with pytest.raises(KVTunerError, match="another search space"):
        run_study(synthetic.space("3bit"), synthetic.evaluate_factory(), settings, progress=False)


def test_a_measured_study_resumes_only_on_its_model_and_dtype(tmp_path):
    """The engine targets' study: its KLs belong to one model and one dtype."""
    url, fp32 = f"sqlite:///{tmp_path / 'm.db'}", Placement("cpu", "float32")
    study = open_measured_study(url, "m", model="smollm2 abc", where=fp32)
    measure_choices(study, [{"skip0": True}], lambda p: 0.5, [False, True])
    again = open_measured_study(url, "m", model="smollm2 abc", where=fp32)
    assert [t.value for t in again.trials] == [0.5]
    with pytest.raises(KVTunerError, match="measured on another model"):
        open_measured_study(url, "m", model="qwen def", where=fp32)
    with pytest.raises(KVTunerError, match="was measured in float32, this run is bfloat16"):
        open_measured_study(url, "m", model="smollm2 abc", where=Placement("cpu", "bfloat16"))


CHILD = """
import sys
sys.path.insert(0, {here!r})
import synthetic
from kvtuner.tuner.study import StudySettings, run_study
settings = StudySettings(n_trials=40, storage={url!r}, study_name="resume", seed=1)
run_study(synthetic.space("3bit"), synthetic.evaluate_factory(delay=0.5), settings,
          progress=False)
"""


def test_sigkill_mid_study_keeps_finished_trials_and_rerun_continues(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    script = CHILD.format(here=str(Path(__file__).parent), url=url)
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    complete = []
    try:
        deadline = time.monotonic() + 120
        while len(complete) < 12 and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                study = optuna.load_study(study_name="resume", storage=url)
            except KeyError:  # not created yet
                continue
            complete = study.get_trials(states=(TrialState.COMPLETE,))
        assert child.poll() is None, "the child finished before it could be killed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    before = {
        t.number: t.value
        for t in optuna.load_study(study_name="resume", storage=url).get_trials(
            states=(TrialState.COMPLETE,)
        )
    }
    assert len(before) >= 12
    settings = StudySettings(n_trials=40, storage=url, study_name="resume", seed=1)
    study = run_study(
        synthetic.space("3bit"), synthetic.evaluate_factory(), settings, progress=False
    )
    after = {t.number: t.value for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert {n: after[n] for n in before} == before  # nothing finished was lost or redone
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(finished) == 40
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
