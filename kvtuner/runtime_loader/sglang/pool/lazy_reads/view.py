"""DequantizedView: what the lazy read mode hands an attention backend instead of a tensor.

Backends that only gather K/V by slot ids (SGLang's ``torch_native``: ``k_cache[per_req_tokens]``
with an int32 slice of ``req_to_token``) never need the whole layer dequantized: indexing the view
with slot ids gathers and dequantizes just those slots from the packed rows, so no layer-sized
scratch exists. ``shape``/``dtype``/``device`` are those of the tensor the view stands for,
``[rows, heads, head_dim]`` in the model dtype.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DequantizedView"]

_SLOT_DTYPES = (torch.int32, torch.int64)


class DequantizedView:
    """Layer ``layer_id``'s dequantized K (``which="k"``) or V of ``pool``, read on indexing."""

    __slots__ = ("_pool", "_layer_id", "_which", "shape")

    def __init__(self, pool: Any, layer_id: int, which: str) -> None:
        if which not in ("k", "v"):
            raise ValueError(f"which must be 'k' or 'v', got {which!r}")
        self._pool, self._layer_id, self._which = pool, layer_id, which
        rows = pool.size + pool.page_size
        self.shape = torch.Size((rows, pool.head_num, pool.head_dim))

    @property
    def dtype(self) -> torch.dtype:
        return self._pool.dtype

    @property
    def device(self) -> torch.device:
        return torch.device(self._pool.device)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"DequantizedView(layer={self._layer_id}, {self._which}, shape={tuple(self.shape)}, "
            f"dtype={self.dtype})"
        )

    def __getitem__(self, slots: Any) -> torch.Tensor:
        """Dequantized rows ``[*slots.shape, heads, head_dim]`` of integer slot ids (a tensor of
        any shape, a list, an int, or a slice of rows)."""
        if type(slots) is torch.Tensor and slots.dim() == 1 and slots.dtype in _SLOT_DTYPES:
            return self._pool.read_for_view(self._layer_id, self._which, slots)  # torch_native
        loc = self._slot_tensor(slots)
        flat = loc.reshape(-1)
        out = self._pool.read_for_view(self._layer_id, self._which, flat)  # [n, heads, D]
        return out.reshape(*loc.shape, *self.shape[1:])

    def _slot_tensor(self, slots: Any) -> torch.Tensor:
        if isinstance(slots, slice):
            return torch.arange(self.shape[0], device=self.device)[slots]
        if isinstance(slots, tuple):
            raise TypeError("DequantizedView takes slot ids on the first dimension only")
        loc = torch.as_tensor(slots, device=self.device)
        if loc.dtype == torch.bool or loc.is_floating_point() or loc.is_complex():
            raise TypeError(f"DequantizedView takes integer slot ids, got {loc.dtype}")
        if loc.dtype not in _SLOT_DTYPES:
            loc = loc.long()
        return loc
