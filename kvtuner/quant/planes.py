"""Planes: a pool's packed rows laid out so that every head's codes start 16 bytes apart.

A pool stores ``uint8 [slots, Hkv, R]``. As *rows*, slot s holds head 0's row (its C code
bytes, then its M bytes of scales and zeros), head 1's row, ...: a row starts at a multiple of
R, so rows of 68 bytes (4-bit codes, one scale and zero a token-head at d 128) or 136 (8-bit
g64) are read in 4- and 8-byte copies (on an H200 such rows decoded at half the speed their
instructions predicted). As *planes*, the slot's same ``Hkv · R`` bytes hold every head's
codes first, then every head's scales and zeros::

    rows:   [C0 M0][C1 M1] ... [C7 M7]
    planes: [C0 C1 ... C7][M0 M1 ... M7]

Head h's codes start at ``h · C`` and its metadata at ``Hkv · C + h · M`` of the slot: the
codes are 16-byte aligned wherever C and ``Hkv · R`` are multiples of 16 (d 128: every bit
width; 8 KV heads: every row length), with not one byte more. A slot is still one unit (a
slot's bytes copy, move to a host pool and back, as before); only what reads or writes a
head's row within it changes: the pack and unpack kernels, the attention kernels (a constexpr
each: the metadata's offset from the codes, :func:`~.triton_codes.meta_offset`), and the
torch reference (:func:`to_planes`, :func:`from_planes`).
"""

from __future__ import annotations

import torch

from .spec import QuantSpec

__all__ = [
    "from_planes",
    "layer_planes",
    "meta_bytes",
    "plannable",
    "planes_align",
    "to_planes",
]


def meta_bytes(spec: QuantSpec, head_dim: int) -> int:
    """Bytes of a row's scales and zeros (0 for 16-bit rows)."""
    return spec.row_bytes(head_dim) - spec.code_bytes(head_dim) if spec.is_quantized else 0


def plannable(spec: QuantSpec, head_dim: int) -> bool:
    """Token-axis codes whose code and metadata bytes are whole int32 words (the kernels
    address both in words): every quantized token-axis spec at head_dim 128 except symmetric
    rows of one group (2 bytes of metadata)."""
    if not spec.is_quantized or spec.axis != "token":
        return False
    return spec.code_bytes(head_dim) % 4 == 0 and meta_bytes(spec, head_dim) % 4 == 0


def planes_align(spec: QuantSpec, head_dim: int, heads: int) -> bool:
    """Whether planes give this pool's codes 16-byte copies its rows do not: rows not a
    multiple of 16 bytes, while the codes and a slot's bytes are (KV4 g128 and KV8 g64 at d
    128 and 8 KV heads; not with 1 KV head, where no layout of 68 bytes aligns)."""
    rows = spec.row_bytes(head_dim)
    codes = spec.code_bytes(head_dim) if spec.is_quantized else rows
    return plannable(spec, head_dim) and rows % 16 != 0 and codes % 16 == 0 == heads * rows % 16


def layer_planes(
    k_spec: QuantSpec, v_spec: QuantSpec, head_dim: int, heads: int
) -> tuple[bool, bool]:
    """Which of a pool layer's K and V to lay out as planes: every plannable side of a layer
    where planes align either side's codes (:func:`planes_align`), so that one flag a layer
    (``AttentionBatch.planes``) says how both are read; else neither."""
    sides = (k_spec, v_spec)
    if not any(planes_align(s, head_dim, heads) for s in sides):
        return False, False
    return plannable(k_spec, head_dim), plannable(v_spec, head_dim)


def to_planes(rows: torch.Tensor, spec: QuantSpec, head_dim: int) -> torch.Tensor:
    """Rows ``[..., Hkv, R]`` -> the same bytes as planes (a new tensor, same shape)."""
    heads, width, codes = rows.shape[-2], rows.shape[-1], _codes(spec, head_dim)
    flat = torch.cat([rows[..., :codes].flatten(-2), rows[..., codes:].flatten(-2)], -1)
    return flat.view(*rows.shape[:-2], heads, width)


def from_planes(planes: torch.Tensor, spec: QuantSpec, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`to_planes`."""
    heads, width, codes = planes.shape[-2], planes.shape[-1], _codes(spec, head_dim)
    flat = planes.flatten(-2)
    lead = planes.shape[:-2]
    code_part = flat[..., : heads * codes].reshape(*lead, heads, codes)
    meta_part = flat[..., heads * codes :].reshape(*lead, heads, width - codes)
    return torch.cat([code_part, meta_part], -1)


def _codes(spec: QuantSpec, head_dim: int) -> int:
    if not plannable(spec, head_dim):
        raise ValueError(f"{spec.short()} rows at head_dim {head_dim} are not laid out as planes")
    return spec.code_bytes(head_dim)
