"""HiCache device <-> host copies by torch indexing, for host pools whose per-layer views are
token-indexed (``k_data_refs[l]``/``v_data_refs[l]``: ``[host slots, heads, row]``).

SGLang 0.5.23 binds its transfer functions only on CUDA/ROCm (``sgl_kernel.kvcacheio``) or XPU
(``mem_cache/pool_host/mha.py:59-90``); on its CPU engine ``MHATokenToKVPoolHost`` has none, and
its host buffers are pinned with ``cudaHostRegister`` (``pool_host/common.py:147``, reached from
``alloc_with_host_register``, the default for device type "cpu"). An index copy works on any
device, so the kvtuner host pool (packed rows of a different width per layer) and, on the CPU
engine, SGLang's own MHA host pool (:class:`CpuMHATokenToKVPoolHost`) copy with it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from ....errors import KVTunerError

__all__ = [
    "CpuMHATokenToKVPoolHost",
    "TOKEN_INDEXED_LAYOUTS",
    "TorchIndexTransfers",
    "host_pool_arguments",
]

# host layouts whose per-layer views ``k_data_refs[l]`` are indexed by host slot
TOKEN_INDEXED_LAYOUTS = ("layer_first", "page_first")
_HOST_SIG = inspect.signature(MHATokenToKVPoolHost.__init__)


def host_pool_arguments(pool: Any, args: tuple, kwargs: dict, what: str):
    """``MHATokenToKVPoolHost.__init__``'s arguments bound for ``pool``, checked for index
    copies: -> (positional, keyword-only, every argument by name). Refuses layouts whose
    per-layer views are not token-indexed; CPU host memory is not pinned (cudaHostRegister needs
    a CUDA driver)."""
    call = _HOST_SIG.bind(pool, *args, **kwargs)
    call.apply_defaults()
    arguments = dict(call.arguments)
    if arguments["layout"] not in TOKEN_INDEXED_LAYOUTS:
        raise KVTunerError(
            f"{what} supports --hicache-mem-layout {' or '.join(TOKEN_INDEXED_LAYOUTS)}, "
            f"not {arguments['layout']!r}"
        )
    if arguments["buffer_info"].device.type == "cpu":
        arguments["pin_memory"] = False
    names = [n for n in _HOST_SIG.parameters if n != "self"]
    keyword_only = {n for n, p in _HOST_SIG.parameters.items() if p.kind is p.KEYWORD_ONLY}
    positional = [arguments[n] for n in names if n not in keyword_only]
    return positional, {n: arguments[n] for n in keyword_only}, arguments


class TorchIndexTransfers:
    """The two transfer methods SGLang's ``HostKVCache`` leaves abstract, for host pools with
    ``k_data_refs``/``v_data_refs`` (host, per layer), ``device_k_buffers``/``device_v_buffers``
    (device, per layer) and ``target_layer_num``: SGLang's own public fields of
    ``MHATokenToKVPoolHost``. It holds no state and shares no private field; it stays a base of
    the host pools because SGLang calls these as overrides of its own abstract methods. The io
    backend argument is accepted and ignored: an index copy serves every backend."""

    def backup_from_device_all_layer(
        self, device_pool: Any, host_indices, device_indices, io_backend: str
    ) -> None:
        host = host_indices.to("cpu", torch.long)
        device_buffers = (*self.device_k_buffers, *self.device_v_buffers)
        slots = device_indices.to(device_buffers[0].device, torch.long)
        for src, dst in zip(device_buffers, (*self.k_data_refs, *self.v_data_refs), strict=True):
            dst[host] = src[slots].to("cpu")

    def load_to_device_per_layer(
        self,
        device_pool: Any,
        host_indices,
        device_indices,
        layer_id: int,
        io_backend: str,
        *,
        is_draft: bool = False,
    ) -> None:
        if not is_draft and not 0 <= layer_id < self.target_layer_num:
            return
        host = host_indices.to("cpu", torch.long)
        pairs = (
            (self.k_data_refs[layer_id], self.device_k_buffers[layer_id]),
            (self.v_data_refs[layer_id], self.device_v_buffers[layer_id]),
        )
        slots = device_indices.to(pairs[0][1].device, torch.long)
        for src, dst in pairs:
            dst[slots] = src[host].to(dst.device)
        loaded = getattr(device_pool, "on_rows_loaded", None)
        if loaded is not None:  # the kvtuner pool drops what it cached of these slots
            loaded(layer_id, slots)


class CpuMHATokenToKVPoolHost(TorchIndexTransfers, MHATokenToKVPoolHost):
    """SGLang's MHA host pool on its CPU engine: unpinned host memory, index copies. Layouts
    ``layer_first`` and ``page_first`` (whose per-layer views SGLang builds token-indexed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        positional, keyword_only, _ = host_pool_arguments(
            self, args, kwargs, "HiCache on SGLang's CPU engine"
        )
        super().__init__(*positional, **keyword_only)
