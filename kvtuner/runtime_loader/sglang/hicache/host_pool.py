"""KVTunerMHATokenToKVPoolHost: SGLang's HiCache host tier (L2) holding the kvtuner pool's packed
rows as they are, and the pages its storage tier (L3) writes.

Geometry comes from the device pool's buffers (``MHABufferInfo.buffers``): layer ``l`` stores
uint8 rows ``[heads, k_row_bytes(l)]`` for K and ``[heads, v_row_bytes(l)]`` for V, so a host
token costs the profile's packed bytes, not ``2 * layers * heads * head_dim * dtype`` bytes.
Backup and load copy those bytes (:class:`TorchIndexTransfers`); nothing is quantized or
dequantized on the way.

Host memory: one uint8 buffer of ``size * size_per_token`` bytes, per layer a K and a V view
``[size, heads, row]``:

- ``page_first`` (SGLang's default): token-major, ``[size, size_per_token]``; a token's bytes are
  ``K0 V0 K1 V1 ...`` (heads x row each), so a page is one contiguous slice.
- ``layer_first``: one block per view, in the same order.

A storage page (``get_data_page``) is always the token-major bytes of ``page_size`` tokens,
whatever the layout. Its storage key names the profile hash (``storage_format_tag``, which SGLang
appends to the model name in every backend's key), so a page written under one profile is a miss
under another; and the device pool's layout (``-planes`` where some layer's rows are laid out as
planes, :mod:`kvtuner.quant.planes`), so a page of planes is a miss where rows are read.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.mem_cache.pool_host.common import ALLOC_MEMORY_FUNCS
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from ....errors import KVTunerError
from ....quant.packing import PACKED_FORMAT
from .host_transfers import TorchIndexTransfers, host_pool_arguments

__all__ = ["KVTunerMHATokenToKVPoolHost", "storage_tag"]


def storage_tag(profile_hash: str, layout: str = "rows") -> str:
    """The page-format tag of a profile's packed pages in storage keys: the packed format's
    version, the profile and ``layout`` (the device pool's, ``rows`` or ``planes``); pages
    stored under another format, profile or layout are misses."""
    tag = f"kvtuner-v{PACKED_FORMAT}-{profile_hash}"
    return tag + ("" if layout == "rows" else f"-{layout}")


class KVTunerMHATokenToKVPoolHost(TorchIndexTransfers, MHATokenToKVPoolHost):
    """``MHATokenToKVPoolHost(buffer_info, ...)`` over a kvtuner device pool's buffers.
    Build the class for a profile with :meth:`bound` (SGLang passes the parent's arguments)."""

    profile_hash: str | None = None
    storage_format_tag: str | None = None

    @classmethod
    def bound(cls, profile_hash: str, layout: str = "rows") -> type[KVTunerMHATokenToKVPoolHost]:
        tag = storage_tag(profile_hash, layout)
        attrs = {"profile_hash": profile_hash, "storage_format_tag": tag}
        return type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self.profile_hash is None:
            raise KVTunerError("KVTunerMHATokenToKVPoolHost needs a profile (use .bound())")
        positional, keyword_only, arguments = host_pool_arguments(
            self, args, kwargs, "kvtuner HiCache"
        )
        if arguments["draft_buffer_infos"]:
            raise KVTunerError("kvtuner HiCache does not support draft-model KV layers")
        # per layer: bytes of one head's packed row (device buffers: uint8 [rows, heads, row])
        buffers = arguments["buffer_info"].buffers
        self.k_row_bytes = tuple(int(b.shape[-1]) for b in buffers.k)
        self.v_row_bytes = tuple(int(b.shape[-1]) for b in buffers.v)
        super().__init__(*positional, **keyword_only)

    # -- geometry ----------------------------------------------------------------------------
    def _view_widths(self) -> list[int]:
        """Bytes per token of each view, in token order: K0, V0, K1, V1, ..."""
        heads = self.head_num
        return [
            heads * r for pair in zip(self.k_row_bytes, self.v_row_bytes, strict=True) for r in pair
        ]

    def get_size_per_token(self) -> int:
        return sum(self._view_widths())

    def get_ksize_per_token(self) -> int:
        return self.head_num * sum(self.k_row_bytes)

    def init_kv_buffer(self) -> torch.Tensor:
        self.token_stride_size = self.layout_dim = self.size_per_token
        alloc = ALLOC_MEMORY_FUNCS[self._transfer_device.type]
        return alloc(
            (self.size * self.size_per_token,),
            dtype=torch.uint8,
            device=self.device,
            pin_memory=self.pin_memory,
            allocator=self.allocator,
        )

    def _token_views(self) -> list[torch.Tensor]:
        """Per view (K0, V0, K1, ...): [size, heads, row] over the one host buffer."""
        widths, heads, views, start = self._view_widths(), self.head_num, [], 0
        if self.layout == "page_first":
            rows = self.kv_buffer.view(self.size, self.size_per_token)
            for width in widths:
                views.append(rows[:, start : start + width].unflatten(1, (heads, -1)))
                start += width
            return views
        for width in widths:  # layer_first: one block per view
            block = self.kv_buffer[start * self.size : (start + width) * self.size]
            views.append(block.view(self.size, heads, -1))
            start += width
        return views

    def _initialize_transfer_views(self, buffer_info: Any, write_back_staging: Any) -> None:
        self._views = views = self._token_views()  # token order: K0, V0, K1, V1, ...
        self.k_data_refs, self.v_data_refs = views[0::2], views[1::2]
        self.host_kv_data_refs = self.k_data_refs + self.v_data_refs
        self.element_dim = self.head_num * self.head_dim
        self.can_use_jit = self.can_use_write_back_jit = False  # SGLang's kernels: one width
        self.k_data_ptrs = self.v_data_ptrs = None
        self.staging_k_buffer = self.staging_v_buffer = None
        self.staging_page_capacity = self.staging_token_capacity = 0

    @property
    def k_buffer(self) -> list[torch.Tensor]:
        return self.k_data_refs

    @property
    def v_buffer(self) -> list[torch.Tensor]:
        return self.v_data_refs

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        return [self.kv_buffer]

    # -- storage pages (token-major bytes of page_size tokens) --------------------------------
    def _page_views(self, index: int) -> list[torch.Tensor]:
        return [view[index : index + self.page_size] for view in self._views]

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        if self.layout == "page_first":
            rows = self.kv_buffer.view(self.size, self.size_per_token)
            page = rows[index : index + self.page_size]
        else:
            page = torch.cat([v.flatten(1) for v in self._page_views(index)], dim=1)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = data_page.view(torch.uint8).reshape(self.page_size, self.size_per_token)
        start = 0
        for view in self._page_views(index):
            width = view[0].numel()
            view.copy_(page[:, start : start + width].view(view.shape))
            start += width

    def get_page_buffer_meta(self, indices):
        raise KVTunerError(
            "kvtuner HiCache pages are read and written through get_data_page "
            "(zero-copy storage backends are not supported)"
        )

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        return False
