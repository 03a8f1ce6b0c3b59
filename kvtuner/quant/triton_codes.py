"""Triton device functions of the packed format, shared by the pool kernels
(:mod:`.triton_kernels`) and the attention kernels (:mod:`kvtuner.attention.tiles`): fp16
metadata stored and loaded as int16 bits (directed rounding, the format's NaN), and codes packed
into / read from a row's little-endian bit stream, or 3/5/6-bit codes' two (low and high
planes: :func:`kvtuner.quant.packing.pack_codes`).
Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "NAN_FP16",
    "chunks_readable",
    "fp16_directed",
    "fp16_value",
    "grid_codes",
    "hadamard_tile",
    "high_shifts",
    "load_code_ints",
    "load_chunk_codes",
    "load_chunk_meta",
    "load_codes",
    "load_fp16",
    "load_group_meta",
    "low_bits",
    "store_codes",
    "store_fp16",
    "store_group_meta",
]

NAN_FP16 = tl.constexpr(0x7E00)  # the format's NaN: what torch stores for float("nan").half()


@triton.jit
def fp16_value(bits):
    """fp16 bits (int16, or an int32's low 16) -> fp32."""
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def fp16_directed(v, UP: tl.constexpr):
    """fp32 [..] -> fp32 holding the smallest fp16 >= v (UP) or largest fp16 <= v; zero is +0."""
    r = v.to(tl.float16)
    bits = r.to(tl.int16, bitcast=True).to(tl.int32)
    is_zero = r == 0.0
    if UP:
        wrong = r.to(tl.float32) < v
        step = tl.where(bits >= 0, 1, -1)  # sign bit clear: magnitude up; set: magnitude down
        nxt = tl.where(is_zero, 1, bits + step)
    else:
        wrong = r.to(tl.float32) > v
        step = tl.where(bits >= 0, -1, 1)
        nxt = tl.where(is_zero, -32767, bits + step)  # -32767 = 0x8001, -smallest subnormal
    bits = tl.where(wrong, nxt, bits)
    out = fp16_value(bits)
    return tl.where(out == 0.0, 0.0, out)


@triton.jit
def grid_codes(x, AXIS: tl.constexpr, BITS: tl.constexpr, SYMMETRIC: tl.constexpr):
    """Groups of fp32 ``x`` running along ``AXIS`` on the reference's grid (``_group_grid``):
    codes (int32, x's shape), fp16-exact scale and zero (zero = scale when symmetric: unused)
    and ``ok``. A non-finite input, or metadata beyond fp16, poisons its group: not ok, codes
    0. The group's min and max propagate NaN (:func:`_nan_min`), so a group is finite where
    they are, with no test of each element (at sm_90a, the per-element ``x == x``,
    ``|x| < inf`` and select took a quarter of KV4 g32 pack's instructions). The reference's
    clamp changes no code here: zero <= x <= zero + QMAX·scale (scale rounded up), so
    (x - zero)·(1/scale) + 0.5 lies in [0.5, QMAX + 0.5 + QMAX·2^-23) and its truncation is
    its floor; symmetric |x|·(1/amax) <= 1 + 2^-23 likewise."""
    QMAX: tl.constexpr = (1 << BITS) - 1
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    if SYMMETRIC:
        amax = tl.reduce(tl.abs(x), AXIS, _nan_max)  # NaN or inf: the group is poisoned
        scale = fp16_directed(amax, True)
        zero = scale
        ok = (amax < float("inf")) & (scale < float("inf"))
        inv = tl.expand_dims(tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), AXIS)
        ratio = tl.where(tl.expand_dims(scale, AXIS) > 0, x * inv, 0.0)
        q = tl.floor(ratio * HALF + 0.5) + HALF  # in [0, 2·HALF]
    else:
        lo, hi = tl.reduce(x, AXIS, _nan_min), tl.reduce(x, AXIS, _nan_max)
        zero = fp16_directed(lo, False)
        scale = fp16_directed(tl.math.div_rn(hi - zero, QMAX * 1.0), True)
        ok = (tl.abs(hi) < float("inf")) & (tl.abs(zero) < float("inf")) & (scale < float("inf"))
        inv = tl.expand_dims(tl.math.div_rn(1.0, tl.where(scale > 0, scale, 1.0)), AXIS)
        q = (x - tl.expand_dims(zero, AXIS)) * inv + 0.5  # >= 0.5: truncation is floor
    return tl.where(tl.expand_dims(ok, AXIS), q, 0.0).to(tl.int32), scale, zero, ok


@triton.jit
def _nan_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def hadamard_tile(t, D: tl.constexpr):
    """t fp32 [ROWS, D/8, 8] times the orthonormal Sylvester Hadamard matrix (D a power of two,
    the reference's ``hadamard(D)``): log2(D) add/subtract butterflies in registers, then one
    multiply by 1/sqrt(D), in the reference's order (``times_hadamard``): the same bytes. The
    [D, D] fp32 ``tl.dot`` this replaces held the matrix in registers (pack at 0.002x
    ``clone()`` on an H100)."""
    ROWS: tl.constexpr = t.shape[0]
    x = tl.reshape(t, [ROWS, D])
    for stage in tl.static_range(16):  # stage s pairs channels i and i + 2^s
        if (1 << stage) < D:
            pairs = tl.reshape(x, [ROWS, D // (2 << stage), 2, 1 << stage])
            pairs = tl.permute(pairs, (0, 1, 3, 2))
            a, b = tl.split(pairs)  # [ROWS, D / 2^(s+1), 2^s] each
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), [ROWS, D])
    return tl.reshape(x * (1.0 / (D**0.5)), [ROWS, D // 8, 8])


@triton.jit
def store_fp16(ptr, value, ok, mask, HALVES: tl.constexpr = False):
    """Store fp32 ``value`` [BLOCK] (fp16-exact) as 2 little-endian bytes; NaN where not ``ok``.
    ``HALVES``: every ``ptr`` is even, so each value is one 2-byte store, not two byte stores."""
    bits = value.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    bits = tl.where(ok, bits, NAN_FP16)
    if HALVES:
        tl.store(ptr.to(tl.pointer_type(tl.int16)), bits.to(tl.int16), mask=mask)
    else:
        tl.store(ptr, (bits & 0xFF).to(tl.uint8), mask=mask)
        tl.store(ptr + 1, ((bits >> 8) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def meta_offset(h, heads, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
                SYM: tl.constexpr, PLANES: tl.constexpr, UNIT: tl.constexpr):  # fmt: skip
    """From KV head h's codes to its scales and zeros, in ``UNIT``-byte units (1: bytes, 4:
    int32 words): a row's code bytes; in a pool of planes (:mod:`.planes`) the slot's codes of
    every head (``heads`` of them: the kernels' grid axis of one program a KV head), then head
    h's metadata."""
    C: tl.constexpr = D * BITS // 8
    if PLANES:
        M: tl.constexpr = D // G * (2 if SYM else 4)
        off = heads.to(tl.int64) * (C // UNIT) + h * ((M - C) // UNIT)
    else:
        off = C // UNIT
    return off


@triton.jit
def load_fp16(ptr, mask):
    """2 little-endian bytes at ``ptr`` [..] -> fp32."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.int32)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.int32)
    bits = (hi << 8) | lo
    return fp16_value(bits)


@triton.jit
def _meta_bytes(src, row_ok, NB: tl.constexpr, NG: tl.constexpr, SIDES: tl.constexpr):
    """Pointers and mask [BLOCK, SIDES * NG * 2] of a row's metadata bytes (scales, then zeros
    when SIDES = 2): contiguous, masked by row alone, so they move as one vector a row."""
    j = tl.arange(0, SIDES * NG * 2)
    return src[:, None] + NB + j[None, :], row_ok[:, None] & (j >= 0)[None, :]


@triton.jit
def _meta_halves(src, row_ok, NB: tl.constexpr, NG: tl.constexpr, SIDES: tl.constexpr):
    """:func:`_meta_bytes` as int16 pointers [BLOCK, SIDES * NG], where the metadata start
    2-byte aligned: a row's fp16 stored whole, not split into bytes (loads gain nothing: the
    sm_90a build joins the byte loads itself)."""
    j = tl.arange(0, SIDES * NG)
    halves = (src + NB).to(tl.pointer_type(tl.int16))
    return halves[:, None] + j[None, :], row_ok[:, None] & (j >= 0)[None, :]


@triton.jit
def load_group_meta(src, row_ok, NB: tl.constexpr, NG: tl.constexpr, SYMMETRIC: tl.constexpr,
                    WORDS: tl.constexpr = False):  # fmt: skip
    """A row's fp16 scales and zeros (zero = scale when symmetric) -> fp32 [BLOCK, NG] each, in
    one vector load a row (NG a power of two; :func:`load_fp16` reads two bytes at a time).
    ``WORDS``: they start 4-byte aligned; one scale and zero a row then load as one int32
    word (a row over 4 threads read it a byte a thread; 8 bytes of KV8 g64 as two words took
    48 registers in its unpack's sm_90a build, not 32)."""
    BLOCK: tl.constexpr = row_ok.shape[0]
    SIDES: tl.constexpr = 1 if SYMMETRIC else 2
    if WORDS and SIDES * NG == 2:
        j = tl.arange(0, SIDES * NG // 2)
        at = (src + NB).to(tl.pointer_type(tl.int32))[:, None] + j[None, :]
        w = tl.load(at, mask=row_ok[:, None] & (j >= 0)[None, :], other=0)
        lo, hi = w & 0xFFFF, (w >> 16) & 0xFFFF  # [BLOCK, SIDES * NG / 2] each
        bits = tl.reshape(tl.join(lo, hi), [BLOCK, SIDES * NG])
    else:
        at, ok = _meta_bytes(src, row_ok, NB, NG, SIDES)
        b = tl.load(at, mask=ok, other=0).to(tl.int32)
        lo, hi = tl.split(tl.reshape(b, [BLOCK, SIDES * NG, 2]))
        bits = (hi << 8) | lo
    v = fp16_value(bits)
    if SYMMETRIC:  # (an early return here failed to compile for sm_80)
        scale, zero = v, v
    else:
        scale, zero = tl.split(tl.permute(tl.reshape(v, [BLOCK, 2, NG]), (0, 2, 1)))
    return scale, zero


@triton.jit
def store_group_meta(dst, scale, zero, ok, row_ok, NB: tl.constexpr, SYMMETRIC: tl.constexpr,
                     HALVES: tl.constexpr):  # fmt: skip
    """Inverse of :func:`load_group_meta`: fp32 ``scale``/``zero`` [BLOCK, NG] (fp16-exact;
    NaN where not ``ok``) as one vector store a row."""
    BLOCK: tl.constexpr = scale.shape[0]
    NG: tl.constexpr = scale.shape[1]
    SIDES: tl.constexpr = 1 if SYMMETRIC else 2
    bits = tl.where(ok, scale.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32), NAN_FP16)
    if not SYMMETRIC:
        zbits = zero.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        zbits = tl.where(ok, zbits, NAN_FP16)
        bits = tl.reshape(tl.permute(tl.join(bits, zbits), (0, 2, 1)), [BLOCK, 2 * NG])
    if HALVES:
        at, mask = _meta_halves(dst, row_ok, NB, NG, SIDES)
        tl.store(at, bits.to(tl.int16), mask=mask)
    else:
        b = tl.reshape(tl.join(bits & 0xFF, (bits >> 8) & 0xFF), [BLOCK, SIDES * NG * 2])
        at, mask = _meta_bytes(dst, row_ok, NB, NG, SIDES)
        tl.store(at, b.to(tl.uint8), mask=mask)


@triton.jit
def _code_bytes_ok(row_ok, j, NB: tl.constexpr):
    """Mask [BLOCK, NB_PAD] of a row's code bytes j: by row alone where no byte is padding, so
    the bytes of a row load and store as one vector (16 bytes where the rows' offsets are)."""
    if NB == j.shape[0]:  # noqa: SIM300 (constexpr first, as the other branches)
        ok = row_ok[:, None] & (j >= 0)[None, :]
    else:
        ok = row_ok[:, None] & (j < NB)[None, :]
    return ok


@triton.constexpr_function
def low_bits(bits: int) -> int:
    """Bits of a code in its row's first stream: all of 2/4/8-bit codes; the low plane's 2, 4
    or 4 of 3/5/6-bit ones: :func:`~.packing.split_bits`, written out (Triton's compiler takes
    no call of a plain function here)."""
    return bits if 8 % bits == 0 else (2 if bits == 3 else 4)


@triton.jit
def high_shifts(K: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """int32 [K, 32/high]: the bit of high-plane word k where the high bits of its r-th code (in
    channel order) sit (:func:`kvtuner.quant.packing.high_order`): ``16·h + low·j + high·e``
    for r = P·e + (P/2)·h + j in the words the row fills, ``high·r`` in the last one it does
    not (K: the tile's words, past the row's too)."""
    HIGH: tl.constexpr = BITS - low_bits(BITS)
    return _high_shift(tl.arange(0, K)[:, None], tl.arange(0, 32 // HIGH)[None, :], D, BITS)


@triton.jit
def _high_shift(k, r, D: tl.constexpr, BITS: tl.constexpr):
    """:func:`high_shifts` of words k and codes r (int32 tensors that broadcast together)."""
    LOW: tl.constexpr = low_bits(BITS)
    HIGH: tl.constexpr = BITS - LOW
    P: tl.constexpr = 32 // LOW  # codes a low-plane word
    paired = 16 * ((r % P) // (P // 2)) + LOW * (r % (P // 2)) + HIGH * (r // P)
    return tl.where(k < D // (32 // HIGH), paired, HIGH * r)


@triton.jit
def store_codes(dst, q, row_ok, NB: tl.constexpr, BITS: tl.constexpr):
    """Codes q int32 [BLOCK, NW_PAD, 8] -> a row's NB code bytes at ``dst`` [BLOCK]: 2/4/8 bits
    as one little-endian stream (code i at stream bits [i*BITS, (i+1)*BITS)), 3/5/6 bits as
    its low plane and high plane (:func:`kvtuner.quant.packing.pack_codes`)."""
    if 8 % BITS == 0:
        _store_stream(dst, q, row_ok, NB, BITS)
    else:
        BLOCK: tl.constexpr = q.shape[0]
        NW_PAD: tl.constexpr = q.shape[1]
        LOW: tl.constexpr = low_bits(BITS)
        HIGH: tl.constexpr = BITS - LOW
        D: tl.constexpr = NB * 8 // BITS
        LOW_NB: tl.constexpr = D * LOW // 8
        _store_stream(dst, q & ((1 << LOW) - 1), row_ok, LOW_NB, LOW)
        if D < 32 // HIGH:  # no whole high word: channel order
            _store_stream(dst + LOW_NB, q >> LOW, row_ok, NB - LOW_NB, HIGH)
        else:
            K: tl.constexpr = NW_PAD * 8 * HIGH // 32  # the tile's high words
            high = tl.reshape(q >> LOW, [BLOCK, K, 32 // HIGH])
            word = tl.sum(high << high_shifts(K, D, BITS)[None], axis=2)  # [BLOCK, K]
            byte = (word[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF
            j = tl.arange(0, K * 4)
            at = dst[:, None] + LOW_NB + j[None, :]
            ok = _code_bytes_ok(row_ok, j, NB - LOW_NB)
            tl.store(at, tl.reshape(byte, [BLOCK, K * 4]).to(tl.uint8), mask=ok)


@triton.jit
def _store_stream(dst, q, row_ok, NB: tl.constexpr, BITS: tl.constexpr):
    """Codes q int32 [BLOCK, NW_PAD, 8] of 1/2/4/8 bits -> their little-endian stream's NB
    bytes at ``dst`` [BLOCK], in int32 bytes of whole codes (the tile reshaped to [BLOCK,
    bytes, codes a byte])."""
    BLOCK: tl.constexpr = q.shape[0]
    NW_PAD: tl.constexpr = q.shape[1]
    P: tl.constexpr = 8 // BITS
    c = tl.reshape(q, [BLOCK, NW_PAD * BITS, P])
    packed = tl.sum(c << (tl.arange(0, P) * BITS)[None, None, :], axis=2)
    j = tl.arange(0, NW_PAD * BITS)  # [NB_PAD] byte index
    tl.store(dst[:, None] + j[None, :], packed.to(tl.uint8), mask=_code_bytes_ok(row_ok, j, NB))


@triton.jit
def load_code_ints(src, row_ok, NB: tl.constexpr, NW_PAD: tl.constexpr, BITS: tl.constexpr):
    """Inverse of :func:`store_codes`: codes as int32 [BLOCK, NW_PAD, 8] in ``[0, 2**BITS)``
    (for callers that convert them their own way, e.g. by the fp16 exponent trick)."""
    if 8 % BITS == 0:
        q = _load_stream(src, row_ok, NB, NW_PAD, BITS)
    else:
        BLOCK: tl.constexpr = row_ok.shape[0]
        LOW: tl.constexpr = low_bits(BITS)
        HIGH: tl.constexpr = BITS - LOW
        D: tl.constexpr = NB * 8 // BITS
        LOW_NB: tl.constexpr = D * LOW // 8
        q = _load_stream(src, row_ok, LOW_NB, NW_PAD, LOW)
        if D < 32 // HIGH:  # no whole high word: channel order
            high = _load_stream(src + LOW_NB, row_ok, NB - LOW_NB, NW_PAD, HIGH)
        else:
            K: tl.constexpr = NW_PAD * 8 * HIGH // 32
            j = tl.arange(0, K * 4)
            at = src[:, None] + LOW_NB + j[None, :]
            b = tl.load(at, mask=_code_bytes_ok(row_ok, j, NB - LOW_NB), other=0)
            b = tl.reshape(b.to(tl.int32), [BLOCK, K, 4])
            word = tl.sum(b << (tl.arange(0, 4) * 8)[None, None, :], axis=2)  # [BLOCK, K]
            high = (word[:, :, None] >> high_shifts(K, D, BITS)[None]) & ((1 << HIGH) - 1)
            high = tl.reshape(high, [BLOCK, NW_PAD, 8])
        q = q | (high << LOW)
    return q


@triton.jit
def _load_stream(src, row_ok, NB: tl.constexpr, NW_PAD: tl.constexpr, BITS: tl.constexpr):
    """Inverse of :func:`_store_stream`: codes int32 [BLOCK, NW_PAD, 8]."""
    BLOCK: tl.constexpr = row_ok.shape[0]
    P: tl.constexpr = 8 // BITS
    j = tl.arange(0, NW_PAD * BITS)
    b = tl.load(src[:, None] + j[None, :], mask=_code_bytes_ok(row_ok, j, NB), other=0)
    q = (b.to(tl.int32)[:, :, None] >> (tl.arange(0, P) * BITS)[None, None, :]) & ((1 << BITS) - 1)
    return tl.reshape(q, [BLOCK, NW_PAD, 8])


@triton.constexpr_function
def chunks_readable(bits: int, group: int, head_dim: int, align: int) -> bool:
    """Whether :func:`load_chunk_codes` reads rows of ``bits``-bit codes in groups of
    ``group`` at ``head_dim`` whose offsets are multiples of ``align`` bytes: whole groups of
    chunks, each chunk (3/5/6 bits: its low plane's, and the high plane's words) aligned to
    its size."""
    if group % 8 or bits >= 16:
        return False
    if 8 % bits == 0:
        return align % bits == 0
    low = low_bits(bits)
    return head_dim >= 32 // (bits - low) and align % 4 == 0 and head_dim * low // 8 % 4 == 0


@triton.constexpr_function
def chunk_type(bits: int):
    """The integer type of a chunk of 8 codes of ``bits`` (2/4/8) bits: ``bits`` bytes (3/5/6:
    their low plane's, ``low_bits``)."""
    return {2: tl.int16, 4: tl.int32, 8: tl.int64}[bits]


@triton.jit
def load_chunk_codes(src, row_ok, NW: tl.constexpr, NW_PAD: tl.constexpr, BITS: tl.constexpr):
    """Codes of the rows at ``src`` [BLOCK] (:func:`chunks_readable`) -> int32 [BLOCK, NW_PAD,
    8], a chunk of 8 codes (one ``BITS``-byte integer; 3/5/6 bits: the low plane's, and the
    high plane's word that holds their high bits) a thread, so that the tile needs no layout
    change to be stored as 16-byte runs of 8 bf16 a thread. Loaded as one vector a row,
    Triton gives a thread 16 bytes (32 codes) and changes layout through shared memory before
    such a store (sm_90a unpack KV4 g32: 5 shared loads, 3 stores, 3 barriers a program: the
    H200's MIO stalls). The hint keeps Triton from joining chunks into wider vectors; the
    chunk's [.., .., 1] axis, shared with :func:`load_chunk_meta`, gives both loads one layout
    (a chunk's halves in an axis of their own took another, and the rows' slots were loaded
    once for each)."""
    w = tl.arange(0, NW_PAD)
    at = w[None, :, None] + tl.arange(0, 1)[None, None, :]  # [1, NW_PAD, 1]
    ok = row_ok[:, None, None] & (at < NW)
    chunk = src.to(tl.pointer_type(chunk_type(low_bits(BITS))))
    c = _chunk_load(chunk[:, None, None] + at, ok)
    i = tl.arange(0, 8)[None, None, :]  # a code's place in its chunk
    if 8 % BITS:  # 3/5/6 bits: c is the low plane's chunk
        LOW: tl.constexpr = low_bits(BITS)
        low = (c.to(tl.int32) >> (i * LOW)) & ((1 << LOW) - 1)
        return low | (_high_codes(src + NW * LOW, ok, at, NW * 8, BITS) << LOW)
    if BITS == 8:  # the int64's two words, each shifted in 32 bits
        lo, hi = c.to(tl.int32), (c >> 32).to(tl.int32)
        return (tl.where(i < 4, lo, hi) >> ((i % 4) * 8)) & 255
    return ((c >> (i * BITS)) & ((1 << BITS) - 1)).to(tl.int32)


@triton.jit
def _high_codes(high_src, ok, at, D: tl.constexpr, BITS: tl.constexpr):
    """The high bits [BLOCK, NW_PAD, 8] of chunks ``at`` [1, NW_PAD, 1] of 3/5/6-bit rows
    whose high plane starts at ``high_src`` [BLOCK] (4-byte aligned): each chunk's word of the
    plane, shifted by the chunk's place in it (a register), then by each code's (constants:
    code 8c + i sits at the shift of code 8c plus that of code i)."""
    HIGH: tl.constexpr = BITS - low_bits(BITS)
    W: tl.constexpr = 32 // HIGH  # codes a high word
    word = _chunk_load(high_src.to(tl.pointer_type(tl.int32))[:, None, None] + at * HIGH // 4, ok)
    i = tl.arange(0, 8)[None, None, :]
    step = _high_shift(0, i, D, BITS)
    if D % W:  # a last word the row does not fill: its codes in channel order
        step = tl.where(at * 8 // W < D // W, step, HIGH * i)
    word = word >> _high_shift(at * 8 // W, at * 8 % W, D, BITS)
    return (word >> step) & ((1 << HIGH) - 1)


@triton.jit
def load_chunk_meta(meta_src, row_ok, NW_PAD: tl.constexpr, G: tl.constexpr, NG: tl.constexpr,
                    SYMMETRIC: tl.constexpr):  # fmt: skip
    """The fp16 scale and zero (zero = scale when symmetric) of each chunk's group, a row's
    at ``meta_src`` [BLOCK] (2-byte aligned) -> fp32 [BLOCK, NW_PAD, 1] each, in the layout of
    :func:`load_chunk_codes`: a thread loads its chunk's (a group's threads read the same
    halves)."""
    g = (tl.arange(0, NW_PAD) * 8 // G)[None, :, None] + tl.arange(0, 1)[None, None, :]
    halves = meta_src.to(tl.pointer_type(tl.int16))[:, None, None] + g  # [BLOCK, NW_PAD, 1]
    ok = row_ok[:, None, None] & (g < NG)
    scale = fp16_value(_chunk_load(halves, ok))
    zero = scale if SYMMETRIC else fp16_value(_chunk_load(halves + NG, ok))
    return scale, zero


@triton.jit
def _chunk_load(ptrs, mask):
    """Load ``ptrs`` [BLOCK, NW_PAD, 1] (a value a row's chunk; ``mask`` of the same shape or
    broadcast to it) as one axis of BLOCK·NW_PAD, a row's chunks consecutive, -> [BLOCK, NW_PAD,
    1]. Triton lays a load's threads along its most contiguous axis, and where two tie (here
    the rows and the chunks) 3.6 takes the first, 3.9 the last: on one axis a warp's lanes
    take a row's chunks in turn under both (sm_90a unpack KV4 g32, Triton 3.6: 32 rows a
    load or store, 4 or 16 bytes of each, before)."""
    F: tl.constexpr = ptrs.shape[0] * ptrs.shape[1]
    at = tl.max_contiguous(tl.reshape(ptrs, [F, 1]), [1, 1])
    ok = tl.reshape(tl.broadcast_to(mask, ptrs.shape), [F, 1])
    return tl.reshape(tl.load(at, mask=ok, other=0), ptrs.shape)


@triton.jit
def load_codes(src, row_ok, NB: tl.constexpr, NW_PAD: tl.constexpr, BITS: tl.constexpr):
    """Inverse of :func:`store_codes`: codes as fp32 [BLOCK, NW_PAD, 8]."""
    return load_code_ints(src, row_ok, NB, NW_PAD, BITS).to(tl.float32)
