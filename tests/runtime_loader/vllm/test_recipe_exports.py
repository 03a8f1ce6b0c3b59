"""A recipe's engine exports, read by vLLM 0.32's own code wherever 0.32 has the reader.

- vLLM flags (``recipe_vllm_args``): vLLM's CLI parser, ``EngineArgs.create_engine_config`` and
  its Llama model (built on the meta device) set each layer's KV dtype as the recipe says.
- ModelOpt metadata (``quant_config``): 0.32's KV-algo reader (``get_kv_cache_quant_algo_string``,
  what ``--kv-cache-dtype auto`` resolves from) reads a uniform FP8 / NVFP4 recipe; the mixed
  ``kv_cache_quantized_layers`` map has no reader in 0.32: it is vLLM PR #56116 (RFC #57445),
  not in 0.32, and kvtuner's own ``read_quant_config`` checks it in the core tier. 0.32 falls
  back to the model dtype for the mixed map and refuses the checkpoint config as a whole (its
  ``MIXED_PRECISION`` reader wants a non-empty weight map): asserted below as what 0.32 does.
- Scales (``scale_tensors``): vLLM's remapper and its Llama loader put each
  ``self_attn.{k,v}_proj.{k,v}_scale`` into the attention layer's ``attn.{k,v}_scale``.

No engine starts and nothing is downloaded: a 4-layer Llama ``config.json`` in a temporary
folder is all vLLM's config code reads.
"""

from __future__ import annotations

import json
import socket

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from kvtuner.quant.engine_recipe import EngineRecipe  # noqa: E402
from kvtuner.runtime_loader.engines import (  # noqa: E402
    quant_config,
    read_quant_config,
    recipe_vllm_args,
    scale_tensors,
)

NUM_LAYERS = 4
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
         "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": NUM_LAYERS, "vocab_size": 256,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": True}  # fmt: skip
# A ModelOpt FP8 checkpoint (FP8 weights, FP8 KV): 0.32 has no KV-only ModelOpt config, and this
# one gives the attention layers ModelOpt's KV-cache method, the one that loads k/v scales.
MODELOPT_FP8 = {"quant_method": "modelopt",
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}  # fmt: skip

# recipe -> (--kv-cache-dtype, --kv-cache-dtype-skip-layers) as we mean them, written out
SINGLE_FORMAT = {
    ("auto", "fp8", "fp8", "auto"): ("fp8_e4m3", ["0", "3"]),
    ("auto", "nvfp4", "nvfp4", "nvfp4"): ("nvfp4", ["0"]),
    ("nvfp4",) * NUM_LAYERS: ("nvfp4", []),
    ("nvfp4_4over6",) * NUM_LAYERS: ("nvfp4_4over6", []),
}
MIXED = [("fp8", "nvfp4", "fp8", "auto"), ("fp8k_nvfp4v",) * NUM_LAYERS]


@pytest.fixture
def model_dir(tmp_path):
    """A folder with a 4-layer Llama ``config.json`` (and ``quantization_config`` if given)."""

    def make(quantization_config: dict | None = None) -> str:
        config = dict(LLAMA)
        if quantization_config is not None:
            config["quantization_config"] = quantization_config
        (tmp_path / "config.json").write_text(json.dumps(config))
        return str(tmp_path)

    return make


def _engine_config(model: str, *flags: str):
    """vLLM's CLI parser, then ``EngineArgs.from_cli_args(...).create_engine_config()``."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", model, "--skip-tokenizer-init", "--max-model-len", "128",
                            *flags])  # fmt: skip
    return EngineArgs.from_cli_args(ns).create_engine_config()


@pytest.fixture(scope="module")
def llama():
    """Builds vLLM's own LlamaForCausalLM for a config (one gloo process group, torn down)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.model_executor.models.llama import LlamaForCausalLM

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = []

    def build(config, device: str = "cpu"):
        with set_current_vllm_config(config):
            if not started:
                init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
                ensure_model_parallel_initialized(1, 1)
                started.append(True)
            with torch.device(device):
                return LlamaForCausalLM(vllm_config=config)

    yield build
    if started:
        destroy_model_parallel()
        destroy_distributed_environment()


@pytest.mark.parametrize("layers", list(SINGLE_FORMAT), ids="-".join)
def test_single_format_flags_parse_as_meant(layers):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

    dtype, skip = SINGLE_FORMAT[layers]
    flags, needs_map = recipe_vllm_args(layers)
    assert not needs_map
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", "m", *flags]))
    assert args.kv_cache_dtype == dtype
    assert args.kv_cache_dtype_skip_layers == skip
    mode = KVQuantMode.FP8_PER_TENSOR if dtype.startswith("fp8") else KVQuantMode.NVFP4
    assert get_kv_quant_mode(args.kv_cache_dtype) == mode


def test_vllms_kv_quant_mode_of_our_dtypes():
    from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

    assert get_kv_quant_mode("nvfp4") == KVQuantMode.NVFP4
    assert get_kv_quant_mode("nvfp4_4over6") == KVQuantMode.NVFP4
    assert get_kv_quant_mode("fp8_e4m3") == KVQuantMode.FP8_PER_TENSOR
    assert get_kv_quant_mode("auto") == KVQuantMode.NONE


@pytest.mark.parametrize("layers", list(SINGLE_FORMAT)[:3], ids="-".join)
def test_single_format_flags_set_each_vllm_layer(layers, model_dir, llama):
    """``create_engine_config`` accepts the flags and vLLM's Llama attention layers store
    each layer as the recipe says (the model dtype on ``auto`` layers)."""
    dtype, skip = SINGLE_FORMAT[layers]
    config = _engine_config(model_dir(), *recipe_vllm_args(layers)[0])
    assert config.cache_config.cache_dtype == dtype
    assert config.cache_config.kv_cache_dtype_skip_layers == skip
    model = llama(config, device="meta")
    got = [layer.self_attn.attn.kv_cache_dtype for layer in model.model.layers]
    assert got == ["auto" if f == "auto" else dtype for f in layers]


@pytest.mark.parametrize("layers", MIXED, ids="-".join)
def test_mixed_recipe_flags_defer_to_the_checkpoint_map(layers):
    """A recipe vLLM 0.32's one dtype cannot state: ``--kv-cache-dtype auto``, the map carries
    it (and 0.32 has no reader of that map: see the tests below)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    flags, needs_map = recipe_vllm_args(layers)
    assert needs_map
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", "m", *flags]))
    assert (args.kv_cache_dtype, args.kv_cache_dtype_skip_layers) == ("auto", [])


@pytest.mark.parametrize(("fmt", "want"), [("fp8", "fp8_e4m3"), ("nvfp4", "nvfp4")])
def test_vllm_reads_a_uniform_recipes_kv_algo(fmt, want):
    """vLLM's ModelOpt KV-algo reader (what ``--kv-cache-dtype auto`` resolves from) on our
    ``config.json`` ``quantization_config``."""
    from vllm.utils.torch_utils import get_kv_cache_quant_algo_string

    config = {"quant_method": "modelopt", **quant_config((fmt,) * NUM_LAYERS)}
    assert get_kv_cache_quant_algo_string(config) == want


@pytest.mark.parametrize("layers", MIXED, ids="-".join)
def test_vllm_032_reads_no_mixed_map(layers):
    """0.32's reader knows one KV algo for the model, not ``MIXED_PRECISION`` (nor ModelOpt's
    ``FP8_K_NVFP4_V``): it falls back to the model dtype; the map itself round-trips through
    kvtuner's reader (vLLM PR #56116's checks; core tier)."""
    from vllm.utils.torch_utils import get_kv_cache_quant_algo_string

    config = {"quant_method": "modelopt", **quant_config(layers)}
    assert get_kv_cache_quant_algo_string(config) == "auto"
    assert read_quant_config(config, NUM_LAYERS) == layers


@pytest.mark.parametrize("kv_flag", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("layers", [("fp8",) * NUM_LAYERS, *MIXED], ids="-".join)
def test_vllm_032_refuses_the_checkpoint_config(layers, kv_flag, model_dir):
    """What 0.32 does with our ``config.json``: ``quant_algo: MIXED_PRECISION`` selects its
    ``modelopt_mixed`` config, whose reader wants a non-empty weight ``quantized_layers`` map
    (a KV-only checkpoint has none) and raises, whatever ``--kv-cache-dtype`` says."""
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig

    config = {"quant_method": "modelopt", **quant_config(layers)}
    picked = ModelOptMixedPrecisionConfig.override_quantization_method(config, None)
    assert picked == "modelopt_mixed"
    with pytest.raises(ValueError, match="non-empty 'quantized_layers'"):
        _engine_config(model_dir(config), "--kv-cache-dtype", kv_flag)


def test_vllm_maps_and_loads_our_scale_names(model_dir, llama):
    """``scale_tensors`` names through vLLM's ``maybe_remap_kv_scale_name`` and its Llama
    loader (``AutoWeightsLoader`` with the quant config's cache-scale mapper): each value lands
    in its layer's ``attn.k_scale`` / ``attn.v_scale`` (FP8: that side's amax / 448, ModelOpt's
    convention); the ``auto`` layer gets none."""
    from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name

    recipe = EngineRecipe(("auto", "fp8", "fp8", "fp8"), (1.0, 224.0, 448.0, 100.0),
                          (2.0, 896.0, 44.8, 10.0))  # fmt: skip
    scales = scale_tensors(recipe)
    assert len(set(scales.values())) == len(scales) == 6  # distinct: a swap would show
    model = llama(_engine_config(model_dir(MODELOPT_FP8)))
    params = dict(model.named_parameters())
    want = {}
    for name in scales:
        layer, side = int(name.split(".")[2]), name.rsplit(".", 1)[1][0]
        target = f"model.layers.{layer}.self_attn.attn.{side}_scale"
        assert target in params
        assert maybe_remap_kv_scale_name(name, params) == target
        want[target] = (recipe.k_amax if side == "k" else recipe.v_amax)[layer] / 448
    assert set(want) == {
        f"model.layers.{i}.self_attn.attn.{s}_scale" for i in (1, 2, 3) for s in "kv"
    }
    loaded = model.load_weights((k, torch.tensor(v)) for k, v in scales.items())
    assert loaded == set(want)
    for target, value in want.items():
        assert params[target].item() == pytest.approx(value, rel=1e-6), target
    attn0 = model.model.layers[0].self_attn.attn
    assert (attn0.k_scale.item(), attn0.v_scale.item()) == (-1.0, -1.0)  # vLLM's "not loaded"


def test_vllm_032_cannot_load_scales_without_a_quant_config(model_dir, llama):
    """With flags alone (no quant config), 0.32's Llama has no ``attn.k_scale`` parameter and
    its loader fails on a checkpoint's ``k_proj.k_scale``: the scales need the ModelOpt config
    that 0.32 refuses (above), so on 0.32 a recipe is flags with unit scales."""
    model = llama(_engine_config(model_dir(), "--kv-cache-dtype", "fp8_e4m3"))
    assert not any(n.endswith(("k_scale", "v_scale")) for n, _ in model.named_parameters())
    with pytest.raises(AttributeError):
        model.load_weights([("model.layers.1.self_attn.k_proj.k_scale", torch.tensor(0.5))])
    assert model.model.layers[1].self_attn.attn._k_scale.item() == 1.0
