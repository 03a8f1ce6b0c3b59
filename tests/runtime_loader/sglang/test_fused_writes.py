"""Models whose attention can write K/V with fused kernels around set_kv_buffer (CUDA/ROCm in
sglang 0.5.23), found from the installed SGLang's own model code; over the kvtuner pool their
writes go through set_kv_buffer (test_backend_choice.py)."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed


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
    from kvtuner.runtime_loader.sglang.hooks.fused_writes import fused_write_modules

    model_cls = getattr(importlib.import_module(f"sglang.srt.models.{module}"), cls)
    assert bool(fused_write_modules(model_cls)) is fused
