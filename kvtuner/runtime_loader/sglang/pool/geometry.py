"""PoolGeometry: the sizes every buffer of the kvtuner pool is allocated from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PoolGeometry"]


@dataclass(frozen=True)
class PoolGeometry:
    """What every packed buffer of the pool shares: ``rows`` slots (size + page), ``page``
    slots per page, ``heads`` KV heads of ``head_dim``, the model ``dtype``, the ``device``;
    ``stage_pages``: the filling pages each channel-axis side stages in fp (per side)."""

    rows: int
    page: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device | str
    stage_pages: int

    def __post_init__(self) -> None:
        if min(self.rows, self.page, self.heads, self.head_dim) <= 0 or self.stage_pages < 0:
            raise ValueError(f"invalid pool geometry {self}")

    @property
    def pages(self) -> int:
        """Pages of ``page`` slots the pool's ``rows`` hold."""
        return self.rows // self.page
