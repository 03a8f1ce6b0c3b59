"""EvalSettings: what `kvtuner eval` / ``kvtuner.evaluate`` ask for, normalised and validated on
construction (one line per rejection, before any model is touched)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvtuner
from kvtuner import KVTunerError
from kvtuner.evaluation import DecodeSettings, EvalSettings
from kvtuner.evaluation.retrieval import RetrievalSettings

MODEL = "no-such-model"  # never loaded: every rejection comes first


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "nothing to evaluate: give --profile PATH and/or --uniform NAMES"),
        ({"model": ""}, "--model must name a model"),
        ({"task": "vt"}, "--task vt needs --context-length N [N ...]"),
        ({"task": "quiz", "uniform": "kv4"}, "--task must be one of perplexity, passkey"),
        ({"hf_quanto": "yes", "uniform": "kv4"}, "--hf-quanto must be one of auto, on, off"),
        (
            {"uniform": "kv4", "context_lengths": [100], "score_tokens": 200},
            "--context-length must exceed --score-tokens",
        ),
        ({"uniform": "kv4", "context_lengths": ["2k"]}, "--context-length takes token counts"),
        (
            {"uniform": "kv4", "context_lengths": [2048], "kl": True},
            "--kl scores whole windows: use it with --task perplexity and no --context-length",
        ),
        (
            {"task": "passkey", "context_lengths": [300], "kl": True},
            "--kl scores whole windows",
        ),
        (
            {"task": "niah", "context_lengths": [300], "depths": [1.5]},
            "--depths must be fractions in [0, 1]",
        ),
        (
            {"task": "passkey", "context_lengths": [32]},
            "--context-length: give lengths of at least 64 tokens",
        ),
        ({"uniform": "kv4", "num_windows": 0}, "--num-windows must be a positive integer"),
        ({"uniform": "kv4", "seq_len": True}, "--seq-len must be a positive integer"),
        ({"uniform": "kv4", "threads": -1}, "--threads must be a non-negative integer"),
        ({"uniform": "kv4", "decode_steps": 0}, "decode steps must be positive"),
        ({"uniform": "kv4", "pack_chunk": 0}, "pack chunk >= 1"),
        ({"uniform": "kv4", "device": "tpu"}, "device must be one of auto, cpu, cuda"),
        ({"uniform": "kv4", "dtype": "int8"}, "dtype must be one of auto, float32"),
        ({"uniform": [4]}, "--uniform takes names such as 'kv8,kv4'"),
        ({"uniform": "kv8,kv7"}, "unknown uniform config 'kv7': bits must be one of"),
        ({"uniform": "kv-4"}, "unknown uniform config 'kv-4' (use kvB, kBvC"),
        ({"uniform": "kv4-g48"}, "unknown uniform config 'kv4-g48': group_size must be a power"),
    ],
)
def test_each_bad_input_is_one_clear_line(kwargs, message):
    with pytest.raises(KVTunerError) as caught:
        EvalSettings(**{"model": MODEL, **kwargs})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_keyword_verb_rejects_before_loading_anything():
    with pytest.raises(KVTunerError, match="^nothing to evaluate"):
        kvtuner.evaluate(model=MODEL)


def test_inputs_are_normalised_and_the_derived_settings_built():
    s = EvalSettings(
        model=MODEL,
        profiles="p.json",
        uniform=["kv8,kv4", " k8v4 ", "had-kv4-gh"],
        output="out/r.json",
        decode_steps=8,
    )
    assert s.profiles == ("p.json",) and s.uniform == ("kv8", "kv4", "k8v4", "had-kv4-gh")
    assert s.output == Path("out/r.json") and s.plot is None and s.context_lengths is None
    assert s.decode == DecodeSettings(steps=8) and s.retrieval is None
    assert EvalSettings(model=MODEL, uniform="kv4", context_lengths=2048).context_lengths == (2048,)


def test_no_decode_timing_leaves_its_settings_unchecked_as_the_cli_did():
    s = EvalSettings(model=MODEL, uniform="kv4", decode_speed=False, decode_steps=0)
    assert s.decode is None


def test_a_retrieval_task_needs_no_rows_and_carries_its_sample_settings():
    s = EvalSettings(
        model=MODEL,
        task="passkey",
        context_lengths=[320, 400],
        depths=[0, 1],
        samples=2,
        residual_length=16,
        pack_chunk=8,
        chat=False,
    )
    assert s.retrieval == RetrievalSettings(
        "passkey", (320, 400), (0, 1), 2, residual_length=16, pack_chunk=8, chat=False
    )
