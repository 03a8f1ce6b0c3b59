"""ChannelSides: the pool's channel-axis (KIVI) sides, a :class:`ChannelPages` store per side
(packed page blocks plus the fp staging of filling pages), created with the layers' packed
buffers and told by SGLang's allocator hooks when pages are freed."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from sglang.srt.mem_cache.memory_pool import KvBufferDesc

from ....profile import LayerSpec
from ....quant import QuantSpec
from .channel_pages import ChannelPages
from .geometry import PoolGeometry
from .slot_rope import SlotRope

__all__ = ["ChannelSides", "buffer_descs"]

SidePair = tuple[ChannelPages | None, ChannelPages | None]


class ChannelSides:
    """Per local layer: (K pages, V pages) when a side is channel-axis, else None."""

    def __init__(self, pairs: Sequence[SidePair | None]) -> None:
        self._pairs = list(pairs)

    @classmethod
    def allocate(
        cls,
        specs: Sequence[LayerSpec],
        geometry: PoolGeometry,
        *,
        rope: SlotRope | None,
        packer: Callable[..., None],
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], ChannelSides]:
        """Packed K and V buffers of every layer (uint8 ``[rows, heads, row_bytes]``, or a
        channel-axis side's page blocks) and the page stores of the channel-axis sides (each
        staging ``geometry.stage_pages`` filling pages). ``rope``: the slot positions of
        pre-RoPE keys; ``packer``: the page packer."""

        def side(spec: QuantSpec) -> tuple[torch.Tensor, ChannelPages | None]:
            if spec.axis == "token" or not spec.is_quantized:
                shape = (geometry.rows, geometry.heads, spec.row_bytes(geometry.head_dim))
                return torch.zeros(shape, dtype=torch.uint8, device=geometry.device), None
            pages = ChannelPages(
                spec, geometry, rope=rope if spec.pre_rope else None, packer=packer
            )
            return pages.blocks, pages

        sides = [(side(s.k), side(s.v)) for s in specs]
        pairs = [(k[1], v[1]) if k[1] or v[1] else None for k, v in sides]
        return [k[0] for k, _ in sides], [v[0] for _, v in sides], cls(pairs)

    def __getitem__(self, local: int) -> SidePair | None:
        return self._pairs[local]

    def __len__(self) -> int:
        return len(self._pairs)

    def any(self) -> bool:
        """Whether any layer has a channel-axis side."""
        return any(pair is not None for pair in self._pairs)

    def side(self, local: int, which: str) -> ChannelPages | None:
        """Local layer ``local``'s K (``which="k"``) or V page store, or None (token-axis)."""
        pair = self._pairs[local]
        return None if pair is None else pair[which == "v"]

    def stores(self) -> list[ChannelPages]:
        """Every channel-axis side's page store, all local layers."""
        return [side for pair in self._pairs if pair for side in pair if side is not None]

    def staging_bytes(self) -> int:
        """Bytes of the fp staging of channel-axis sides (0 without them)."""
        return sum(side.staging_bytes() for side in self.stores())

    def release(self, *page_ids: torch.Tensor) -> None:
        """SGLang's allocator freed these pages: drop their staged (filling) values."""
        filling = [side for side in self.stores() if side.staged_pages]
        if not filling:
            return
        pages = torch.cat([p.reshape(-1) for p in page_ids]).tolist() if page_ids else []
        for side in filling:
            side.release(pages)

    def clear(self) -> None:
        """SGLang's allocator was cleared: no page is filling."""
        for side in self.stores():
            side.clear()


def buffer_descs(
    k_buffer: Sequence[torch.Tensor], v_buffer: Sequence[torch.Tensor], rows: int
) -> list[KvBufferDesc]:
    """SGLang's descriptor per packed buffer (k0..kL-1, v0..vL-1) of a pool of ``rows`` slots:
    row bytes differ per layer; a channel-axis buffer's row is a page's block."""
    return [
        KvBufferDesc(
            f"{prefix}{i}",
            tuple(buf.shape),
            row_bytes=buf[0].numel(),
            tokens_per_row=rows // buf.shape[0],
        )
        for prefix, bufs in (("k", k_buffer), ("v", v_buffer))
        for i, buf in enumerate(bufs)
    ]
