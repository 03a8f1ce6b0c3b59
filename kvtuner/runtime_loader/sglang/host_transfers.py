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

from typing import Any

import torch
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from ...errors import KVTunerError

__all__ = ["CpuMHATokenToKVPoolHost", "TorchIndexTransfers", "TOKEN_INDEXED_LAYOUTS"]

# host layouts whose per-layer views ``k_data_refs[l]`` are indexed by host slot
TOKEN_INDEXED_LAYOUTS = ("layer_first", "page_first")


class TorchIndexTransfers:
    """Mixin for a ``HostKVCache`` with ``k_data_refs``/``v_data_refs`` (host, per layer),
    ``device_k_buffers``/``device_v_buffers`` (device, per layer) and ``target_layer_num``.
    The io backend argument is accepted and ignored: an index copy serves every backend."""

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

    def __init__(self, buffer_info: Any, *args: Any, **kwargs: Any) -> None:
        layout = args[3] if len(args) > 3 else kwargs.get("layout")
        if layout not in TOKEN_INDEXED_LAYOUTS:
            raise KVTunerError(
                f"HiCache on SGLang's CPU engine supports --hicache-mem-layout "
                f"{' or '.join(TOKEN_INDEXED_LAYOUTS)}, not {layout!r}"
            )
        if len(args) > 4:
            args = (*args[:4], False, *args[5:])
        else:
            kwargs["pin_memory"] = False  # cudaHostRegister needs a CUDA driver
        super().__init__(buffer_info, *args, **kwargs)
