"""Bit packing of the packed format: integer codes <-> little-endian code streams, and fp16
metadata <-> bytes. The grid (which code each value gets) lives in :mod:`.reference`."""

from __future__ import annotations

import functools

import torch

__all__ = ["from_fp16_bytes", "fp16_bytes", "pack_codes", "unpack_codes"]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (any dtype holding 0..2^bits-1) -> uint8 [..., D*bits/8].

    The codes form one little-endian bit stream: code i occupies stream bits
    ``[i*bits, (i+1)*bits)``, and byte j holds stream bits ``[8j, 8j+8)``. For 2/4/8 bits a byte
    holds whole codes (code i of a byte at bit ``i*bits``); 3/5/6-bit codes straddle bytes, so
    every 8 codes make one ``bits``-byte word. D must be a multiple of 8.
    """
    if 8 % bits:
        return _pack_words(codes, bits)
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


def _pack_words(codes: torch.Tensor, bits: int) -> torch.Tensor:
    # a word of 8 codes is 8*bits stream bits: 24 fit int32, 40/48 int64
    dtype = torch.int32 if 8 * bits < 32 else torch.int64
    c = codes.to(dtype).unflatten(-1, (-1, 8))  # [..., D/8, 8]: 8 codes = one word
    byte_shifts, code_shifts = _word_shifts(bits, dtype, str(codes.device))
    word = (c << code_shifts).sum(-1, dtype=dtype)  # codes never overlap: sum == OR
    out = (word.unsqueeze(-1) >> byte_shifts) & 0xFF  # [..., D/8, bits]
    return out.flatten(-2).to(torch.uint8)


def unpack_codes(
    packed: torch.Tensor, bits: int, dtype: torch.dtype | None = torch.uint8
) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: uint8 [..., B] -> codes [..., B*8/bits] in ``dtype``
    (None: whatever integer dtype unpacking produced, uint8 or a word dtype; no extra cast)."""
    if 8 % bits:
        codes = _unpack_words(packed, bits)
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


def _unpack_words(packed: torch.Tensor, bits: int) -> torch.Tensor:
    # a word of 8 codes is 8*bits stream bits: 24 fit int32 (half the bytes moved), 40/48 int64
    dtype = torch.int32 if 8 * bits < 32 else torch.int64
    b = packed.to(dtype).unflatten(-1, (-1, bits))  # [..., D/8, bits]: one word each
    byte_shifts, code_shifts = _word_shifts(bits, dtype, str(packed.device))
    word = (b << byte_shifts).sum(-1, dtype=dtype)  # bytes never overlap: sum == OR
    return ((word.unsqueeze(-1) >> code_shifts) & ((1 << bits) - 1)).flatten(-2)


@functools.lru_cache(maxsize=16)
def _word_shifts(bits: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifts of a word's ``bits`` bytes ([bits]) and of its 8 codes ([8]); cached (never an
    inference tensor, see _hadamard_cpu)."""
    with torch.inference_mode(False):
        byte_shifts = torch.arange(0, 8 * bits, 8, dtype=dtype, device=device)
        code_shifts = torch.arange(0, 8 * bits, bits, dtype=dtype, device=device)
    return byte_shifts, code_shifts


def fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """fp32 [..., n] -> uint8 [..., 2n] (fp16 little-endian)."""
    return v.half().contiguous().view(torch.uint8)


def from_fp16_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()
