"""A randomly initialised model of Llama-3.1-8B's shape, built from a config on the device (no
8B weights are reachable offline), with the tests' real 256-token byte-level tokenizer (its ids
are valid in the 128256-token vocabulary)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kvtuner.placement import placement

LLAMA_8B_SHAPE = dict(
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    hidden_size=4096,
    intermediate_size=14336,
    vocab_size=128256,
    rope_theta=500000.0,
    max_position_embeddings=8192,
)
TINY = dict(
    num_hidden_layers=2,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def random_llama(device: str, dtype: str, tiny: bool):
    """(model, tokenizer): Llama-3.1-8B's shape with random weights, built on the device."""
    import transformers

    tests = Path(__file__).parent.parent / "tests"
    sys.path[:0] = [str(tests), str(tests / "calibration")]
    from calib_helpers import byte_tokenizer  # a real 256-token byte-level tokenizer

    where = placement(device, dtype)
    shape = {**LLAMA_8B_SHAPE, **(TINY if tiny else {})}
    config = transformers.LlamaConfig(**shape)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    with where.torch_device:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=where.torch_dtype)
    return model.eval(), byte_tokenizer()
