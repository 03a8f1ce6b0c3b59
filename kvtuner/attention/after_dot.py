"""Triton device functions of the scale-after-dot variant of the packed attention kernel
(:mod:`.kernel`, constexprs ``K_AFTER_DOT`` / ``V_AFTER_DOT``).

Token-axis rows hold, per group of G consecutive channels of one token, codes c and an fp16
scale s (and zero z): x = z + s·c (symmetric: x = s·(c - HALF)/HALF, i.e. s' = s/HALF and
z' = -s). Instead of dequantizing every element before ``tl.dot`` (:func:`.tiles._kv_tile`),
the dots run on the raw codes, and s and z are applied once per (query row, token, group):

- scores: q·x_t = Σ_g s_{t,g}·(q_g·c_{t,g}) + z_{t,g}·Σq_g (one 3-D ``tl.dot``, the groups
  its batch dimension);
- values: out_d = Σ_t (p_t·s_{t,g(d)})·c_{t,d} + Σ_t p_t·z_{t,g(d)}; the zero term is a
  [NG, QP] sum, carried beside the accumulator and spread over each group's channels once at
  the end (:func:`_spread_groups`).

Codes become the dot's dtype exactly (integers < 2**BITS): fp16 by the exponent trick
(``code | 0x6400`` read as fp16 is 1024 + code), bf16 by the same trick with ``0x4300``
(128 + code, codes < 128: BITS <= 7), else by a convert. Key codes take q's dtype; value codes
are fp16 on a GPU whatever q is, because p·scale is rounded to the dot's dtype and bf16's 8
bits lost too much of it (up to 0.067 off the reference for Hadamard-rotated 4-bit values with
bf16 queries on an H100, 8-20 of 16384 outputs past the tests' 0.02). Needs G >= 16
(``tl.dot``'s smallest K): the launcher keeps other groups, channel-axis keys, 16-bit rows and
the unpacked tail on the element-wise path (:mod:`.tiles`). The bf16 trick runs on GPUs only
(on CPU the launcher hands the interpreter fp32 queries; its bf16 bitcast is wrong anyway): the
CPU tests compile it for sm_90, ``pytest -m cuda tests/attention`` checks its results.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from ..quant.spec import QuantSpec
from ..quant.triton_codes import load_code_ints, load_fp16
from .tiles import _dot


@triton.jit
def _codes_as(c, dtype: tl.constexpr, BITS: tl.constexpr):
    """int32 codes in [0, 2**BITS) -> ``dtype`` (the dot's), exactly."""
    if dtype == tl.float16:  # 0x6400 is 1024.0: the code lands in the 10 mantissa bits
        return (c | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
    elif dtype == tl.bfloat16 and BITS <= 7:  # 0x4300 is 128.0: 7 mantissa bits
        return (c | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - 128.0
    else:
        return c.to(dtype)


@triton.jit
def _group_tile(ptr, off, md, ok, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
                SYM: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """Packed rows at ``ptr + off`` ([BT] byte offsets, ``ok`` masks them; scales ``md``
    bytes after the codes) -> codes in
    ``dtype`` (the dot's) [BT, NG, G], scale and zero fp32 [NG, BT]: x = zero + scale·code
    (symmetric rows too)."""
    BT: tl.constexpr = off.shape[0]
    NB: tl.constexpr = D * BITS // 8
    NG: tl.constexpr = D // G
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    src = ptr + off
    codes = tl.reshape(load_code_ints(src, ok, NB, D // 8, BITS), [BT, NG, G])
    meta = src[None, :] + md + 2 * tl.arange(0, NG)[:, None]  # [NG, BT] fp16 scale bytes
    scale = load_fp16(meta, ok[None, :])
    if SYM:  # s·(c - HALF)/HALF = (s/HALF)·c - s
        zero = -scale
        scale = tl.math.div_rn(scale, HALF * 1.0)
    else:
        zero = load_fp16(meta + 2 * NG, ok[None, :])
    return _codes_as(codes, dtype, BITS), scale, zero


@triton.jit
def _query_groups(q, G: tl.constexpr):
    """q [QP, D] -> its groups [NG, QP, G] (q's dtype, for the batched dot) and their sums
    fp32 [NG, QP] (what each key's zero multiplies). Once per program."""
    QP: tl.constexpr = q.shape[0]
    NG: tl.constexpr = q.shape[1] // G
    q_g = tl.permute(tl.reshape(q, [QP, NG, G]), (1, 0, 2))
    return q_g, tl.sum(q_g.to(tl.float32), 2)


@triton.jit
def _group_scores(q_g, q_sum, codes, scale, zero, IEEE: tl.constexpr):
    """Raw scores fp32 [QP, BT] of q's groups q_g [NG, QP, G] (sums q_sum [NG, QP]) against
    key codes [BT, NG, G] with scale/zero [NG, BT]: Σ_g scale·(q_g·codes) + zero·Σq_g."""
    dots = _dot(q_g, tl.permute(codes, (1, 2, 0)), IEEE)  # [NG, QP, BT]
    return tl.sum(dots * scale[:, None, :] + q_sum[:, :, None] * zero[:, None, :], 0)


@triton.jit
def _group_values(p, codes, scale, zero, IEEE: tl.constexpr):
    """Probabilities p fp32 [QP, BT] times value codes [BT, NG, G] (scale/zero [NG, BT]) ->
    the codes' part fp32 [QP, D] (p scaled per group, then one batched dot) and the zeros'
    part fp32 [NG, QP] (Σ_t p·zero: added to every channel of the group, by the caller)."""
    QP: tl.constexpr = p.shape[0]
    NG: tl.constexpr = codes.shape[1]
    D: tl.constexpr = NG * codes.shape[2]
    ps = (p[None, :, :] * scale[:, None, :]).to(codes.dtype)  # [NG, QP, BT]
    pv = _dot(ps, tl.permute(codes, (1, 0, 2)), IEEE)  # [NG, QP, G]
    pz = tl.sum(p[None, :, :] * zero[:, None, :], 2)  # [NG, QP]
    return tl.reshape(tl.permute(pv, (1, 0, 2)), [QP, D]), pz


@triton.jit
def _spread_groups(acc_z, G: tl.constexpr):
    """Zero sums [NG, QP] -> [QP, NG·G]: each group's sum on each of its G channels."""
    NG: tl.constexpr = acc_z.shape[0]
    QP: tl.constexpr = acc_z.shape[1]
    wide = tl.broadcast_to(tl.trans(acc_z)[:, :, None], [QP, NG, G])
    return tl.reshape(wide, [QP, NG * G])


ENV = "KVTUNER_SCALE_AFTER_DOT"  # "1": the launcher's default variant is scale-after-dot


def wanted(scale_after_dot: bool | None) -> bool:
    """The variant asked for: the argument, or where it is None the environment variable."""
    if scale_after_dot is not None:
        return bool(scale_after_dot)
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def takes_after_dot(spec: QuantSpec, on: bool) -> bool:
    """Whether one operand's packed rows run scale-after-dot when ``on``: quantized token-axis
    rows with groups of >= 16 channels (``tl.dot``'s smallest K); every bit width qualifies."""
    return on and spec.is_quantized and spec.axis == "token" and spec.group_size >= 16
