"""The pool's channel-axis (KIVI) sides: a :class:`ChannelPages` store per side (packed page
blocks plus the fp staging of filling pages), created with the buffers and told by SGLang's
allocator hooks when pages are freed."""

from __future__ import annotations

import torch

from .channel_pages import ChannelPages

__all__ = ["PoolChannels"]


class PoolChannels:
    """Mixin of :class:`KVTunerMHATokenToKVPool`: channel-axis page stores. Needs ``_channel``
    (per local layer: (K pages, V pages) or None), ``size``, ``page_size``, ``head_num``,
    ``head_dim``, ``stage_pages``, ``dtype``, ``device``, ``pack_pages`` (the page packer)
    and, for pre-RoPE keys, ``_slot_rope`` (:class:`.slot_rope.PoolRope`)."""

    def _rows(self, spec) -> tuple[int, int, int]:
        return (self.size + self.page_size, self.head_num, spec.row_bytes(self.head_dim))

    def _side_buffer(self, spec) -> tuple[torch.Tensor, ChannelPages | None]:
        """A layer side's packed buffer and, for a channel-axis spec, its page store."""
        if spec.axis == "token" or not spec.is_quantized:
            return torch.zeros(self._rows(spec), dtype=torch.uint8, device=self.device), None
        pages = ChannelPages(
            spec,
            pages=(self.size + self.page_size) // self.page_size,
            heads=self.head_num,
            head_dim=self.head_dim,
            stage_pages=self.stage_pages,
            dtype=self.dtype,
            device=self.device,
            rope=self._slot_rope() if spec.pre_rope else None,
            packer=self.pack_pages,
        )
        return pages.blocks, pages

    def _channel_stores(self) -> list[ChannelPages]:
        """Every channel-axis side's page store, all local layers."""
        return [side for pair in self._channel if pair for side in pair if side is not None]

    def staging_bytes(self) -> int:
        """Bytes of the fp staging of channel-axis sides (0 without them)."""
        return sum(side.staging_bytes() for side in self._channel_stores())

    def release_pages(self, *page_ids: torch.Tensor) -> None:
        """SGLang's allocator freed these pages: drop their staged (filling) values."""
        filling = [side for side in self._channel_stores() if side.staged_pages]
        if not filling:
            return
        pages = torch.cat([p.reshape(-1) for p in page_ids]).tolist() if page_ids else []
        for side in filling:
            side.release(pages)

    def clear_staging(self) -> None:
        """SGLang's allocator was cleared: no page is filling."""
        for side in self._channel_stores():
            side.clear()
