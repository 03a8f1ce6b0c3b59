"""vLLM plans, byte accounting, profiles and the HF cache that emulates them (core tier: no
vLLM needed; the vllm tier checks the same numbers on the real engine)."""

from __future__ import annotations

import json

import pytest
import torch

from kvtuner import KVTunerError
from kvtuner.profile import (
    ModelFingerprint,
    VllmProfile,
    load_profile,
    load_vllm_profile,
    save_vllm_profile,
)
from kvtuner.quant.vllm_format import VllmKVFormat
from kvtuner.runtime_loader.hf import cache_kwargs
from kvtuner.runtime_loader.hf.vllm_cache import make_vllm_cache
from kvtuner.runtime_loader.vllm import VllmLayout, VllmPlan, engine_kwargs, vllm_args

SMOLLM2 = ModelFingerprint("LlamaForCausalLM", 30, 3, 64)


def test_plan_flags_and_kwargs():
    plan = VllmPlan("fp8_e4m3", 30, (29, 0, 0))
    assert plan.skip_layers == (0, 29)
    assert plan.cli_args() == ["--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers",
                               "0", "29"]  # fmt: skip
    assert plan.engine_kwargs() == {"kv_cache_dtype": "fp8_e4m3",
                                    "kv_cache_dtype_skip_layers": ["0", "29"]}  # fmt: skip
    assert plan.layer_format(0) is None and plan.layer_format(1) == VllmKVFormat("fp8_e4m3")
    for bad in (dict(skip_layers=(30,)), dict(kv_cache_dtype="ultraquant_4bit")):
        with pytest.raises(KVTunerError):
            VllmPlan(**{"kv_cache_dtype": "fp8", "num_layers": 30, **bad})


def test_bytes_and_capacity_as_vllm_allocates():
    """SmolLM2, fp8_e4m3, skip {0, 29}, 1 GiB: vLLM 0.32 on CPU reported 87,296 tokens
    (tests/runtime_loader/vllm/test_engine.py checks it on the real engine)."""
    layout, plan = VllmLayout(SMOLLM2), VllmPlan("fp8_e4m3", 30, (0, 29))
    assert layout.layer_bytes_per_token(plan, 0) == 3 * 2 * 64 * 2
    assert layout.layer_bytes_per_token(plan, 1) == 3 * 2 * 64
    assert layout.bytes_per_token(plan) == 28 * 384 + 2 * 768
    assert layout.capacity_tokens(plan, 2**30) == 87_296
    per_head = VllmLayout(SMOLLM2).layer_bytes_per_token(VllmPlan("int8_per_token_head", 30), 3)
    assert per_head == 3 * 2 * (64 + 4)  # codes + an inline fp32 scale per side
    int4 = VllmPlan("int4_per_token_head", 30, (0,))
    assert layout.layer_bytes_per_token(int4, 3) == 3 * 2 * (32 + 4)  # two codes per byte
    assert layout.bytes_per_token(int4) == 29 * 216 + 768
    gpu = VllmLayout(SMOLLM2, block_size=16, smallest_kernel_block=16)
    assert gpu.aligned_block_size(int4) == 64  # 16 * ceil(768 * 16 / (16 * 216))


def test_block_size_alignment_when_skipped_pages_outgrow_the_primary():
    """vLLM raises the block so the primary page covers a skipped page at the smallest kernel
    block: fp8 (384 B/token) next to bf16 (768) with 16-token blocks needs 32."""
    plan = VllmPlan("fp8_e4m3", 30, (3,))
    gpu = VllmLayout(SMOLLM2, block_size=16, smallest_kernel_block=16)
    assert gpu.aligned_block_size(plan) == 32
    assert VllmLayout(SMOLLM2).aligned_block_size(plan) == 128  # CPU: 128 covers it already
    assert gpu.aligned_block_size(VllmPlan("fp8_e4m3", 30)) == 16


def test_profile_round_trip_flags_and_refusals(tmp_path):
    plan = VllmPlan("fp8_e5m2", 30, (2, 7))
    path = save_vllm_profile(VllmProfile("smollm2-135m", SMOLLM2, plan), tmp_path / "p.json")
    loaded = load_vllm_profile(path)
    assert loaded.plan == plan and loaded.hash == VllmProfile("x", SMOLLM2, plan).hash
    assert vllm_args(path) == ["--dtype", "bfloat16", "--kv-cache-dtype", "fp8_e5m2",
                               "--kv-cache-dtype-skip-layers", "2", "7"]  # fmt: skip
    assert engine_kwargs(path)["dtype"] == "bfloat16"
    other = ModelFingerprint("Gemma3ForCausalLM", 30, 3, 64)
    with pytest.raises(KVTunerError, match="made for smollm2-135m"):
        loaded.check_model(other)
    with pytest.raises(KVTunerError, match="vLLM profile"):
        load_profile(path)  # a kvtuner (packed) profile loader says what it is, in one line
    data = json.loads(path.read_text())
    data["vllm"]["skip_layers"] = [2]
    path.write_text(json.dumps(data))
    with pytest.raises(KVTunerError, match="hash"):
        load_vllm_profile(path)


def test_formats_saturate_and_bound_their_error():
    x = torch.tensor([[1000.0, -1000.0, 1.0, 0.0]])
    assert VllmKVFormat("fp8_e4m3").fake_quantize(x, "k")[0, :2].tolist() == [448.0, -448.0]
    scaled = VllmKVFormat("fp8_e4m3", k_scale=4.0).fake_quantize(x, "k")
    assert scaled[0, :2].tolist() == [1024.0, -1024.0]  # 250 -> 256 at e4m3's step there
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 3, 5, 64, generator=g) * 50
    err = (VllmKVFormat("int8_per_token_head").fake_quantize(y, "v") - y).abs()
    step = y.abs().amax(-1, keepdim=True) / 127
    assert (err <= step / 2 + 1e-4).all()


def test_hf_cache_stores_each_layer_as_the_plan_says(tiny_llama):
    n = tiny_llama.config.num_hidden_layers
    plan = VllmPlan("int8_per_token_head", n, (0,))
    cache = make_vllm_cache(tiny_llama, plan)
    ids = torch.randint(0, tiny_llama.config.vocab_size, (1, 9))
    with torch.no_grad():
        tiny_llama(ids, **cache_kwargs(cache), use_cache=True)
    cfg = tiny_llama.config
    kv_heads, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    assert cache.layers[0].keys.dtype == torch.float32  # skipped: the model's dtype
    assert cache.layers[1].k.parts[0].dtype == torch.int8
    assert cache.layers[1].nbytes() == 2 * 9 * kv_heads * (d + 4)
    with pytest.raises(KVTunerError):
        make_vllm_cache(tiny_llama, VllmPlan("fp8", n + 1))
    cache = make_vllm_cache(tiny_llama, VllmPlan("int4_per_token_head", n, (0,)))
    with torch.no_grad():
        tiny_llama(ids, **cache_kwargs(cache), use_cache=True)
    assert cache.layers[1].k.parts[0].shape == (1, kv_heads, 9, d // 2)
    assert cache.layers[1].nbytes() == 2 * 9 * kv_heads * (d // 2 + 4)


def test_hf_cache_stores_each_side_of_a_recipe_in_its_own_format(tiny_llama):
    """fp8k_nvfp4v: K in FP8 (D bytes), V in NVFP4 (D/2 + D/16 bytes); what attention reads is
    each side's own store-then-read, at the layer's calibrated scales."""
    from kvtuner.quant.engine_recipe import EngineRecipe

    cfg, n, t = tiny_llama.config, tiny_llama.config.num_hidden_layers, 9
    kv_heads, d = cfg.num_key_value_heads, cfg.head_dim
    recipe = EngineRecipe(("fp8k_nvfp4v",) + ("auto",) * (n - 1), (3.0,) * n, (2.0,) * n)
    cache = make_vllm_cache(tiny_llama, recipe)
    ids = torch.randint(0, cfg.vocab_size, (1, t))
    with torch.no_grad():
        tiny_llama(ids, **cache_kwargs(cache), use_cache=True)
    layer = cache.layers[0]
    assert layer.k.parts[0].dtype == torch.float8_e4m3fn
    assert layer.v.parts[1].dtype == torch.float8_e4m3fn  # NVFP4's block scales
    assert layer.nbytes() == t * kv_heads * (d + d // 2 + d // 16)
    k_fmt, v_fmt = recipe.layer_formats(0)
    assert (k_fmt.k_scale, v_fmt.v_scale) == (3.0 / 448, 2.0 / 448)


def test_turboquant_keeps_vllms_boundary_layers_at_the_model_dtype():
    plan = VllmPlan("turboquant_4bit_nc", 30, (5,))
    assert plan.model_dtype_layers == (0, 1, 5, 28, 29)  # vLLM adds them to any skip list
    assert plan.layer_format(1) is None and plan.layer_format(2) is not None
    assert plan.cli_args() == ["--kv-cache-dtype", "turboquant_4bit_nc",
                               "--kv-cache-dtype-skip-layers", "5"]  # fmt: skip
