"""Runtimes that load a profile: the HF transformers cache and :func:`~.hf.apply.apply` (hf),
the SGLang packed pool (sglang), vLLM plans and their byte counts (vllm), and the engine
exports of a recipe: ModelOpt checkpoint config, vLLM flags, TensorRT-LLM dtype (engines)."""
