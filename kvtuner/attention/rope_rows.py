"""Pre-RoPE keys (:mod:`.rope`) in the decode kernel (:mod:`.decode_kernel`): q and the
unpacked tail read in spans (Triton device functions), and the host check of which batches the
kernel rotates, and the launch's table of rotary steps (:func:`rope_steps`). The packed rows'
spans and the rotated scores are :mod:`.packed_rows`' (``key_spans``, ``rope_scores``), inside
its loop over tiles.

A K tile is read as its two rotary halves, channels ``[0, R/2)`` and ``[R/2, R)``, each
[BT, R/2], plus a pass-through span, each span dequantized on its own (:func:`.packed_rows.
dequantized`). Channel j of the low half and channel j of the high half are a ``rotate_half``
pair, so they sit at the same place of their two tensors and turn by ``pos·f_j`` element-wise:
no lane exchanges a value. The turned halves are then joined side by side into one tile
(:func:`.packed_rows.rotary_tile`) for one dot, ``s = [q_lo, q_hi]·[k_lo', k_hi'] +
q_pass·k_pass``, with q loaded once a program and put in the same order. Keys rotated over
the whole row split their turn: key i of a tile turns by i·f_j past the tile's first key (the
table), and q back by that key's position, once a tile (:func:`.packed_rows.stepped_rope`).
A span is in the codes' order (pair order, :func:`.packed_rows.row_codes`, which keeps a
word's codes in the word): q's spans, the frequencies, the unpacked tail's spans and the
table are put in that order too (:func:`spans`, :func:`rope_steps`).

The pass-through span is channels ``[R, D)`` where ``D - R`` is a power of two (R = D: none,
R = D/2), else the whole row with q's rotary channels zeroed (the R rotary channels read twice,
their pass-through product zero). The host check (:func:`rope_decodable`): R/2 >= 16 (the
smallest ``tl.dot``), halves starting at a word of codes (2/4/8 bits) or of high-plane codes
(3/5/6 bits: 32 channels), and the kernel's own limits (:func:`.rope.rope_in_kernel`). KIVI
pages are read in the same spans (:func:`.packed_rows.page_spans`: a scale and zero a channel).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ..quant.triton_codes import low_bits
from .packed_rows import (
    key_lanes,
    kivi_keys,
    pair_order,
    pass_start,
    rotary_tile,
    stepped_rope,
)
from .rope import rope_in_kernel, rotary_steps

__all__ = ["rope_decodable", "rope_steps"]


@triton.jit
def rope_query(q, freq_ptr, steps_ptr, pos0, HALF: tl.constexpr, BITS: tl.constexpr,
               KEYS_FIRST: tl.constexpr = False, PAIRS: tl.constexpr = False):  # fmt: skip
    """q [QP, D] (channel order) -> the tuple the scores take: q's spans (:func:`spans`), its
    rotary halves as one tile too (:func:`.packed_rows.rotary_tile`, ``PAIRS`` as there) and
    its pass-through in key lane order where ``KEYS_FIRST``, the frequencies fp32 [HALF] in
    the codes' order, ``pos0`` (the position of stored key 0) and the launch's rotary steps
    (:func:`~.rope.rotary_steps`, in the codes' order too)."""
    lo, hi, rest = spans(q, HALF, BITS)
    freq = tl.load(freq_ptr + tl.arange(0, HALF))[None, :]
    if BITS < 16:
        freq = pair_order(freq, BITS)
    rotary = rotary_tile(lo, hi, KEYS_FIRST, PAIRS)
    rest = key_lanes(rest, 1, 2) if KEYS_FIRST else rest
    return lo, hi, rotary, rest, tl.reshape(freq, [HALF]), pos0, steps_ptr


@triton.jit
def spans(x, HALF: tl.constexpr, BITS: tl.constexpr):
    """Rows x [N, D] in channel order -> their spans in the codes' order, as
    :func:`.packed_rows.key_spans` reads packed keys: the low and high rotary halves [N, HALF]
    and the pass-through [N, D - PASS0] (its rotary channels zero where it is the whole row;
    the low half again where there is none). Shuffles: for q once a program, the tail's tiles."""
    D: tl.constexpr = x.shape[1]
    if BITS < 16:
        x = pair_order(x, BITS)  # a word's codes stay in its word: spans keep their channels
    lo = _take(x, 0, HALF)
    hi = _take(x, HALF, HALF)
    PASS0: tl.constexpr = pass_start(D, HALF)
    if PASS0 == 0:
        rest = tl.where(tl.arange(0, D)[None, :] >= 2 * HALF, x, 0.0).to(x.dtype)
    elif PASS0 < D:
        rest = _take(x, PASS0, D - PASS0)
    else:
        rest = lo
    return lo, hi, rest


@triton.jit
def _take(x, C0: tl.constexpr, W: tl.constexpr):
    """Columns [C0, C0 + W) of x [N, D] (C0 a multiple of W) -> [N, W]."""
    N: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    chunks = tl.reshape(x, [N, D // W, W])
    pick = (tl.arange(0, D // W) == C0 // W)[None, :, None]
    return tl.sum(tl.where(pick, chunks, 0.0), 1).to(x.dtype)


def _span_fits(spec: Any, start: int, width: int) -> bool:
    """A span of ``width`` channels at ``start`` reads as whole words or chunks, and covers
    whole groups or lies inside one."""
    if not spec.is_quantized:
        return True
    unit = 32 // spec.bits if 32 % spec.bits == 0 else 32
    g = spec.group_size
    in_groups = width % g == 0 if width >= g else start % g + width <= g
    if spec.axis == "channel":  # groups run along tokens: a scale a channel
        in_groups = True
    return start % unit == 0 and width % unit == 0 and in_groups


def rope_decodable(batch: Any) -> bool:
    """Whether the decode kernel rotates this batch's pre-RoPE keys (true without them)."""
    if batch.rope_freq is None:
        return True
    half, dim, spec = batch.rope_freq.shape[0], batch.head_dim, batch.k_spec
    if half < 16 or not rope_in_kernel(half, spec, smoothed=batch.k_smooth is not None):
        return False
    start = pass_start(dim, half)
    spans = [(0, half), (half, half)] + ([(start, dim - start)] if start < dim else [])
    return all(_span_fits(spec, c0, w) for c0, w in spans)


def rope_steps(batch: Any, tokens: int, q_dtype: torch.dtype) -> torch.Tensor | None:
    """The decode kernel's rotary steps (:func:`~.rope.rotary_steps`) for its tiles of
    ``tokens`` keys (and a tail's of 16), in the codes' order of the batch's keys and the dots'
    dtype (fp16, or fp32 where q is: the interpreter); None where the kernel reads none
    (:func:`.packed_rows.stepped_rope`)."""
    freq, bits = batch.rope_freq, batch.k_spec.bits
    kivi = kivi_keys(batch)
    if freq is None or not stepped_rope(freq.shape[0], batch.head_dim, kivi, tokens):
        return None
    word = 0 if bits >= 16 else 32 // low_bits(bits)
    dtype = torch.float32 if q_dtype == torch.float32 else torch.float16
    return rotary_steps(freq, max(tokens, 16), word, dtype)
