"""Pre-RoPE keys (``QuantSpec.pre_rope``) in packed attention: host side, torch only.

Such keys are stored rotated back to position 0 (:mod:`kvtuner.runtime_loader.hf.rope`); the
attention call passes the model's rotary frequencies ``rope_freq`` (fp32 [R/2], ``inv_freq``)
and ``rope_offset`` (an int, or int32 [B]: the position of each request's stored key 0), and
the key at token index t (packed or tail) is rotated forward to position ``offset + t`` in
transformers' ``rotate_half`` layout: channel pair (j, j + R/2) turns by that position times
f_j, channels >= R pass. The general kernel does it per dequantized K tile
(``.tiles._rope_tile``), the decode kernel per span of a tile (:mod:`.rope_rows`, with a
table of a tile's turns: :func:`rotary_steps`); the torch reference with
:func:`rope_forward`. Kept free of triton: :mod:`.layout` and :mod:`.reference` import it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "check_rope",
    "kernel_rope",
    "rope_forward",
    "rope_in_kernel",
    "rope_rotate",
    "rope_rotate_at",
    "rotary_steps",
]

# rotary_steps' tables, kept per frequency tensor: (its version when built, {key: table})
_STEPS = WeakIdKeyDictionary()


def rope_rotate(x: torch.Tensor, freq: torch.Tensor, start: int, *, forward: bool) -> torch.Tensor:
    """Keys x [..., T, D] at positions start..start+T-1 -> fp32, rotated forward (as the
    model's RoPE: key i stored at position 0 turns to ``start + i``) or back to position 0."""
    pos = torch.arange(start, start + x.shape[-2], device=x.device)
    return rope_rotate_at(x, freq, pos, forward=forward)


def rope_rotate_at(
    x: torch.Tensor, freq: torch.Tensor, positions: torch.Tensor, *, forward: bool
) -> torch.Tensor:
    """Keys x [..., T, D] at ``positions`` (int [T], any order: a paged pool's slots) -> fp32,
    rotated forward to those positions or back to position 0."""
    r = 2 * freq.shape[0]
    pos = positions.to(x.device, torch.float32)
    angle = pos[:, None] * freq.to(x.device, torch.float32)[None, :]  # [T, R/2]
    angle = torch.cat([angle, angle], dim=-1)  # [T, R]: pairs j and j + R/2 share an angle
    rot = x[..., :r].float()
    a, b = rot.chunk(2, dim=-1)
    half = torch.cat([-b, a], dim=-1)  # rotate_half
    out = (
        rot * angle.cos() + half * angle.sin()
        if forward
        else rot * angle.cos() - half * angle.sin()
    )
    return torch.cat([out, x[..., r:].float()], dim=-1)


def rope_forward(x: torch.Tensor, freq: torch.Tensor, start: int) -> torch.Tensor:
    """Keys x [..., T, D] stored at position 0 -> fp32, key i at position ``start + i``."""
    return rope_rotate(x, freq, start, forward=True)


def check_rope(batch: Any) -> None:
    """``rope_freq``: fp32 contiguous 1-D, 2·len <= head_dim, on q's device; ``rope_offset``:
    an int >= 0, or int32 [B] on q's device, and only with ``rope_freq``."""
    freq, off, dev, dim = batch.rope_freq, batch.rope_offset, batch.q.device, batch.head_dim
    if freq is None:
        if not isinstance(off, int) or off:
            raise ValueError("rope_offset needs rope_freq (keys stored pre-RoPE)")
        return
    ok = freq.dtype == torch.float32 and freq.dim() == 1 and 0 < 2 * freq.shape[0] <= dim
    if not ok or freq.device != dev or not freq.is_contiguous():
        raise ValueError(
            f"rope_freq must be contiguous fp32 [R/2] with R <= head_dim {dim} on {dev}, got "
            f"{freq.dtype} {tuple(freq.shape)} on {freq.device}"
        )
    if isinstance(off, torch.Tensor):
        bsz = batch.batch_size
        if off.dtype != torch.int32 or tuple(off.shape) != (bsz,) or off.device != dev:
            raise ValueError(
                f"rope_offset must be an int or int32 [{bsz}] on {dev}, got {off.dtype} "
                f"{tuple(off.shape)} on {off.device}"
            )
    elif isinstance(off, bool) or not isinstance(off, int) or off < 0:
        raise ValueError(f"rope_offset must be an int >= 0 or an int32 tensor, got {off!r}")


def rope_in_kernel(half: int, k_spec: Any, *, smoothed: bool) -> bool:
    """Whether the kernel can rotate pre-RoPE keys per tile: a power-of-two rotary width
    (``half`` = R/2 frequencies), keys neither Hadamard-rotated nor smoothed."""
    hadamard = k_spec.is_quantized and k_spec.rotation == "hadamard"
    return not half & (half - 1) and not hadamard and not smoothed


def kernel_rope(batch: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(freq, offsets int32 [B], R/2) as the kernel takes them; R/2 = 0 without pre-RoPE keys
    (the two pointers then unused). The kernel's own limits: R a power of two (it splits a
    tile into [BT, D/R, 2, R/2]), keys neither Hadamard-rotated nor smoothed (the rotation
    must act on the keys themselves, and q·λ·(k/λ) does not commute with it)."""
    freq, off, spec = batch.rope_freq, batch.rope_offset, batch.k_spec
    if freq is None:
        return batch.lengths, batch.lengths, 0
    half = freq.shape[0]
    if not rope_in_kernel(half, spec, smoothed=batch.k_smooth is not None):
        raise ValueError(
            f"the fused kernel rotates pre-RoPE keys of a power-of-two rotary width R, neither "
            f"Hadamard-rotated nor smoothed; got R = {2 * half}, {spec.short()}, "
            f"k_smooth {'set' if batch.k_smooth is not None else 'unset'}"
        )
    if isinstance(off, int):  # a device fill, no host sync
        off = torch.full((batch.batch_size,), off, dtype=torch.int32, device=batch.q.device)
    return freq, off, half


def rotary_steps(freq: torch.Tensor, tokens: int, word: int, dtype: torch.dtype) -> torch.Tensor:
    """cos and sin of i·f_j for i < ``tokens``: ``dtype`` [tokens, 2, R/2]: how far key i of a
    tile turns past the tile's first key (the decode kernel turns q back by that key's position
    instead, once a tile). Columns in the order a kernel holds packed codes: in each ``word``
    of codes (32 / their low bits; 0: channel order), code j of each half side by side
    (:func:`.packed_rows.pair_order`). Kept per ``freq`` tensor and rebuilt once it is written
    to; built afresh while a CUDA graph is captured (its kernels run only at replay)."""
    capturing = freq.is_cuda and torch.cuda.is_current_stream_capturing()
    version = -1 if freq.is_inference() else freq._version
    kept = None if capturing else _STEPS.get(freq)
    if kept is None or kept[0] != version:
        kept = (version, {})
    key = (tokens, word, dtype)
    if key not in kept[1]:
        pos = torch.arange(tokens, device=freq.device, dtype=torch.float32)
        angle = pos[:, None] * freq.float()[None, :]  # [tokens, R/2]
        if word:  # [.., words, 2, word/2] -> [.., words, word/2, 2]
            angle = angle.unflatten(-1, (-1, 2, word // 2)).transpose(-1, -2).flatten(-3)
        kept[1][key] = torch.stack([angle.cos(), angle.sin()], dim=1).to(dtype).contiguous()
        if not capturing:
            _STEPS[freq] = kept
    return kept[1][key]
