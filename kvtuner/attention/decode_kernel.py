"""The decode kernel: one query token per request over token-axis packed K/V rows (2 to 8
bits, or 16), and its launcher. Specialised for the serving hot path; everything else runs the
general kernel (:mod:`.kernel`), which :func:`serves` tells apart.

Grid ``(B, Hkv, splits + tail)``: a program owns one KV head of one request and one slice of
its packed tokens (flash decoding); the ``Hq / Hkv`` query heads of that KV head are the rows of
its ``tl.dot`` (padded to 16), so each K/V tile is loaded once for all of them. A request with
an unpacked tail (the HF cache) gets one more program that attends only the tail. Partials merge
in :func:`.splits.merge_splits` (sinks there).

What makes it fast on a GPU (``benchmarks/kernel_resources.py`` reads it off the sm_90 build):
- codes load as int32 words, 16 bytes a load where every row offset is a multiple of 16 bytes
  (``VEC = 4``: the launcher passes strides in 16-byte units), else 8 or 4; scales and zeros as fp16
  from the same rows, one load per row; unmasked: tokens past the end re-read a valid row;
- codes become fp16 by the exponent trick (``code | 0x6400`` read as fp16 is 1024 + code) and
  dequantize in one fp16 ``fma`` an element; the dots run in fp16 (q, p and codes), scores and
  the softmax in fp32. bf16 q becomes fp16 once per program (clamped to fp16's range);
- one scale and zero per token-head (``group_size == head_dim``) skips the element-wise
  dequantization: ``q·x_t = scale_t·(q·c_t) + zero_t·Σq`` and ``Σ_t p_t·x_t = Σ_t (p_t·scale_t)·
  c_t + Σ_t p_t·zero_t`` (one dot each, two multiply-adds a token).

Under the CPU interpreter q is fp32 (``DOT_IEEE``): codes, scales and dots stay fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..quant.spec import QuantSpec
from .layout import AttentionBatch, choose_splits
from .splits import merge_splits, softmax_args, split_chunk
from .tiles import _dot, _softmax_step

__all__ = ["DecodePlan", "launch_decode", "plan_decode", "serves"]

_FP16_MAX = tl.constexpr(65504.0)


@triton.jit
def _row_codes(words_ptr, at, D: tl.constexpr, BITS: tl.constexpr, DT: tl.constexpr):
    """Codes of the rows starting at int32 word ``at`` [BT] -> ``DT`` [BT, D]: 2/4/8 bits in
    pair order (:func:`_word_codes`), 3/5/6 bits in channel order (:func:`_stream_codes`)."""
    if 32 % BITS == 0:
        codes = _word_codes(words_ptr, at, D, BITS, DT)
    else:
        codes = _stream_codes(words_ptr, at, D, BITS, DT)
    return codes


@triton.jit
def _stream_codes(words_ptr, at, D: tl.constexpr, BITS: tl.constexpr, DT: tl.constexpr):
    """3/5/6-bit codes of the rows at word ``at`` [BT] -> ``DT`` [BT, D], channel order. 32
    codes fill BITS words (a chunk); code j of a chunk starts at bit j·BITS, in word
    ``j·BITS // 32``, and runs into the next word where it straddles: each code picks its one
    or two words out of the chunk's BITS (loaded once a row, 4 bytes each), shifts and masks.
    Needs head_dim a multiple of 32 (whole chunks)."""
    BT: tl.constexpr = at.shape[0]
    NC: tl.constexpr = D // 32
    bit = tl.arange(0, 32) * BITS
    first, shift = (bit // 32)[None, None, :], (bit % 32)[None, None, :]
    straddles = shift + BITS > 32
    chunk = at[:, None] + tl.arange(0, NC)[None, :] * BITS  # [BT, NC] a chunk's first word
    lo = tl.zeros([BT, NC, 32], tl.uint32)
    hi = tl.zeros([BT, NC, 32], tl.uint32)
    for k in tl.static_range(BITS):
        word = tl.load(words_ptr + chunk + k).to(tl.uint32, bitcast=True)[:, :, None]
        lo = tl.where(first == k, word, lo)
        hi = tl.where(first + 1 == k, word, hi)
    high = tl.where(straddles, hi << ((32 - shift) % 32), 0)
    codes = ((lo >> shift) | high) & ((1 << BITS) - 1)
    return _codes_as(tl.reshape(codes.to(tl.int32), [BT, D]), DT)


@triton.jit
def _codes_as(c, DT: tl.constexpr):
    """int32 codes in [0, 256) -> ``DT`` exactly; fp16 by the exponent trick (no convert)."""
    if DT == tl.float16:  # noqa: SIM300 (a constexpr dtype, not a constant on the left)
        out = (c | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
    else:
        out = c.to(DT)
    return out


@triton.jit
def _word_codes(words_ptr, at, D: tl.constexpr, BITS: tl.constexpr, DT: tl.constexpr):
    """Codes of the rows starting at int32 word ``at`` [BT] -> ``DT`` [BT, D] in *pair order*.

    A row's codes are one little-endian bit stream: word w holds codes ``P·w .. P·w + P - 1``
    (P = 32/BITS), code ``P·w + i`` at bits ``[i·BITS, (i+1)·BITS)``. One shift and one
    and-or turn a word into two fp16 (exponent trick: ``code | 0x6400`` is 1024 + code): codes
    j and j + P/2 of the word, in its low and high half. So position ``P·w + 2j + half`` holds
    code ``P·w + j + half·P/2`` (:func:`_pair_order` puts q in that order, :func:`_channel_order`
    takes a result back); a word never spans two groups (the launcher's G >= P)."""
    BT: tl.constexpr = at.shape[0]
    P: tl.constexpr = 32 // BITS
    MASK2: tl.constexpr = ((1 << BITS) - 1) * 0x10001  # a code in each 16-bit half
    words = tl.load(words_ptr + at[:, None] + tl.arange(0, D // P)[None, :])  # [BT, D/P]
    pairs = words[:, :, None] >> (tl.arange(0, P // 2) * BITS)[None, None, :]
    if DT == tl.float16:  # noqa: SIM300 (a constexpr dtype, not a constant on the left)
        pairs = (pairs & MASK2) | 0x64006400
        lo = pairs.to(tl.int16).to(tl.float16, bitcast=True)
        hi = (pairs >> 16).to(tl.int16).to(tl.float16, bitcast=True)
        codes = tl.join(lo, hi) - 1024.0  # [BT, D/P, P/2, 2]
    else:
        pairs = pairs & MASK2
        codes = tl.join(pairs & 0xFFFF, pairs >> 16).to(DT)
    return tl.reshape(codes, [BT, D])


@triton.jit
def _pair_order(x, BITS: tl.constexpr):
    """x [R, D] in channel order -> the pair order of :func:`_row_codes` (codes of BITS)."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    P: tl.constexpr = 32 // BITS
    x = tl.permute(tl.reshape(x, [R, D // P, 2, P // 2]), (0, 1, 3, 2))
    return tl.reshape(x, [R, D])


@triton.jit
def _channel_order(x, BITS: tl.constexpr):
    """Inverse of :func:`_pair_order`."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    P: tl.constexpr = 32 // BITS
    x = tl.permute(tl.reshape(x, [R, D // P, P // 2, 2]), (0, 1, 3, 2))
    return tl.reshape(x, [R, D])


@triton.jit
def _row_meta(half_ptr, at, ok, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
              SYM: tl.constexpr, DT: tl.constexpr):  # fmt: skip
    """Scales and zeros of the rows at word ``at`` [BT] -> ``DT`` [BT, NG] each, such that
    x = zero + scale·code (symmetric rows: scale/HALF and -scale). One load a row."""
    NG: tl.constexpr = D // G
    first = 2 * (at + D * BITS // 32)  # fp16 index of the row's first scale
    at_g = first[:, None] + tl.arange(0, NG)[None, :]
    scale = tl.where(ok[:, None], tl.load(half_ptr + at_g), 0.0)  # not attended: 0, NaN-free
    if SYM:  # (code - HALF)·scale/HALF
        zero = (-scale).to(DT)
        scale = (scale.to(tl.float32) / ((1 << (BITS - 1)) - 1)).to(DT)
    else:
        zero = tl.where(ok[:, None], tl.load(half_ptr + at_g + NG), 0.0).to(DT)
        scale = scale.to(DT)
    return scale, zero


@triton.jit
def _dequantized(words_ptr, half_ptr, at, ok, D: tl.constexpr, BITS: tl.constexpr,
                 G: tl.constexpr, SYM: tl.constexpr, DT: tl.constexpr):  # fmt: skip
    """Rows at word ``at`` [BT] -> ``DT`` [BT, D]: one fma an element (16-bit rows: loaded)."""
    BT: tl.constexpr = at.shape[0]
    if BITS == 16:
        x = tl.load(half_ptr + 2 * at[:, None] + tl.arange(0, D)[None, :])
        x = tl.where(ok[:, None], x, 0.0).to(DT)
    else:
        NG: tl.constexpr = D // G
        codes = tl.reshape(_row_codes(words_ptr, at, D, BITS, DT), [BT, NG, G])
        scale, zero = _row_meta(half_ptr, at, ok, D, BITS, G, SYM, DT)
        x = tl.reshape(tl.fma(codes, scale[:, :, None], zero[:, :, None]), [BT, D])
    return x


@triton.jit
def _scores(q, q_sum, k_words, k_half, at, ok, D: tl.constexpr, BITS: tl.constexpr,
            G: tl.constexpr, SYM: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """Raw scores fp32 [QP, BT] of q [QP, D] (row sums q_sum fp32 [QP]) against the keys at
    word ``at`` [BT]; one scale a token-head: scale·(q·codes) + zero·Σq, after the dot."""
    BT: tl.constexpr = at.shape[0]
    if BITS < 16 and G == D:
        codes = _row_codes(k_words, at, D, BITS, q.dtype)
        scale, zero = _row_meta(k_half, at, ok, D, BITS, G, SYM, tl.float32)  # [BT, 1]
        s = _dot(q, tl.trans(codes), IEEE)
        s = s * tl.reshape(scale, [1, BT]) + q_sum[:, None] * tl.reshape(zero, [1, BT])
    else:
        k = _dequantized(k_words, k_half, at, ok, D, BITS, G, SYM, q.dtype)
        s = _dot(q, tl.trans(k), IEEE)
    return s


@triton.jit
def _values(p, v_words, v_half, at, ok, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
            SYM: tl.constexpr, DT: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """p fp32 [QP, BT] times the values at word ``at`` [BT] -> (fp32 [QP, D], fp32 [QP]: the
    zeros' part Σ_t p·zero, added to every channel by the caller; 0 unless one scale a row)."""
    BT: tl.constexpr = at.shape[0]
    if BITS < 16 and G == D:
        codes = _row_codes(v_words, at, D, BITS, DT)
        scale, zero = _row_meta(v_half, at, ok, D, BITS, G, SYM, tl.float32)  # [BT, 1]
        pv = _dot((p * tl.reshape(scale, [1, BT])).to(DT), codes, IEEE)
        pz = tl.sum(p * tl.reshape(zero, [1, BT]), 1)
    else:
        v = _dequantized(v_words, v_half, at, ok, D, BITS, G, SYM, DT)
        pv = _dot(p.to(DT), v, IEEE)
        pz = tl.zeros([p.shape[0]], tl.float32)
    return pv, pz


@triton.jit
def _packed_part(q, q_sum, k_words, k_half, v_words, v_half, table_ptr, row, k_at0, v_at0,
                 k_st, v_st, stride_table, lo, hi, start, qpos, window, score_scale, cap_log2,
                 D: tl.constexpr, BT: tl.constexpr, K_BITS: tl.constexpr, K_G: tl.constexpr,
                 K_SYM: tl.constexpr, K_VEC: tl.constexpr, V_BITS: tl.constexpr,
                 V_G: tl.constexpr, V_SYM: tl.constexpr, V_VEC: tl.constexpr,
                 PAGED: tl.constexpr, HAS_START: tl.constexpr, WINDOW: tl.constexpr,
                 SOFTCAP: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """Online softmax over packed positions [lo, hi) -> (m, denom, acc [QP, D]) fp32."""
    QP: tl.constexpr = q.shape[0]
    m = tl.full([QP], -float("inf"), tl.float32)
    denom = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    acc_z = tl.zeros([QP], tl.float32)
    for t0 in range(lo, hi, BT):
        t = t0 + tl.arange(0, BT)
        ok = t < hi
        tok = tl.minimum(t, hi - 1)  # past the end: the last row again, read as masked
        if PAGED:
            tok = tl.load(table_ptr + row * stride_table + tok)
        tok = tok.to(tl.int64)
        if HAS_START:
            ok = ok & (t >= start)
        if WINDOW:
            ok = ok & (t > qpos - window)
        k_at, v_at = k_at0 + tok * k_st * K_VEC, v_at0 + tok * v_st * V_VEC
        s = _scores(q, q_sum, k_words, k_half, k_at, ok, D, K_BITS, K_G, K_SYM, IEEE)
        m, denom, alpha, p = _softmax_step(s, ok[None, :], m, denom, score_scale, cap_log2,
                                           SOFTCAP)  # fmt: skip
        pv, pz = _values(p, v_words, v_half, v_at, ok, D, V_BITS, V_G, V_SYM,
                         q.dtype, IEEE)  # fmt: skip
        acc = acc * alpha[:, None] + pv
        acc_z = acc_z * alpha + pz
    return m, denom, acc + acc_z[:, None]


@triton.jit
def _tail_part(q, kt_base, vt_base, kt_st, vt_st, tail_len, packed, start, qpos, window,
               score_scale, cap_log2, D: tl.constexpr, BT: tl.constexpr,
               HAS_START: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
               IEEE: tl.constexpr):  # fmt: skip
    """Online softmax over the unpacked tail ([Tt, D] rows after ``packed`` positions)."""
    QP: tl.constexpr = q.shape[0]
    m = tl.full([QP], -float("inf"), tl.float32)
    denom = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    d = tl.arange(0, D)
    for i0 in range(0, tail_len, BT):
        i = i0 + tl.arange(0, BT)
        ok = i < tail_len
        t = packed + i
        k = tl.load(kt_base + i[:, None] * kt_st + d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(vt_base + i[:, None] * vt_st + d[None, :], mask=ok[:, None], other=0.0)
        if HAS_START:
            ok = ok & (t >= start)
        if WINDOW:
            ok = ok & (t > qpos - window)
        s = _dot(q, tl.trans(k.to(q.dtype)), IEEE)
        m, denom, alpha, p = _softmax_step(s, ok[None, :], m, denom, score_scale, cap_log2,
                                           SOFTCAP)  # fmt: skip
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v.to(q.dtype), IEEE)
    return m, denom, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_words, k_half, v_words, v_half, kt_ptr, vt_ptr, table_ptr, rows_ptr, len_ptr,
    start_ptr, o_ptr, lse_ptr, stride_qb, stride_qh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, kt_sb,
    kt_sh, kt_st, vt_sb, vt_sh, vt_st, stride_table, tail_len, chunk, num_splits, window,
    score_scale, cap_log2, D: tl.constexpr, GROUP: tl.constexpr, QP: tl.constexpr,
    BT: tl.constexpr, K_BITS: tl.constexpr, K_G: tl.constexpr, K_SYM: tl.constexpr,
    K_VEC: tl.constexpr, V_BITS: tl.constexpr, V_G: tl.constexpr, V_SYM: tl.constexpr,
    V_VEC: tl.constexpr, PAGED: tl.constexpr, HAS_START: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr, DOT_IEEE: tl.constexpr, HAS_TAIL: tl.constexpr,
):  # fmt: skip
    b, h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    DT: tl.constexpr = tl.float32 if DOT_IEEE else tl.float16
    r, d = tl.arange(0, QP), tl.arange(0, D)
    q_ok = r < GROUP
    q_at = q_ptr + b64 * stride_qb + (h64 * GROUP + r)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_at, mask=q_ok[:, None], other=0.0).to(tl.float32)
    q = tl.minimum(tl.maximum(q, -_FP16_MAX), _FP16_MAX).to(DT)  # [QP, D]
    packed = tl.load(len_ptr + b)
    start = tl.load(start_ptr + b) if HAS_START else 0
    qpos = packed + tail_len - 1  # the query is the newest position
    base = tl.maximum(qpos - window + 1, 0) if WINDOW else 0  # no key before it is seen
    if not HAS_TAIL or split < num_splits:
        row = tl.load(rows_ptr + b).to(tl.int64) if PAGED else b64
        lo = base + split * chunk
        hi = tl.minimum(lo + chunk, packed)
        k_at0 = (b64 * k_sb + h64 * k_sh) * K_VEC  # int32 words; k_sb is 0 when paged
        v_at0 = (b64 * v_sb + h64 * v_sh) * V_VEC
        q_sum = tl.sum(q.to(tl.float32), 1)
        paired_k: tl.constexpr = K_BITS < 16 and 32 % K_BITS == 0
        q_k = _pair_order(q, K_BITS) if paired_k else q  # the keys' code order
        m, denom, acc = _packed_part(
            q_k, q_sum, k_words, k_half, v_words, v_half, table_ptr, row, k_at0, v_at0, k_st,
            v_st, stride_table, lo, hi, start, qpos, window, score_scale, cap_log2, D, BT,
            K_BITS, K_G, K_SYM, K_VEC, V_BITS, V_G, V_SYM, V_VEC, PAGED, HAS_START, WINDOW,
            SOFTCAP, DOT_IEEE,
        )  # fmt: skip
        if V_BITS < 16 and 32 % V_BITS == 0:  # acc is in the values' code order (pairs)
            acc = _channel_order(acc, V_BITS)
    else:  # the tail's own program
        kt_base = kt_ptr + b64 * kt_sb + h64 * kt_sh
        vt_base = vt_ptr + b64 * vt_sb + h64 * vt_sh
        m, denom, acc = _tail_part(
            q, kt_base, vt_base, kt_st, vt_st, tail_len, packed, start, qpos, window,
            score_scale, cap_log2, D, BT, HAS_START, WINDOW, SOFTCAP, DOT_IEEE,
        )  # fmt: skip
    seen = denom > 0
    out = acc / tl.where(seen, denom, 1.0)[:, None]
    lse = tl.where(seen, m + tl.log2(tl.where(seen, denom, 1.0)), -float("inf"))
    parts = tl.num_programs(2)
    at = ((b64 * tl.num_programs(1) + h64) * GROUP + r) * parts + split  # [B, Hq, parts]
    tl.store(lse_ptr + at, lse, mask=q_ok)
    tl.store(o_ptr + at[:, None] * D + d[None, :], out, mask=q_ok[:, None])


@dataclass(frozen=True)
class DecodePlan:
    """How one decode launch is cut: packed-token splits, tokens a tile, Triton's warps and
    pipeline stages (None: Triton's default)."""

    splits: int
    block_tokens: int = 32
    num_warps: int = 4
    num_stages: int | None = 2

    def __post_init__(self) -> None:
        bt = self.block_tokens
        if self.splits < 1 or bt < 16 or bt & (bt - 1):
            raise ValueError(f"need splits >= 1 and power-of-two block_tokens >= 16: {self}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")


def plan_decode(batch: AttentionBatch, *, sms: int | None = None) -> DecodePlan:
    """Splits from batch × KV heads × context × SMs (``sms`` None: the device's own; on CPU
    the interpreter's 1–2). Tiles as the sm_90 build reads best (``benchmarks/
    kernel_resources.py``): 32 tokens on 4 warps, 2 stages, where rows load 16 bytes at a
    time; else 16 tokens on 8 warps, unpipelined (narrower loads take Triton to layouts that
    cost registers: KV8 g64's 136-byte rows took 244 at 32 tokens on 4 warps)."""
    span, paged = batch.span, batch.slot_table is not None
    if sms is None:
        splits = choose_splits(batch.batch_size, batch.kv_heads, span, batch.q.device)
    else:
        wanted = -(-4 * sms // max(1, batch.batch_size * batch.kv_heads))
        splits = max(1, min(wanted, -(-span // 256), 64))
    if min(_vec(batch.k_rows, paged), _vec(batch.v_rows, paged)) == 4:
        return DecodePlan(splits, block_tokens=32, num_warps=4, num_stages=2)
    return DecodePlan(splits, block_tokens=16, num_warps=8, num_stages=1)


def _vec(rows: torch.Tensor, paged: bool) -> int:
    """Words every row offset is a multiple of: 4 (16-byte loads), 2 or 1; 0: rows are not
    4-byte aligned (no int32 view)."""
    strides = rows.stride()[:-1] if not paged else rows.stride()[:2]
    if rows.shape[-1] % 4:
        return 0
    for vec in (4, 2, 1):
        if rows.data_ptr() % (4 * vec) == 0 and all(s % (4 * vec) == 0 for s in strides):
            return vec
    return 0


def _decodable(spec: QuantSpec, head_dim: int) -> bool:
    """16-bit rows, or token-axis codes: 2/4/8 bits in groups of at least a word's codes
    (32/bits: a word never spans two groups), 3/5/6 bits in whole chunks of 32 channels."""
    if not spec.is_quantized:
        return True
    if spec.axis != "token":
        return False
    if 32 % spec.bits == 0:
        return spec.group_size >= 32 // spec.bits
    return head_dim % 32 == 0


def serves(batch: AttentionBatch) -> bool:
    """Whether :func:`launch_decode` runs this batch: one query token per request (not
    ragged), token-axis (or 16-bit) K and V as :func:`_decodable` says, rows aligned to 4
    bytes, no pre-RoPE keys. The rest (extend, KIVI keys, 2/4/8 bits in groups smaller than a
    word's codes, 3/5/6 bits at a head_dim not a multiple of 32, pre-RoPE keys) runs
    :mod:`.kernel`."""
    paged = batch.slot_table is not None
    return (
        batch.q_tokens == 1
        and batch.qo_indptr is None
        and batch.rope_freq is None
        and batch.k_delta == 0
        and _decodable(batch.k_spec, batch.head_dim)
        and _decodable(batch.v_spec, batch.head_dim)
        and _vec(batch.k_rows, paged) > 0
        and _vec(batch.v_rows, paged) > 0
    )


def _rows_args(rows: torch.Tensor, paged: bool) -> tuple[tuple, int]:
    """(int32 view, fp16 view, stride_b, stride_tok, stride_head in VEC-word units), VEC."""
    vec = _vec(rows, paged)
    strides = (0, rows.stride(0), rows.stride(1)) if paged else rows.stride()[:3]
    if not paged:
        strides = (strides[0], strides[2], strides[1])  # [B, Hkv, T, R]: (b, token, head)
    units = tuple(s // (4 * vec) for s in strides)
    return (rows.view(torch.int32), rows.view(torch.float16), *units), vec


def launch_decode(
    batch: AttentionBatch,
    q: torch.Tensor,
    k_tail: torch.Tensor | None,
    v_tail: torch.Tensor | None,
    plan: DecodePlan,
) -> torch.Tensor:
    """fp32 [B, 1, Hq, D] of a batch :func:`serves`; ``q`` [B, 1, Hq, D] and the tails as the
    kernel reads them (rotated, smoothed), the rest from ``batch``."""
    if not serves(batch):
        raise ValueError("launch_decode: this batch is for the general kernel (see serves())")
    bsz, hq, dim, hkv = batch.batch_size, q.shape[-2], batch.head_dim, batch.kv_heads
    paged, group = batch.slot_table is not None, hq // batch.kv_heads
    chunk, splits = split_chunk(batch, plan.splits, plan.block_tokens)
    tail_len = 0 if k_tail is None else k_tail.shape[2]
    parts = splits + (1 if tail_len else 0)
    dev = q.device
    partial = torch.empty(bsz, hq, parts, dim, dtype=torch.float32, device=dev)
    lse = torch.empty(bsz, hq, parts, dtype=torch.float32, device=dev)
    k_args, k_vec = _rows_args(batch.k_rows, paged)
    v_args, v_vec = _rows_args(batch.v_rows, paged)
    empty = torch.zeros(1, 1, 1, dim, dtype=q.dtype, device=dev)
    k_tail, v_tail = (empty, empty) if k_tail is None else (k_tail, v_tail)
    table = batch.slot_table if paged else batch.lengths  # unused pointers: any int tensor
    rows = batch.table_rows if batch.table_rows is not None else batch.lengths
    if paged and batch.table_rows is None:
        rows = torch.arange(bsz, dtype=torch.int32, device=dev)
    starts = batch.starts if batch.starts is not None else batch.lengths
    k, v = batch.k_spec, batch.v_spec
    tuning = {"num_stages": plan.num_stages} if plan.num_stages else {}
    _decode_kernel[(bsz, hkv, parts)](
        q, k_args[0], k_args[1], v_args[0], v_args[1], k_tail, v_tail, table, rows,
        batch.lengths, starts, partial, lse, q.stride(0), q.stride(2), *k_args[2:], *v_args[2:],
        *k_tail.stride()[:3], *v_tail.stride()[:3], table.stride(0) if paged else 0, tail_len,
        chunk, splits, **softmax_args(batch), D=dim, GROUP=group,
        QP=max(16, triton.next_power_of_2(group)), BT=plan.block_tokens, K_BITS=k.bits,
        K_G=k.group_size, K_SYM=k.symmetric and k.is_quantized, K_VEC=k_vec, V_BITS=v.bits,
        V_G=v.group_size, V_SYM=v.symmetric and v.is_quantized, V_VEC=v_vec, PAGED=paged,
        HAS_START=batch.starts is not None, DOT_IEEE=q.dtype == torch.float32,
        HAS_TAIL=tail_len > 0,
        num_warps=plan.num_warps, **tuning,
    )  # fmt: skip
    return merge_splits(partial, lse, batch.sinks).view(bsz, 1, hq, dim)
