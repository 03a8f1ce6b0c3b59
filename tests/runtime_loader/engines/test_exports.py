"""A recipe in each engine's own form, and each form's reader: ModelOpt's KV map (schema v1),
TensorRT-LLM's per-layer KvCacheConfig.dtype, vLLM's flags, the ModelOpt checkpoint files."""

import json

import pytest
import torch
from safetensors.torch import load_file

from kvtuner import KVTunerError
from kvtuner.quant.engine_recipe import EngineRecipe
from kvtuner.runtime_loader.engines import (
    parse_trtllm_kv_dtype,
    quant_config,
    read_quant_config,
    recipe_vllm_args,
    scale_tensors,
    trtllm_kv_dtype,
    write_checkpoint_kv,
)

MIXED = ("fp8", "fp8", "nvfp4", "auto", "nvfp4", "fp8k_nvfp4v")


def test_modelopt_map_lists_the_quantized_layers_and_reads_back():
    section = quant_config(MIXED)
    assert section["kv_cache_quant_algo"] == "MIXED_PRECISION"
    assert section["kv_cache_schema_version"] == 1
    layers = section["kv_cache_quantized_layers"]
    assert layers["model.layers.0.self_attn"] == {"quant_algo": "FP8"}
    assert layers["model.layers.5.self_attn"] == {"quant_algo": "FP8_K_NVFP4_V"}
    assert "model.layers.3.self_attn" not in layers  # unlisted: the model dtype
    assert read_quant_config(section, 6) == MIXED
    assert quant_config(("nvfp4",) * 3)["kv_cache_quant_algo"] == "NVFP4"  # uniform: its name
    assert quant_config(("nvfp4", "auto"))["kv_cache_quant_algo"] == "MIXED_PRECISION"


@pytest.mark.parametrize(
    "change, match",
    [
        ({"kv_cache_schema_version": 2}, "kv_cache_schema_version must be 1"),
        ({"kv_cache_quantized_layers": {}}, "non-empty"),
        ({"kv_cache_quantized_layers": {"model.layers.6.self_attn": {"quant_algo": "FP8"}}},
         "with N < 6"),
        ({"kv_cache_quantized_layers": {"model.layers.0.self_attn": {"quant_algo": "INT3"}}},
         "unsupported ModelOpt KV format 'INT3'"),
        ({"kv_cache_quantized_layers": {"layers.0": {"quant_algo": "FP8"}}}, "is not model"),
    ],
)  # fmt: skip
def test_a_bad_modelopt_map_is_one_line(change, match):
    with pytest.raises(KVTunerError, match=match):
        read_quant_config({**quant_config(MIXED), **change}, 6)


def test_modelopt_has_no_map_for_turboquant_or_an_unquantized_recipe():
    with pytest.raises(KVTunerError, match="no KV format for turboquant_4bit_nc"):
        quant_config(("fp8", "turboquant_4bit_nc"))
    with pytest.raises(KVTunerError, match="quantizes no layer"):
        quant_config(("auto", "auto"))


def test_trtllm_string_is_runs_of_one_dtype_and_parses_back():
    layers = ("fp8", "fp8", "nvfp4", "auto", "nvfp4", "nvfp4", "fp8")
    text = trtllm_kv_dtype(layers)
    assert text == "0-1:fp8,2:nvfp4,4-5:nvfp4,6:fp8"  # layer 3 unlisted: auto
    assert parse_trtllm_kv_dtype(text, 7) == layers
    assert trtllm_kv_dtype(("nvfp4",) * 4) == "nvfp4"
    assert parse_trtllm_kv_dtype("nvfp4", 3) == ("nvfp4",) * 3
    assert parse_trtllm_kv_dtype({0: "fp8", 2: "nvfp4"}, 3) == ("fp8", "auto", "nvfp4")


@pytest.mark.parametrize(
    "spec, match",
    [
        ("3-1:fp8", "must not exceed"),
        ("0-7:fp8", "out of range"),
        ("0-1:fp8,2", "invalid per-layer dtype segment"),
        ("0-2:fp8,2:nvfp4", "layer 2 is given a KV dtype twice"),
        ("0:int4", "unknown KV dtype 'int4'"),
        (3, "string or a dict"),
    ],
)
def test_a_bad_trtllm_dtype_is_one_line(spec, match):
    with pytest.raises(KVTunerError, match=match):
        parse_trtllm_kv_dtype(spec, 7)


def test_trtllm_has_no_dtype_for_the_mixed_fp8_nvfp4_layer():
    with pytest.raises(KVTunerError, match="no per-layer KV dtype for fp8k_nvfp4v"):
        trtllm_kv_dtype(MIXED)


def test_vllm_flags_for_one_format_and_a_map_for_several():
    flags, needs_map = recipe_vllm_args(("auto", "fp8", "fp8", "auto"))
    assert flags == ["--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers", "0", "3"]
    assert not needs_map
    assert recipe_vllm_args(("nvfp4",) * 2) == (["--kv-cache-dtype", "nvfp4"], False)
    assert recipe_vllm_args(("fp8", "nvfp4")) == (["--kv-cache-dtype", "auto"], True)
    assert recipe_vllm_args(("fp8k_nvfp4v",)) == (["--kv-cache-dtype", "auto"], True)


def test_checkpoint_gets_the_map_the_config_and_every_scale(tmp_path, tiny_llama):
    tiny_llama.save_pretrained(tmp_path)
    weights = set(load_file(tmp_path / "model.safetensors"))
    recipe = EngineRecipe(("fp8", "nvfp4"), (44.8, 4.48), (8.96, 0.448))
    write_checkpoint_kv(tmp_path, recipe)
    quant = json.loads((tmp_path / "hf_quant_config.json").read_text())
    assert quant["quantization"] == quant_config(recipe.layers)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config == {"quant_method": "modelopt", **quant_config(recipe.layers)}
    scales = load_file(tmp_path / "kv_scales.safetensors")
    assert set(scales) == set(scale_tensors(recipe))
    assert scales["model.layers.0.self_attn.k_proj.k_scale"].item() == pytest.approx(0.1)
    assert scales["model.layers.1.self_attn.v_proj.v_scale"].item() == pytest.approx(0.001)
    assert scales["model.layers.1.self_attn.v_proj.v_scale"].dtype == torch.float32
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k for k, f in index.items() if f == "model.safetensors"} == weights
    assert {k for k, f in index.items() if f == "kv_scales.safetensors"} == set(scales)
