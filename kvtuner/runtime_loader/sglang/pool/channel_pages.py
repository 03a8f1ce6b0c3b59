"""ChannelPages: one layer's K (or V) in the pool as channel-axis (KIVI) blocks, one per page.

With SGLang's ``--page-size`` equal to the spec's ``group_size`` G, page ``p`` holds slots
``p*G .. p*G+G-1`` of one request, filled in order. Its keys are quantized per channel (groups run
along the page's G tokens) once the page is full, into the format's channel-axis block
(``kvtuner.quant.quantize`` on ``[heads, G, D]``: G code rows, then D scales, then D zeros),
the same bytes the HF cache packs; ``quant.slot_ops.pack_channel_pages`` writes them (one Triton
launch per write on CUDA).

Storage:
- ``blocks``: uint8 ``[pages, heads, block_bytes]``, the packed blocks of full pages (the pool's
  K or V buffer of this layer);
- ``stage``: model dtype ``[stage_pages, G, heads, D]``, the fp values of pages still filling,
  one row per page; a row is claimed by a page's first write and released when the page fills
  (after it is packed) or is freed by SGLang's allocator (:meth:`release`). Bounded: a full
  stage raises (the plugin sizes it from ``--max-running-requests``);
- ``stage_rows``: int32 ``[pages]`` on the device, each page's stage row (-1: packed or never
  written), kept beside the host map so the fused attention kernels find filling pages
  (``kvtuner.attention``'s ``k_stage`` / ``k_stage_rows``).

Reads return a staged page's fp values as stored (a filling page is read unquantized, like
KIVI's residual window) and a full page's dequantized block. Pre-RoPE keys (``rope``, a
:class:`.slot_rope.SlotRope`) are turned back to position 0 before they are staged, so stage
and blocks both hold unrotated keys, and forward to their slots' positions on read.
Radix prefix sharing stays page-granular: a shared prefix is made of full pages, so it is
read from ``blocks``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ....errors import KVTunerError
from ....quant import QuantSpec, dequantize
from ....quant.slot_ops import pack_channel_pages
from .geometry import PoolGeometry
from .slot_rope import SlotRope

__all__ = ["ChannelPages", "page_runs"]


def page_runs(loc: torch.Tensor, page: int) -> list[tuple[int, int, int, int]]:
    """Runs of consecutive slots inside one page: ``(page id, first position, first index in
    loc, count)`` for slot ids ``loc`` (int [n]), in ``loc``'s order."""
    if loc.numel() == 0:
        return []
    loc = loc.long()
    pages = torch.div(loc, page, rounding_mode="floor")
    cut = (pages[1:] != pages[:-1]) | (loc[1:] != loc[:-1] + 1)
    starts = [0, *(torch.nonzero(cut).flatten() + 1).tolist()]
    ends = [*starts[1:], loc.numel()]
    firsts = loc[starts].tolist()
    return [(s // page, s % page, i, e - i) for s, i, e in zip(firsts, starts, ends, strict=True)]


class ChannelPages:
    """Channel-axis blocks of ``geometry.pages`` pages and the fp staging of its
    ``stage_pages`` filling pages (one layer side). ``spec``: quantized, ``axis="channel"``;
    its group size is the page size. ``rope``: the slot positions of pre-RoPE keys."""

    def __init__(
        self,
        spec: QuantSpec,
        geometry: PoolGeometry,
        *,
        rope: SlotRope | None = None,
        packer: Callable[..., None] = pack_channel_pages,
    ) -> None:
        if spec.axis != "channel" or not spec.is_quantized:
            raise KVTunerError(f"ChannelPages stores quantized channel-axis specs, got {spec}")
        if spec.group_size != geometry.page:
            raise KVTunerError(f"ChannelPages: {spec} needs pages of {spec.group_size} slots")
        if spec.pre_rope != (rope is not None):
            raise KVTunerError(f"ChannelPages: a pre_rope spec needs slot positions, got {spec}")
        g = geometry
        self.rope = rope
        self.packer = packer  # packer(blocks, pages, x [P, G, heads, D], spec)
        self.spec = spec
        self.page = g.page  # = spec.group_size
        self.head_dim = g.head_dim
        self.dtype = g.dtype
        block = spec.block_bytes(g.head_dim)
        self.blocks = torch.zeros(g.pages, g.heads, block, dtype=torch.uint8, device=g.device)
        stage = (g.stage_pages, g.page, g.heads, g.head_dim)  # [stage_pages, G, heads, D]
        self.stage = torch.zeros(stage, dtype=g.dtype, device=g.device)
        self.stage_rows = torch.full((g.pages,), -1, dtype=torch.int32, device=g.device)
        self._rows: dict[int, int] = {}  # filling page -> its stage row
        self._free = list(range(g.stage_pages - 1, -1, -1))
        self._keys: tuple[torch.Tensor, torch.Tensor] | None = None  # sorted pages, their rows

    @property
    def staged_pages(self) -> int:
        return len(self._rows)

    def staging_bytes(self) -> int:
        return self.stage.numel() * self.stage.element_size()

    # -- writes ----------------------------------------------------------------------------
    def write(self, loc: torch.Tensor, x: torch.Tensor) -> list[int]:
        """Store x [n, heads, D] at slots ``loc`` (int [n]); returns the pages packed now."""
        if self.rope is not None:
            x = self.rope.turn(loc, x, forward=False)
        x = x.to(self.dtype)
        full: list[torch.Tensor] = []  # [G, heads, D] per page packed now
        packed: list[int] = []
        filled: list[int] = []  # staged pages packed now
        for page, pos, i, n in page_runs(loc, self.page):
            if pos == 0 and n == self.page:  # a whole page in one write: no staging
                full.append(x[i : i + n])
                packed.append(page)
                continue
            row = self._claim(page)
            self.stage[row, pos : pos + n] = x[i : i + n]
            if pos + n == self.page:
                full.append(self.stage[row])
                packed.append(page)
                filled.append(page)
        if packed:
            index = torch.tensor(packed, dtype=torch.long, device=self.blocks.device)
            self.packer(self.blocks, index, torch.stack(full), self.spec)  # [P, G, heads, D]
        self.release(filled)
        return packed

    def _claim(self, page: int) -> int:
        row = self._rows.get(page)
        if row is not None:
            return row
        if not self._free:
            raise KVTunerError(
                f"the kvtuner pool's fp staging is full ({self.stage.shape[0]} filling pages): "
                "more requests are filling pages than --max-running-requests allows"
            )
        row = self._rows[page] = self._free.pop()
        self.stage_rows[page] = row
        self._keys = None
        return row

    def release(self, pages) -> None:
        """Forget the staged values of ``pages`` (packed, or freed by SGLang's allocator)."""
        for page in pages:
            row = self._rows.pop(int(page), None)
            if row is not None:
                self._free.append(row)
                self.stage_rows[int(page)] = -1
                self._keys = None

    def clear(self) -> None:
        self.release(list(self._rows))

    # -- reads -----------------------------------------------------------------------------
    def read(self, loc: torch.Tensor) -> torch.Tensor:
        """Values [n, heads, D] (model dtype) of slots ``loc`` (int [n])."""
        stored = self._read_stored(loc.long())
        if self.rope is None:
            return stored
        return self.rope.turn(loc, stored, forward=True).to(self.dtype)

    def _read_stored(self, loc: torch.Tensor) -> torch.Tensor:
        pages, pos = torch.div(loc, self.page, rounding_mode="floor"), loc % self.page
        rows = self._stage_rows(pages)
        if rows is None:
            return self._unpack(pages, pos)
        staged = rows >= 0
        if bool(staged.all()):
            return self.stage[rows, pos]
        out = self._unpack(pages, pos)
        out[staged] = self.stage[rows[staged], pos[staged]]
        return out

    def _stage_rows(self, pages: torch.Tensor) -> torch.Tensor | None:
        """Stage row of each page (-1: packed), or None when no page of ``pages`` is staged."""
        if not self._rows:
            return None
        if self._keys is None:
            keys = sorted(self._rows)
            rows = [self._rows[p] for p in keys]
            device = self.blocks.device
            self._keys = (torch.tensor(keys, device=device), torch.tensor(rows, device=device))
        keys, rows = self._keys
        at = torch.searchsorted(keys, pages).clamp_(max=keys.numel() - 1)
        hit = keys[at] == pages
        if not bool(hit.any()):
            return None
        return torch.where(hit, rows[at], -1)

    def _unpack(self, pages: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Dequantized values of packed slots: each distinct page's block once."""
        unique, inverse = torch.unique(pages, return_inverse=True)
        blocks = self.blocks[unique].unsqueeze(2)  # [U, heads, 1 block, bytes]
        values = dequantize(blocks, self.spec, self.head_dim, self.dtype)  # [U, heads, G, D]
        return values[inverse, :, pos]  # [n, heads, D]
