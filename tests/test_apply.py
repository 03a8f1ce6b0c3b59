"""``kvtuner.apply(model, profile)``: the one-verb front door gives the greedy tokens of the
five-name form (load_profile, make_cache, use_kvtuner_attention, cache_kwargs) on the real
SmolLM2, Gemma 3 and Qwen2.5, with the exported profiles; ``import kvtuner`` stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

import kvtuner
from kvtuner import KVTunerError, ModelFingerprint, Profile, QuantSpec, load_profile
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache, use_kvtuner_attention

CONFIGS = Path(__file__).resolve().parents[1] / "exported_configs"
PROMPT = "The capital of France is"
NEW_TOKENS = 6


@pytest.fixture
def restore_attention():
    """Give the model back with the attention it came with (the real models are shared by the
    session)."""
    models = []
    yield models.append
    for model, name in models:
        model.set_attn_implementation(name)


def _greedy(model, tok, cache) -> torch.Tensor:
    ids = tok(PROMPT, return_tensors="pt")
    out = model.generate(**ids, **cache_kwargs(cache), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, ids["input_ids"].shape[1] :]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "profile_file"),
    [
        ("smollm2", "smollm2-135m/per-token-4bit.json"),  # Hadamard-rotated keys
        ("gemma3", "gemma3-270m/per-token-smooth-3bit.json"),  # sliding windows, smoothed keys
        ("qwen25", "qwen2.5-0.5b/kivi-prerope-g64-0.25x.json"),  # channel-axis pre-RoPE keys
    ],
)
def test_apply_gives_the_tokens_of_the_five_name_form(
    request, restore_attention, fixture, profile_file
):
    model, tok = request.getfixturevalue(fixture)
    restore_attention((model, model.config._attn_implementation))
    path = CONFIGS / profile_file

    cache = kvtuner.apply(model, path, residual_length=0)
    assert model.config._attn_implementation == "kvtuner"
    got = _greedy(model, tok, cache)

    profile = load_profile(path, model.config)
    reference = make_cache(use_kvtuner_attention(model), profile, residual_length=0)
    want = _greedy(model, tok, reference)

    assert got.tolist() == want.tolist()
    assert cache.specs == profile.layers and min(s.k.bits for s in profile.layers) < 16
    assert cache.nbytes() == reference.nbytes() < cache.fp16_nbytes(cache.get_seq_length())


def _uniform(model, bits: int = 4) -> Profile:
    fp = ModelFingerprint.from_config(model.config)
    return Profile.uniform("tiny", fp, QuantSpec(bits, 32), QuantSpec(bits, 32))


def test_a_profile_that_does_not_fit_leaves_the_model_alone():
    model = tiny_model("llama")
    other = _uniform(tiny_model("llama", num_hidden_layers=3))
    with pytest.raises(KVTunerError) as info:
        kvtuner.apply(model, other)
    assert "\n" not in str(info.value)
    assert model.config._attn_implementation != "kvtuner"


def test_apply_takes_a_path_or_a_profile_and_refuses_anything_else(tmp_path):
    model = tiny_model("llama")
    profile = _uniform(model)
    path = kvtuner.save_profile(profile, tmp_path / "p.json")
    assert kvtuner.apply(model, path, decode_kernel="never").specs == profile.layers
    assert model.config._attn_implementation != "kvtuner"  # "never": attention left as is
    assert kvtuner.apply(model, profile).specs == profile.layers
    assert model.config._attn_implementation == "kvtuner"
    with pytest.raises(KVTunerError, match="^apply needs a Profile or a profile path"):
        kvtuner.apply(model, profile.to_dict())
    with pytest.raises(KVTunerError, match="^apply needs a transformers model"):
        kvtuner.apply(model.config, profile)
    with pytest.raises(KVTunerError, match="^profile not found"):
        kvtuner.apply(model, tmp_path / "missing.json")


def test_import_kvtuner_stays_light_and_the_verbs_load_on_use():
    code = (
        "import sys, kvtuner\n"
        "heavy = [m for m in ('transformers', 'optuna') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from kvtuner import apply, calibrate, evaluate, search\n"
        "from kvtuner.runtime_loader.hf.apply import apply as a\n"
        "from kvtuner.calibration.sweep import calibrate as c\n"
        "from kvtuner.evaluation.run import evaluate as e\n"
        "from kvtuner.tuner.registry import search as s\n"
        "assert (apply, calibrate, evaluate, search) == (a, c, e, s)\n"
        "assert {'apply', 'calibrate', 'evaluate', 'search'} <= set(dir(kvtuner))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kvtuner.nope  # noqa: B018
