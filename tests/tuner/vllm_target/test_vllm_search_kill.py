"""A vLLM-target search killed with SIGKILL mid-study resumes to its full count: every trial
finished before the kill stays as it was, the rerun measures what is missing and nothing twice,
and the profile is the one an unkilled run with the same seed writes in a fresh storage.

The search runs as `kvtuner search --target vllm` in its own process on a tiny real checkpoint
(random 6-layer LLaMA + byte tokenizer), its study in sqlite; the test reads the study with optuna.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from kvtuner.profile import load_vllm_profile

sys.path.insert(0, str(Path(__file__).parents[2] / "calibration"))
from calib_helpers import save_tiny  # noqa: E402

LAYERS = 6  # 0.75x of bf16 with fp8 lets 3 layers skip: 17 trials after 6 sensitivity passes
KILL_AFTER = 4  # finished trials in the study before the kill (of 17)
STUDY = "kill-9"
RUN_TIMEOUT = 300


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """(argv for an output and a sqlite file, env): the CLI search on the tiny checkpoint."""
    root = tmp_path_factory.mktemp("vllm-kill")
    tiny = save_tiny(root / "tiny", num_hidden_layers=LAYERS)
    env = {**os.environ, "KVTUNER_CACHE_DIR": str(root / "cache")}

    def argv(out: Path, db: Path) -> list[str]:
        return [sys.executable, "-m", "kvtuner.cli.main", "search", "--model", str(tiny),
                "--target", "vllm", "--kv-cache-dtype", "fp8_e4m3", "--budget", "0.75x",
                "--num-samples", "2", "--seq-len", "32", "--confirm-samples", "1",
                "--n-trials", "5", "--output", str(out), "--storage", f"sqlite:///{db}",
                "--study-name", STUDY, "--quiet"]  # fmt: skip

    return argv, env


@pytest.fixture(scope="module")
def unkilled(search, tmp_path_factory):
    """The reference: the same search run once to the end in a fresh storage."""
    argv, env = search
    root = tmp_path_factory.mktemp("unkilled")
    _run_to_end(argv(root / "p.json", root / "s.db"), env)
    return _study(root / "s.db"), load_vllm_profile(root / "p.json")


def _run_to_end(argv: list[str], env: dict) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]


def _study(db: Path) -> optuna.Study:
    """The search's study (read once its run has ended)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    return optuna.load_study(study_name=STUDY, storage=storage)


def _finished(study: optuna.Study) -> dict[int, tuple[tuple, float]]:
    """Trial number -> (skip-set params, KL) of every COMPLETE trial."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return {t.number: (tuple(sorted(t.params.items())), t.value) for t in trials}


def _skip(params: tuple) -> list[int]:
    return [int(name[4:]) for name, on in params if on]


def _measuring(db: Path) -> bool:
    """The study holds KILL_AFTER finished trials: the search is measuring the next skip set
    (a trial is recorded whole once measured, so the kill loses only that measurement). Read
    with sqlite itself, read-only, in about a millisecond: loading the study through optuna
    each poll took long enough on a loaded machine (CI's three tiers at once) for the search
    to finish between two polls (a CI rehearsal, 2026-11-27)."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.01)) as con:
            (done,) = con.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
    except sqlite3.Error:  # no file or no tables yet, or the database is busy
        return False
    return done >= KILL_AFTER


def _kill_while_measuring(argv: list[str], env: dict, db: Path, log: Path) -> None:
    with log.open("w") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + RUN_TIMEOUT
        while not _measuring(db) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"not killed mid-run:\n{log.read_text()[-3000:]}"


def test_a_search_killed_mid_study_resumes_with_nothing_lost(search, unkilled, tmp_path):
    argv, env = search
    out, db = tmp_path / "p.json", tmp_path / "s.db"
    _kill_while_measuring(argv(out, db), env, db, tmp_path / "killed.log")
    assert not out.exists()  # the killed run never reached its profile
    before = _finished(_study(db))
    assert len(before) >= KILL_AFTER

    _run_to_end(argv(out, db), env)
    resumed, (reference, ref_profile) = _study(db), unkilled
    after = _finished(resumed)
    assert all(after.get(n) == trial for n, trial in before.items())  # nothing lost or changed
    assert {t.state for t in resumed.trials} <= {TrialState.COMPLETE, TrialState.FAIL}
    sets = [params for params, _ in after.values()]
    assert len(sets) == len(set(sets))  # the rerun measured only what was missing
    ref_sets = {params for params, _ in _finished(reference).values()}
    assert len(set(sets)) == len(ref_sets) and set(sets) == ref_sets
    assert len(before) < len(ref_sets)  # the kill did cut the study short
    profile = load_vllm_profile(out)
    assert profile.plan.skip_layers == ref_profile.plan.skip_layers
    assert profile.metrics["kl"] == pytest.approx(ref_profile.metrics["kl"], rel=1e-6)


def test_a_search_killed_between_enqueue_and_ask_resumes_with_nothing_lost(
    search, unkilled, tmp_path
):
    """The storage a kvtuner that enqueued a trial and then asked for it left when killed
    between the two (the next skip set WAITING), built from the unkilled study's first trials,
    then the same rerun: the WAITING trial is repaired, never handed another set's KL."""
    argv, env = search
    out, db = tmp_path / "p.json", tmp_path / "s.db"
    reference, ref_profile = unkilled
    trials = sorted(_finished(reference).items())  # by trial number: the order measured
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name=STUDY)
    for key, value in reference.user_attrs.items():
        study.set_user_attr(key, value)
    for _, (params, kl) in trials[:KILL_AFTER]:
        dists = {name: CategoricalDistribution([False, True]) for name, _ in params}
        trial = optuna.trial.create_trial(params=dict(params), distributions=dists, value=kl)
        study.add_trial(trial)
    study.enqueue_trial(dict(trials[KILL_AFTER][1][0]))  # killed here, before its ask()

    _run_to_end(argv(out, db), env)
    ref, got = dict(v for _, v in trials), list(_finished(_study(db)).values())
    assert [_skip(p) for p, kl in got if ref.get(p) != kl] == []  # no set holds another's KL
    assert len(got) == len(ref) and {p for p, _ in got} == set(ref)
    assert {t.state for t in _study(db).trials} == {TrialState.COMPLETE, TrialState.FAIL}
    assert load_vllm_profile(out).plan.skip_layers == ref_profile.plan.skip_layers
