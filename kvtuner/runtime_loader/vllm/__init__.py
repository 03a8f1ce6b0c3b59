"""vLLM runtime: kvtuner plans for vLLM's own KV cache formats (no plugin, no fork).

A :class:`VllmPlan` is one ``--kv-cache-dtype`` plus the layers
``--kv-cache-dtype-skip-layers`` keeps at the model's dtype; :class:`VllmLayout` counts the
bytes and token capacity vLLM allocates for it; :func:`engine_kwargs` / :func:`vllm_args` turn a
vLLM profile into ``vllm.LLM(...)`` keywords or ``vllm serve`` flags.
"""

from ...profile import VllmPlan
from .capacity import VllmLayout
from .engine import engine_kwargs, serve_argv, vllm_args

__all__ = ["VllmLayout", "VllmPlan", "engine_kwargs", "serve_argv", "vllm_args"]
