"""Where the kvtuner attention backend comes in: SGLang's registry, the server's choice on CUDA,
and the fused K/V writes it routes back through the pool.

- :func:`register_backend` adds ``kvtuner`` to SGLang's attention registry
  (``attention_registry.register_attention_backend``) and to ``--attention-backend``'s choices
  (``arg_groups.choices.add_attention_backend_choices``), in every process the plugin loads in.
- :func:`choose_packed_backend` (``--kvtuner-profile`` on CUDA): attention is ``kvtuner``;
  another backend there is refused (the dequantizing scratch read is retired on CUDA), and
  prefill CUDA graphs are turned off (the backend captures decode graphs). CPU: unchanged.
- :func:`skip_fused_kv_writes` wraps ``models.utils.enable_fused_set_kv_buffer``: over a kvtuner
  pool it is False, so models that would store raw K/V from their rotary kernel (Qwen3-MoE,
  GPT-OSS, Bailing-MoE, SDAR, LLaDA2, Mellum) pass ``save_kv_cache=True`` and the backend stores
  them through ``set_kv_buffer`` (quantized). Qwen3's ROCm-only aiter write needs a cache in the
  activation dtype (the pool's rows are uint8), MiMo-V2 asks the backend for write buffers
  (``get_fused_kv_write_buffers``: None), Gemma 4's fused write is off in sglang 0.5.23.
"""

from __future__ import annotations

from typing import Any

import torch

from ....errors import KVTunerError
from ..pool.cell_size import PACKED_BACKEND

__all__ = ["choose_packed_backend", "register_backend", "serves_on_cuda", "skip_fused_kv_writes"]

_BACKEND_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def register_backend() -> None:
    """``kvtuner`` in SGLang's attention registry and CLI choices (idempotent)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention import attention_registry

    if PACKED_BACKEND not in ATTENTION_BACKEND_CHOICES:
        from sglang.srt.arg_groups.choices import add_attention_backend_choices

        add_attention_backend_choices([PACKED_BACKEND])
    attention_registry.register_attention_backend(PACKED_BACKEND)(_create)


def _create(model_runner: Any):
    from ..cuda.backend import KVTunerAttnBackend

    return KVTunerAttnBackend(model_runner)


def serves_on_cuda(server_args: Any) -> bool:
    """Whether the server runs on a CUDA device (``--device``, else what torch sees)."""
    device = getattr(server_args, "device", None)
    if device is None:
        return torch.cuda.is_available()
    return str(device).startswith("cuda")


def choose_packed_backend(server_args: Any) -> None:
    """On CUDA: attention ``kvtuner`` and no prefill CUDA graphs (raw, unresolved server args)."""
    if not serves_on_cuda(server_args):
        return
    for field in _BACKEND_FIELDS:
        chosen = getattr(server_args, field, None)
        if chosen not in (None, PACKED_BACKEND):
            flag = "--" + field.replace("_", "-")
            raise KVTunerError(
                f"on CUDA --kvtuner-profile serves attention with --attention-backend "
                f"{PACKED_BACKEND} (fused kernels over the packed pool), not {flag} {chosen}"
            )
    prefill_graphs = getattr(server_args, "cuda_graph_backend_prefill", None)
    if prefill_graphs not in (None, "disabled"):
        raise KVTunerError(
            f"--attention-backend {PACKED_BACKEND} captures decode CUDA graphs only; drop "
            f"--cuda-graph-backend-prefill {prefill_graphs}"
        )
    server_args.attention_backend = PACKED_BACKEND
    server_args.cuda_graph_backend_prefill = "disabled"


def skip_fused_kv_writes(original: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> bool:
    """AROUND ``enable_fused_set_kv_buffer``: False over a kvtuner pool, else SGLang's answer."""
    from sglang.srt.model_executor.forward_context import get_token_to_kv_pool

    from ..pool.store import KVTunerMHATokenToKVPool

    if isinstance(get_token_to_kv_pool(), KVTunerMHATokenToKVPool):
        return False
    return original(forward_batch, *args, **kwargs)
