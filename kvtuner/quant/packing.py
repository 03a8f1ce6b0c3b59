"""Bit packing of the packed format: integer codes <-> little-endian code streams, and fp16
metadata <-> bytes. The grid (which code each value gets) lives in :mod:`.reference`."""

from __future__ import annotations

import functools

import torch

__all__ = [
    "PACKED_FORMAT",
    "from_fp16_bytes",
    "fp16_bytes",
    "high_order",
    "pack_codes",
    "split_bits",
    "unpack_codes",
]

# the version of the rows' bytes (docs/format.md): 3 since 3/5/6-bit codes are two planes; where
# packed pages outlive a process (HiCache storage) their keys carry it
PACKED_FORMAT = 3


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (any dtype holding 0..2^bits-1) -> uint8 [..., D*bits/8].

    2/4/8 bits: one little-endian bit stream: code i occupies stream bits ``[i*bits,
    (i+1)*bits)``, byte j holds stream bits ``[8j, 8j+8)`` (code i of a byte at bit
    ``i*bits``). 3/5/6 bits: two such streams, the *low plane* of every code's low bits (2, 4
    or 4 bits: :func:`split_bits`) and after it the *high plane* of its remaining 1, 1 or 2
    bits, in :func:`high_order`. D must be a multiple of 8.
    """
    if 8 % bits:
        low, high = split_bits(bits)
        c = codes.to(torch.int32)
        order = _index(high_order(codes.shape[-1], bits), c.device)
        return torch.cat(
            [pack_codes(c & ((1 << low) - 1), low), pack_codes(c[..., order] >> low, high)], -1
        )
    per_byte = 8 // bits
    if per_byte == 1:
        return codes.to(torch.int32).to(torch.uint8)  # via int32: torch's float->uint8 is slow
    c = codes.unflatten(-1, (-1, per_byte))  # [..., D/per_byte, per_byte]: one byte each
    if not c.is_floating_point():
        c = c.to(torch.int32)
    # code i of a byte times 2^(i*bits), summed: codes < 2^bits never carry, and every partial
    # sum is an integer < 256, exact in any float dtype
    packed = (c * _byte_weights(bits, c.dtype, str(c.device))).sum(-1)
    return packed.to(torch.int32).to(torch.uint8)  # via int32: torch's float->uint8 is slow


@functools.lru_cache(maxsize=16)
def _byte_weights(bits: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """[8 // bits] weights 2^(i*bits) of the codes in a byte; cached (never an inference tensor,
    see _hadamard_cpu)."""
    with torch.inference_mode(False):
        return torch.tensor([1 << i for i in range(0, 8, bits)], dtype=dtype, device=device)


def split_bits(bits: int) -> tuple[int, int]:
    """3/5/6-bit codes: the widths of their low and high planes (2 + 1, 4 + 1, 4 + 2). Each
    plane's codes sit whole in bytes and words, so a kernel reads both 16 bytes at a time and
    turns a word into codes with shifts and masks fixed at compile time."""
    if bits not in (3, 5, 6):
        raise ValueError(f"only 3/5/6-bit codes are split into planes, got {bits}")
    low = 2 if bits == 3 else 4
    return low, bits - low


@functools.lru_cache(maxsize=64)
def high_order(head_dim: int, bits: int) -> tuple[int, ...]:
    """The channel whose high bits each place of a 3/5/6-bit row's high plane holds.

    A kernel reads a low-plane word of P = 32/low codes as *pairs* (codes j and j + P/2 in a
    word's low and high 16 bits, after one shift: ``attention.packed_rows.row_codes``), so
    the high plane puts each pair's high bits 16 bits apart in one word too:
    high word k covers the E = low/high low words E·k .. E·k + E - 1, and code P·(E·k + e) +
    (P/2)·h + j of them sits at bits ``16·h + low·j + high·e`` of it; one shift puts a pair's
    high bits above its low ones. Channels past the last whole high word keep channel order."""
    low, high = split_bits(bits)
    per_word, per_high = 32 // low, 32 // high
    full = head_dim // per_high * per_high
    blocks = torch.arange(full).reshape(-1, per_high // per_word, 2, per_word // 2)
    return tuple(blocks.permute(0, 2, 3, 1).flatten().tolist()) + tuple(range(full, head_dim))


@functools.lru_cache(maxsize=64)
def _index(order: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``order`` as an index tensor; cached (never an inference tensor, see _hadamard_cpu)."""
    with torch.inference_mode(False):
        return torch.tensor(order, dtype=torch.long, device=device)


def unpack_codes(
    packed: torch.Tensor, bits: int, dtype: torch.dtype | None = torch.uint8
) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: uint8 [..., B] -> codes [..., B*8/bits] in ``dtype``
    (None: uint8, no extra cast)."""
    if 8 % bits:
        low, high = split_bits(bits)
        dim = packed.shape[-1] * 8 // bits
        codes = unpack_codes(packed[..., : dim * low // 8], low, None)
        high_codes = unpack_codes(packed[..., dim * low // 8 :], high, None)
        order = _index(high_order(dim, bits), packed.device)
        codes = codes.index_add_(-1, order, high_codes << low)  # high bits onto their channels
        return codes if dtype is None else codes.to(dtype)
    per_byte = 8 // bits
    if per_byte == 1:
        return packed if dtype is None else packed.to(dtype)
    out = torch.empty(*packed.shape, per_byte, dtype=dtype or torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    for i in range(per_byte):  # code 0 needs no shift, the top code no mask: one pass each less
        code = packed >> (i * bits) if i else packed
        out[..., i] = code & mask if i < per_byte - 1 else code
    return out.flatten(-2)


def fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """fp32 [..., n] -> uint8 [..., 2n] (fp16 little-endian)."""
    return v.half().contiguous().view(torch.uint8)


def from_fp16_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()
