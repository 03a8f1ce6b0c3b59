"""EngineRecipe: a format per layer, ModelOpt's effective bits, the scales from amax."""

from fractions import Fraction

import pytest
import torch

from kvtuner.quant import vllm_nvfp4
from kvtuner.quant.engine_recipe import ENGINE_FORMATS, EngineRecipe, format_bits


def test_effective_bits_count_as_modelopt_counts_them():
    assert format_bits("auto", 128) == 16
    assert format_bits("fp8", 128) == 8
    assert format_bits("nvfp4", 128) == Fraction(9, 2)  # 4 + one fp8 scale per 16
    assert format_bits("fp8k_nvfp4v", 64) == Fraction(25, 4)  # ModelOpt's 6.25
    # TurboQuant from vLLM's slot: k8v4 at D=128 is 128 + 68 bytes -> (8 + 4.25) / 2
    assert format_bits("turboquant_k8v4", 128) == Fraction(49, 8)
    recipe = EngineRecipe(("fp8", "nvfp4", "nvfp4", "auto"), (1.0,) * 4, (1.0,) * 4)
    assert recipe.effective_bits(64) == (8 + 4.5 + 4.5 + 16) / Fraction(4)
    with pytest.raises(ValueError, match="unknown layer format 'int3'"):
        format_bits("int3", 64)


def test_every_engine_serves_only_known_formats_and_the_model_dtype():
    for formats in ENGINE_FORMATS.values():
        assert "auto" in formats
        for f in formats:
            format_bits(f, 64)


def test_scales_are_amax_over_448_for_fp8_and_nvfp4_and_absent_for_the_model_dtype():
    recipe = EngineRecipe(("fp8", "fp8k_nvfp4v", "auto", "turboquant_4bit_nc"),
                          (44.8, 8.96, 1.0, 3.0), (4.48, 0.896, 1.0, 3.0))  # fmt: skip
    assert recipe.scales(0) == pytest.approx((0.1, 0.01))
    assert recipe.scales(1) == pytest.approx((0.02, 0.002))
    assert recipe.scales(2) is None
    assert recipe.scales(3) == (1.0, 1.0)  # TurboQuant computes its own
    k, v = recipe.layer_formats(1)
    assert (k.kv_cache_dtype, v.kv_cache_dtype) == ("fp8_e4m3", "nvfp4")
    assert recipe.layer_formats(2) == (None, None)


def test_a_calibrated_nvfp4_layer_reads_what_vllm_stores_at_that_scale():
    x = torch.randn(3, 2, 5, 32) * 7
    amax = float(x.abs().max())
    recipe = EngineRecipe(("nvfp4",), (amax,), (amax,))
    k, _ = recipe.layer_formats(0)
    want = vllm_nvfp4.fake_quantize(x, amax / 448)
    assert torch.equal(k.fake_quantize(x, "k"), want)
    assert not torch.equal(want, vllm_nvfp4.fake_quantize(x, 1.0))  # the scale matters


@pytest.mark.parametrize(
    "layers, k, v, match",
    [
        (("fp8", "int2"), (1, 1), (1, 1), "unknown layer format"),
        (("fp8", "fp8"), (1,), (1, 1), "needs 2 k_amax"),
        (("fp8",), (-1.0,), (1.0,), "k_amax must be non-negative"),
        (("fp8",), (1.0,), (float("nan"),), "v_amax must be non-negative finite"),
        ((), (), (), "at least one layer"),
    ],
)
def test_a_bad_recipe_is_one_line(layers, k, v, match):
    with pytest.raises(ValueError, match=match):
        EngineRecipe(layers, k, v)
