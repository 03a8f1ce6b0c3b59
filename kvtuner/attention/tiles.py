"""Triton device functions of the packed attention kernel (:mod:`.kernel`): K/V tiles read and
dequantized in registers from packed rows, channel-axis blocks or an unpacked tail, pre-RoPE
keys rotated forward to their positions, and one step of the online softmax (optional logit soft
cap, sliding-window mask)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant.triton_codes import load_codes, load_fp16


@triton.jit
def _kv_tile(ptr, off, md, ok, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
             SYM: tl.constexpr):  # fmt: skip
    """Rows at ``ptr + off`` ([BT] element offsets; ``ok`` masks them) -> fp32 [BT, D].
    16 bits: ``ptr`` is fp16 elements; else uint8 packed rows: codes, and ``md`` bytes on
    (:func:`~kvtuner.quant.triton_codes.meta_offset`) scales and zeros."""
    BT: tl.constexpr = off.shape[0]
    if BITS == 16:
        d = tl.arange(0, D)
        return tl.load(ptr + off[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    NB: tl.constexpr = D * BITS // 8
    NG: tl.constexpr = D // G
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    src = ptr + off
    codes = tl.reshape(load_codes(src, ok, NB, D // 8, BITS), [BT, NG, G])
    meta = src[:, None] + md + 2 * tl.arange(0, NG)[None, :]  # [BT, NG] fp16 scale bytes
    scale = load_fp16(meta, ok[:, None])[:, :, None]  # once per group and row
    if SYM:
        vals = tl.math.div_rn((codes - HALF) * scale, HALF * 1.0)
    else:
        vals = load_fp16(meta + 2 * NG, ok[:, None])[:, :, None] + codes * scale
    return tl.reshape(vals, [BT, D])


@triton.jit
def _channel_tile(base, t, ok, stride_block, D: tl.constexpr, BITS: tl.constexpr,
                  G: tl.constexpr, SYM: tl.constexpr):  # fmt: skip
    """Tokens t [BT] of channel-axis blocks at ``base`` (block i at ``i * stride_block``: the
    codes of G tokens, then D scales, D zeros) -> fp32 [BT, D]."""
    BT: tl.constexpr = t.shape[0]
    NB: tl.constexpr = D * BITS // 8  # code bytes of one token in a block
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    block = base + (t // G).to(tl.int64) * stride_block  # [BT]
    codes = tl.reshape(load_codes(block + (t % G) * NB, ok, NB, D // 8, BITS), [BT, D])
    meta = block[:, None] + G * NB + 2 * tl.arange(0, D)[None, :]  # [BT, D] scale bytes
    scale = load_fp16(meta, ok[:, None])
    if SYM:
        return tl.math.div_rn((codes - HALF) * scale, HALF * 1.0)
    return load_fp16(meta + 2 * D, ok[:, None]) + codes * scale


@triton.jit
def _paged_channel_tile(base, stage, stage_rows, slot, ok, stride_page, stride_row, stride_pos,
                        D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
                        SYM: tl.constexpr):  # fmt: skip
    """Keys of pool slots [BT] kept as channel-axis pages (page = slot // G): a full page's
    block at ``base + page * stride_page``, a filling page's fp values at ``stage + row *
    stride_row + (slot % G) * stride_pos`` (row = ``stage_rows[page]``, -1 once packed)."""
    page = slot // G
    row = tl.load(stage_rows + page, mask=ok, other=-1)
    staged = ok & (row >= 0)
    x = _channel_tile(base, slot, ok & (row < 0), stride_page, D, BITS, G, SYM)
    at = row.to(tl.int64) * stride_row + (slot % G) * stride_pos
    fp = tl.load(stage + at[:, None] + tl.arange(0, D)[None, :], mask=staged[:, None], other=0.0)
    return tl.where(staged[:, None], fp.to(tl.float32), x)


@triton.jit
def _stored_tile(base, tail, t, tok, ok, packed, stride_tok, md, stride_tail, D: tl.constexpr,
                 BITS: tl.constexpr, G: tl.constexpr, SYM: tl.constexpr,
                 CHANNEL: tl.constexpr):  # fmt: skip
    """Positions t [BT] of one K or V: packed rows below ``packed`` tokens, the tail (rows at
    ``tail + i * stride_tail``) from there on -> fp32 [BT, D]; token rows' scales ``md``
    bytes after their codes."""
    in_rows = ok & (t < packed)
    if CHANNEL:
        x = _channel_tile(base, t, in_rows, stride_tok, D, BITS, G, SYM)
    else:
        x = _kv_tile(base, tok * stride_tok, md, in_rows, D, BITS, G, SYM)
    in_tail = (ok & (t >= packed))[:, None]
    at = tail + (t - packed).to(tl.int64)[:, None] * stride_tail + tl.arange(0, D)[None, :]
    return tl.where(in_tail, tl.load(at, mask=in_tail, other=0.0).to(tl.float32), x)


@triton.jit
def _rope_tile(k, pos, freq_ptr, HALF: tl.constexpr):
    """Keys k fp32 [BT, D] stored at position 0 -> rotated forward to positions pos [BT] (int),
    ``rotate_half`` layout: for j < HALF, channels j and j + HALF turn by pos·f_j (f fp32
    [HALF] at ``freq_ptr``); channels >= R = 2·HALF pass. R a power of two: the tile splits into
    D/R chunks of R channels, each into its halves a, b [BT, D/R, HALF]; only chunk 0 turns."""
    BT: tl.constexpr = k.shape[0]
    C: tl.constexpr = k.shape[1] // (2 * HALF)
    angle = pos.to(tl.float32)[:, None] * tl.load(freq_ptr + tl.arange(0, HALF))[None, :]
    cos, sin = tl.cos(angle)[:, None, :], tl.sin(angle)[:, None, :]  # [BT, 1, HALF]
    pairs = tl.permute(tl.reshape(k, [BT, C, 2, HALF]), (0, 1, 3, 2))  # [BT, C, HALF, 2]
    a, b = tl.split(pairs)  # channels j and j + HALF of each chunk
    first = (tl.arange(0, C) == 0)[None, :, None]  # the rotary chunk; the rest pass
    a, b = tl.where(first, a * cos - b * sin, a), tl.where(first, b * cos + a * sin, b)
    return tl.reshape(tl.permute(tl.join(a, b), (0, 1, 3, 2)), [BT, C * 2 * HALF])


@triton.jit
def _visible(t, ok, qpos, window, WINDOW: tl.constexpr):
    """bool [QP, BT]: key positions t [BT] each query row (position qpos [QP]) attends: causal,
    and with a window only the last ``window`` positions, its own included."""
    seen = ok[None, :] & (t[None, :] <= qpos[:, None])
    if WINDOW:
        seen = seen & (t[None, :] > qpos[:, None] - window)
    return seen


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """tl.dot; exact fp32 (``ieee``) for fp32 operands (the CPU interpreter's queries)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _qk(q, k, IEEE: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """Raw scores fp32 [QP, BT] of q [QP, D] against keys k [BT, D]. ``KEYS_FIRST`` (decode):
    as (k·qᵀ)ᵀ, so that the tile's BT tokens are the MMA's rows and the few query heads of a KV
    head its columns (8 wide, where q's rows were padded to 16: one-warp KV4 g32, sm_90a: 182 ->
    167 registers, 64 -> 32 MMAs and 1183 -> 1025 instructions a tile)."""
    if KEYS_FIRST:
        return tl.trans(_dot(k, tl.trans(q), IEEE))
    return _dot(q, tl.trans(k), IEEE)


@triton.jit
def _pv(p, v, IEEE: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """p [QP, BT] times values v [BT, D] -> fp32 [QP, D]; ``KEYS_FIRST`` as in :func:`_qk`:
    (vᵀ·pᵀ)ᵀ, the head_dim channels the MMA's rows."""
    if KEYS_FIRST:
        return tl.trans(_dot(tl.trans(v), tl.trans(p), IEEE))
    return _dot(p, v, IEEE)


@triton.jit
def _softmax_step(s, ok, m, denom, score_scale, cap_log2, SOFTCAP: tl.constexpr):
    """One tile of the online softmax: raw scores s = q·k fp32 [QP, BT], ok [QP, BT] ->
    (m, denom) updated, alpha [QP] (rescales what was accumulated), p fp32 [QP, BT]. Scores in
    log2 units: ``s * score_scale`` (= sm_scale·log2 e), or with a soft cap
    ``cap_log2 * tanh(s * score_scale)`` (score_scale = sm_scale / cap)."""
    s = cap_log2 * _tanh(s * score_scale) if SOFTCAP else s * score_scale
    s = tl.where(ok, s, -float("inf"))  # [QP, BT]
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # nothing seen yet: no rescale
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, denom * alpha + tl.sum(p, 1), alpha, p
