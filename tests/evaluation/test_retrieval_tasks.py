"""Retrieval generators are exact (length, answer counts, depth) and scoring is strict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvtuner.errors import KVTunerError
from kvtuner.evaluation.retrieval import TASKS, SampleKey, is_correct, make_sample, wilson
from kvtuner.evaluation.retrieval.haystack import NOISE_SENTENCES
from kvtuner.evaluation.retrieval.samples import answer_counts

sys.path.insert(0, str(Path(__file__).parent.parent / "calibration"))
from calib_helpers import byte_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.mark.parametrize("haystack", ["noise", "wikitext"])
@pytest.mark.parametrize("task", TASKS)
def test_samples_are_exact(tok, task, haystack):
    longest = max(len(" " + s) for s in NOISE_SENTENCES) if haystack == "noise" else None
    for length, depth in ((700, 0.0), (900, 0.5), (1200, 1.0)):
        s = make_sample(tok, SampleKey(task, haystack, length, depth, 0), chat=False)
        assert len(s.ids) == length  # exact, well inside the ±1 % asked
        assert answer_counts(s.text, s.draw.answers) == s.draw.answer_counts
        hay = s.prompt.context_len - sum(s.prompt.needle_lens)
        tol = (longest or _longest_sentence(s)) / hay
        assert abs(s.prompt.depth_of(0) - depth) <= tol
        for (needle, _), start, n in zip(
            s.draw.needles, s.prompt.needle_starts, s.prompt.needle_lens, strict=True
        ):
            at = s.prompt.context_start + start
            assert tok.decode(list(s.ids[at : at + n])).strip() == needle


def _longest_sentence(sample) -> int:
    from kvtuner.evaluation.retrieval.haystack import _wikitext_sentences

    return max(len(x) + 1 for x in _wikitext_sentences())  # byte tokens


def test_samples_are_deterministic_and_differ_by_coordinate(tok):
    a = make_sample(tok, SampleKey("niah", "wikitext", 600, 0.5, 3, seed=7), chat=False)
    b = make_sample(tok, SampleKey("niah", "wikitext", 600, 0.5, 3, seed=7), chat=False)
    c = make_sample(tok, SampleKey("niah", "wikitext", 600, 0.5, 4, seed=7), chat=False)
    assert a.ids == b.ids and a.draw == b.draw
    assert c.draw.answers != a.draw.answers


def test_multikey_has_three_distractors_and_multivalue_four_values(tok):
    mk = make_sample(tok, SampleKey("niah-multikey", "noise", 800, 0.3, 0), chat=False)
    assert len(mk.draw.needles) == 4 and len(mk.draw.answers) == 1
    mv = make_sample(tok, SampleKey("niah-multivalue", "noise", 800, 0.3, 0), chat=False)
    assert len(mv.draw.needles) == 4 and len(mv.draw.answers) == 4
    vt = make_sample(tok, SampleKey("vt", "noise", 800, 0.3, 0), chat=False)
    assert len(vt.draw.answers) == 5 and "VAR" in vt.text


def test_too_short_a_context_is_one_line(tok):
    with pytest.raises(KVTunerError, match="too short"):
        make_sample(tok, SampleKey("vt", "noise", 100, 0.5, 0), chat=False)


@pytest.mark.parametrize(
    "reply",
    [
        "1234567",
        " The pass key is 1234567.",
        "1234567 is the pass key",
        "key:1234567\n",
        "x1234567",
    ],
)
def test_scoring_accepts_the_answer_in_any_text(reply):
    assert is_correct(reply, ["1234567"])


@pytest.mark.parametrize("reply", ["123456", "12345678", "1234568", "1 234 567", "", "01234567"])
def test_scoring_rejects_near_misses(reply):
    assert not is_correct(reply, ["1234567"])


def test_scoring_needs_every_answer_as_a_whole_word():
    names = ["ABCDE", "FGHIJ"]
    assert is_correct("They are: ABCDE, FGHIJ.", names)
    assert not is_correct("They are: ABCDE, FGHIJK.", names)
    assert not is_correct("They are: ABCDE, fghij.", names)
    assert not is_correct("They are: ABCDE", names)


def test_wilson_interval():
    lo, hi = wilson(9, 10)
    assert lo == pytest.approx(0.5958, abs=1e-3) and hi == pytest.approx(0.9821, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(10, 10)[1] == pytest.approx(1.0)
