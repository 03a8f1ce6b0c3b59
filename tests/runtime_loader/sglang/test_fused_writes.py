"""Models whose attention writes K/V with fused kernels around set_kv_buffer (CUDA/ROCm in
sglang 0.5.23) are refused on GPUs, found from the installed SGLang's own model code."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed

TINY = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=128,
)


def sglang_model_config(tmp_path, config_cls, arch):
    """SGLang's real ModelConfig of a tiny HF config folder."""
    from sglang.srt.configs.model_config import ModelConfig

    config_cls(**TINY, architectures=[arch]).save_pretrained(tmp_path)
    return ModelConfig(str(tmp_path))


@pytest.mark.parametrize(
    ("module", "cls", "fused"),
    [
        ("qwen3", "Qwen3ForCausalLM", True),  # rotary fused set-KV and aiter's fused write
        ("qwen3_moe", "Qwen3MoeForCausalLM", True),
        ("gpt_oss", "GptOssForCausalLM", True),
        ("bailing_moe", "BailingMoeV2ForCausalLM", True),
        ("qwen3_vl", "Qwen3VLForConditionalGeneration", True),  # Qwen3's decoder layers
        ("llama", "LlamaForCausalLM", False),
        ("qwen2", "Qwen2ForCausalLM", False),
    ],
)
def test_fused_writers_are_found_in_sglang_model_code(module, cls, fused):
    from kvtuner.runtime_loader.sglang.fused_writes import fused_write_modules

    model_cls = getattr(importlib.import_module(f"sglang.srt.models.{module}"), cls)
    assert bool(fused_write_modules(model_cls)) is fused


def test_refused_on_gpu_only_and_with_one_line(tmp_path):
    import transformers

    from kvtuner.runtime_loader.sglang.fused_writes import fused_write_refusal

    qwen3 = sglang_model_config(tmp_path / "q", transformers.Qwen3Config, "Qwen3ForCausalLM")
    llama = sglang_model_config(tmp_path / "l", transformers.LlamaConfig, "LlamaForCausalLM")
    refusal = fused_write_refusal(qwen3, "cuda")
    assert refusal.startswith("Qwen3ForCausalLM on a GPU") and "\n" not in refusal
    assert "set_kv_buffer" in refusal
    assert fused_write_refusal(qwen3, "cpu") is None  # the kernels exist on CUDA/ROCm only
    assert fused_write_refusal(llama, "cuda") is None
