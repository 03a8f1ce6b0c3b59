"""Runtimes that load a kvtuner profile: HF transformers cache (hf), SGLang pool (sglang)."""
