"""Model code that can write K/V around the pool, found by reading the model's source.

In sglang 0.5.23 some models' attention stores K/V with fused kernels instead of the pool's
``set_kv_buffer`` (rotary embedding with ``fused_set_kv_buffer_arg=`` when
``enable_fused_set_kv_buffer(...)``: CUDA with a bf16 KV cache, or ROCm; aiter's
``aiter_fused_qk_norm_rope_set_kv``; backends' ``get_fused_kv_write_buffers``), then call attention
with ``save_kv_cache=False``. Those kernels would write raw model-dtype K/V, never packed rows.
Over the kvtuner pool every one of these paths is off (:mod:`.backend_choice`), so such models
store through ``set_kv_buffer``; the plugin logs which module it found them in.

Which models: the served model class's module, and the ``sglang.srt.models`` modules it imports
from (their decoder layers), contain one of :data:`MARKERS`. Reading the source keeps this true
for the installed SGLang instead of a hand-kept list of architectures.
"""

from __future__ import annotations

import inspect
import re
import sys

__all__ = ["MARKERS", "fused_write_modules"]

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
