"""Finalists for the confirmation pass and their re-ranking."""

import sys
from pathlib import Path

import pytest

from kvtuner import KVTunerError
from kvtuner.tuner.confirmation import Confirmed, confirm, finalists
from kvtuner.tuner.results import Measured

sys.path.insert(0, str(Path(__file__).parent))
import synthetic  # noqa: E402

MIXES = [((4, 4),) * 6 + ((8, 4), (4, 2)), ((4, 2), (8, 4)) + ((4, 4),) * 6]


@pytest.fixture(scope="module")
def space():
    return synthetic.space("4bit")


def measured(space, choices_kls):
    return [Measured.of(space, c, kl, number=i) for i, (c, kl) in enumerate(choices_kls)]


def test_finalists_are_the_best_and_the_best_uniform(space):
    runs = measured(
        space,
        [(space.uniform((4, 4)), 0.9), (space.uniform((4, 2)), 2.0)]
        + [(MIXES[i % 2], 0.1 * (i + 1)) for i in range(6)],
    )
    picked = finalists(runs, k=3)
    assert [m.kl for m in picked] == pytest.approx([0.1, 0.2, 0.3, 0.9])
    assert picked[-1].choice == space.uniform((4, 4))
    assert len(finalists(runs[:1], k=3)) == 1  # a uniform best is not listed twice


def test_confirm_reranks_by_the_new_kl(space):
    runs = measured(space, [(space.uniform((4, 4)), 0.5), (space.uniform((4, 2)), 0.4)])
    ranked = confirm(runs, lambda specs: 0.2 if specs == runs[0].specs else 0.3)
    assert [c.measured.number for c in ranked] == [0, 1] and ranked[0].score == 0.2
    assert ranked[0].metric == "kl"
    with pytest.raises(KVTunerError):
        Confirmed(runs[0], float("nan"))
    with pytest.raises(KVTunerError, match="metric"):
        Confirmed(runs[0], 0.1, "ppl")
