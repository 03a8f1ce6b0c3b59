"""Model code that writes K/V around the pool: refused on GPUs, found by reading the model's source.

In sglang 0.5.23 some models' attention stores K/V with fused kernels instead of the pool's
``set_kv_buffer`` (rotary embedding with ``fused_set_kv_buffer_arg=`` when
``enable_fused_set_kv_buffer(...)``: CUDA with a bf16 KV cache, or ROCm; aiter's
``aiter_fused_qk_norm_rope_set_kv``; backends' ``get_fused_kv_write_buffers``), then call attention
with ``save_kv_cache=False``. Those kernels write raw model-dtype K/V into whatever
``get_key_buffer`` returns (the dequant scratch), so the packed rows would never be written.
The kernels exist on CUDA/ROCm only; on CPU every write goes through ``set_kv_buffer``.

Which models: the served model class's module, and the ``sglang.srt.models`` modules it imports
from (their decoder layers), contain one of :data:`MARKERS`. Reading the source keeps this true
for the installed SGLang instead of a hand-kept list of architectures.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

__all__ = ["MARKERS", "fused_write_modules", "fused_write_refusal"]

MARKERS = re.compile(
    r"enable_fused_set_kv_buffer\(|fused_set_kv_buffer_arg=|"
    r"aiter_fused_qk_norm_rope_set_kv\(|get_fused_kv_write_buffers\("
)
_IMPORTS = re.compile(r"^\s*from (sglang\.srt\.models\.[\w.]+) import", re.M)


def _source(module_name: str) -> str:
    module = sys.modules.get(module_name)
    if module is None:
        import importlib

        module = importlib.import_module(module_name)
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return ""


def fused_write_modules(model_cls: type) -> list[str]:
    """Modules (the class's own and the model modules it imports from) with a fused K/V write."""
    own = model_cls.__module__
    text = _source(own)
    names = [own, *dict.fromkeys(m for m in _IMPORTS.findall(text) if m != own)]
    found = []
    for name in names:
        if name.endswith(".utils"):  # defines the helpers; the call sites are in the models
            continue
        if MARKERS.search(text if name == own else _source(name)):
            found.append(name)
    return found


def fused_write_refusal(model_config: Any, device: str) -> str | None:
    """What to refuse, or None: on CUDA/ROCm, a served model whose code writes K/V fused."""
    if not str(device).startswith("cuda"):
        return None
    from sglang.srt.model_loader.utils import get_model_architecture

    model_cls, arch = get_model_architecture(model_config)
    modules = fused_write_modules(model_cls)
    if not modules:
        return None
    return (
        f"{arch} on a GPU (its attention writes K/V with fused kernels that bypass the "
        f"pool's set_kv_buffer: {modules[0]})"
    )
