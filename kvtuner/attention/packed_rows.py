"""Packed token-axis rows read in registers: Triton device functions shared by the decode and
extend kernels (:mod:`.decode_kernel`, :mod:`.extend_kernel`), and the host checks of which
rows they read.

Rows are read through an int32 view (codes) and an fp16 view (scales, zeros) of the same bytes,
at word offsets; every row offset is a multiple of ``VEC`` words (the launcher passes strides in
``VEC``-word units), so Triton loads 16 bytes at a time where rows allow (``VEC = 4``).
- codes become fp16 by the exponent trick (``code | 0x6400`` read as fp16 is 1024 + code) and
  dequantize in one fp16 ``fma`` an element; the dots run in fp16 (q, p and codes), scores and
  the softmax in fp32. Under the CPU interpreter q is fp32 (``IEEE``): everything stays fp32;
- codes come out two at a time in *pair order* (:func:`row_codes`): q is put in
  that order once (:func:`pair_order`) and a value result taken back once
  (:func:`channel_order`); decode's value tiles go on to the MMA's own order
  (:func:`value_lanes`);
- one scale and zero per token-head (``group_size == head_dim``) skips the element-wise
  dequantization: ``q·x_t = scale_t·(q·c_t) + zero_t·Σq`` and ``Σ_t p_t·x_t = Σ_t (p_t·scale_t)·
  c_t + Σ_t p_t·zero_t`` (one dot each, two multiply-adds a token);
- a tile reads only rows some query of its program attends (a window's start, a left pad's
  end, are where the tiles begin) and, past the end, the last such row again: loads need no
  mask, and scales and zeros none either (a NaN row outside every window stays unread);
- pre-RoPE keys (decode) are read in spans of channels (:func:`key_spans`: the two rotary
  halves and a pass-through), each dequantized on its own and turned element-wise to its
  token's position before one dot a span (:func:`rope_scores`; :mod:`.rope_rows` says why).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..quant.packing import split_bits
from ..quant.spec import QuantSpec
from ..quant.triton_codes import low_bits
from ..quant.triton_kernels import interpreted, triton_version
from .tiles import _pv, _qk, _softmax_step

__all__ = [
    "decodable",
    "dot_operand",
    "keys_decodable",
    "kivi_keys",
    "packed_part",
    "page_tile",
    "pages_decodable",
    "rows_args",
    "table_rows",
    "wide_rows",
]

# the GPU build's lines of PTX (:func:`register_pairs_fma`, :func:`and_or`); none interpreted
INTERPRETED = tl.constexpr(interpreted())
PTX = tl.constexpr(not INTERPRETED)
FP16_MAX = tl.constexpr(65504.0)  # q is clamped to fp16's range before it becomes fp16
# how :func:`row_codes` reads a code c on the fp16 path (:func:`code_unit`, :func:`code_origin`)
EXACT = tl.constexpr(0)  # c: 1024 + c by the exponent trick, the 1024 subtracted
TOP = tl.constexpr(1)  # 1 + c/2**BITS: c at the top of the mantissa under 1.0's exponent
BIASED = tl.constexpr(2)  # 1024 + c, the 1024 left for the caller to take off
# channels a lane holds side by side in a k-step of the MMA's key operand (Triton's kWidth): its
# build of the keys' dot, codes made in registers, takes 4 under Triton 3.6 and 2 under 3.9
# (:func:`key_lanes`)
K_WIDTH = tl.constexpr(4 if triton_version() < (3, 7) else 2)
IN_BYTE = tl.constexpr(3)  # c: read at bit m of its byte (1024 + 2**m·c), one fp16 fma to c
# KIVI pages' 2/4-bit keys read IN_BYTE (:func:`page_rows`): under Triton 3.6 one-warp KIVI K4 g32
# V4 g32 decode built 1092 -> 1014 loop instructions a tile and 218 -> 168 registers (9 -> 12
# programs an SM, sm_90a); 3.9 spilled 96 bytes with it, 26 loads and stores in the loop
PAGES_IN_BYTE = tl.constexpr(triton_version() < (3, 7))


@triton.jit
def dot_operand(x, DT: tl.constexpr):
    """Float values (q, or new tokens in hand; any float dtype) -> ``DT``, the dots' dtype,
    clamped to fp16's range first: on the GPU bf16 becomes fp16 here, not in a torch op."""
    return tl.minimum(tl.maximum(x.to(tl.float32), -FP16_MAX), FP16_MAX).to(DT)


@triton.jit
def row_codes(words_ptr, at, C0: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
              BITS: tl.constexpr, DT: tl.constexpr, READ: tl.constexpr = EXACT,
              TOKEN_PAIRS: tl.constexpr = False, PAIRED_FMA: tl.constexpr = False):  # fmt: skip
    """Codes of channels [C0, C0 + W) of the rows of D codes at int32 word ``at`` [BT] ->
    ``DT`` [BT, W] in *pair order*.

    A row's codes (3/5/6 bits: its low plane's, then its high plane's:
    :func:`~kvtuner.quant.packing.pack_codes`) are little-endian bit streams: low-plane word w
    holds codes ``P·w .. P·w + P - 1`` (P = 32/low bits), code ``P·w + i`` at bits ``[i·low,
    (i+1)·low)``. One shift and one and-or turn a word into two fp16 (exponent trick: ``code |
    0x6400`` is 1024 + code): codes j and j + P/2 of the word, in its low and high half; a
    3/5/6-bit pair's high bits come 16 bits apart from their high-plane word the same way
    (one shift and one and-or more). So position ``P·w + 2j + half`` holds code ``P·w + j +
    half·P/2`` (:func:`pair_order` puts q in that order, :func:`channel_order` takes a
    result back); a word never spans two groups (the launcher's G >= P).
    ``READ`` (fp16; elsewhere codes are exact): ``TOP``, each code shifted to the top of the
    mantissa under 1.0's exponent, read as 1 + code/2**BITS, the caller folding the 1 into its
    zero, element-wise (x = z + s·c = (z - s') + s'·(1 + c/2**BITS), s' = 2**BITS·s:
    :func:`element_read`) or after its dot, in fp32 (:func:`scores`, :func:`values`), so the
    exponent trick's subtraction of 1024 goes (one fp16 operation a pair of codes);
    ``BIASED``, 1024 + code, for a fold after the dot where no shift is saved by the top.
    ``TOKEN_PAIRS`` (4-bit codes read ``TOP``; value tiles, :func:`value_lanes`): each register
    built from two rows, as the MMA pairs a value tile (:func:`_token_paired`).
    ``PAIRED_FMA`` (fp16 codes bound for :func:`register_pairs_fma`): a word's mask and
    exponent one PTX ``lop3`` (:func:`and_or`), its 1024 one ``sub.f16x2`` (:func:`_fp16_pairs`).
    One-warp decode, sm_90a, loop instructions a tile: KV4 g32 852 -> 805 (Triton 3.6: 945 ->
    886), K8V4 871 -> 826, KV4 g32 sym 894 -> 845; KV8 g32 976 -> 879 at 176 registers against
    158 (11 programs an SM against 12). Elsewhere it cost more than it saved: 4-warp d 256
    tiles 152 -> 186 registers (3 programs an SM -> 2), KIVI pages spilled 104 bytes (3.9)."""
    BT: tl.constexpr = at.shape[0]
    LOW: tl.constexpr = low_bits(BITS)
    P: tl.constexpr = 32 // LOW
    AT: tl.constexpr = 10 - BITS if READ == TOP else 0  # the bit each half's code is moved to
    words = tl.load(words_ptr + at[:, None] + C0 // P + tl.arange(0, W // P)[None, :])
    EXPONENT: tl.constexpr = exponent_bits(READ, DT)
    if TOKEN_PAIRS and BITS == 4 and READ == TOP:
        return pair_order(_token_paired(words, AT, EXPONENT), BITS)
    LOP3: tl.constexpr = PAIRED_FMA or READ == BIASED
    start = tl.arange(0, P // 2) * LOW
    if READ == IN_BYTE:
        return tl.reshape(_in_byte_codes(words, start, BITS), [BT, W])
    pairs = _pairs(words, start, LOW, AT, EXPONENT, LOP3)
    if LOW < BITS:  # the high plane's word k holds the high bits of low words E·k .. E·k+E-1
        HIGH: tl.constexpr = BITS - LOW
        E: tl.constexpr = LOW // HIGH
        high = words_ptr + at[:, None] + D // P + C0 * HIGH // 32
        high = tl.load(high + tl.arange(0, W * HIGH // 32)[None, :])  # [BT, W/(P·E)]
        at_e = tl.arange(0, P // 2)[None, :] * LOW + tl.arange(0, E)[:, None] * HIGH  # [E, P/2]
        high = _pairs(tl.reshape(high, [BT, W // (P * E), 1]), at_e, HIGH, AT + LOW)
        pairs = pairs | tl.reshape(high, [BT, W // P, P // 2])
    if DT == tl.float16:  # noqa: SIM300 (a constexpr dtype, not a constant on the left)
        codes = _fp16_pairs(pairs, READ == EXACT, PAIRED_FMA)  # [BT, W/P, P/2, 2]
    else:
        codes = tl.join(pairs & 0xFFFF, pairs >> 16).to(DT)
    return tl.reshape(codes, [BT, W])


@triton.jit
def _pairs(words, start, BITS: tl.constexpr, AT: tl.constexpr, EXPONENT: tl.constexpr = 0,
           LOP3: tl.constexpr = False):  # fmt: skip
    """int32 words [BT, N] (or [BT, N, 1]) -> int32 [BT, N, *start.shape]: the BITS-bit codes
    at bits ``start`` and ``start + 16`` of each word, moved to bits AT and AT + 16, the rest
    ``EXPONENT``'s bits; ``LOP3``: the mask and the exponent in one PTX :func:`and_or` (byte
    codes dotted as 1024 + c, :func:`after_dot_read`: one-warp KV8 g64 decode, sm_90a, 850
    -> 766 loop instructions a tile, Triton 3.6 1058 -> 930; codes for
    :func:`register_pairs_fma`, with :func:`_fp16_pairs`' subtraction in PTX too)."""
    MASK2: tl.constexpr = ((1 << BITS) - 1) * 0x10001 << AT  # a code in each 16-bit half
    up = tl.maximum(AT - start, 0).to(tl.uint32)
    down = tl.maximum(start - AT, 0).to(tl.uint32)
    pairs = (words.to(tl.uint32, bitcast=True)[:, :, None] << up) >> down
    if LOP3:
        return and_or(pairs, MASK2, EXPONENT)
    return (pairs.to(tl.int32, bitcast=True) & MASK2) | EXPONENT


@triton.jit
def _in_byte_codes(words, start, BITS: tl.constexpr):
    """2/4-bit codes read ``IN_BYTE``: int32 words [BT, N] -> fp16 [BT, N, P/2, 2], code
    pair j (bits ``start`` [P/2] and ``start + 16``) as :func:`_pairs` gives it, exact. Each
    word is shifted down only to pair j's byte (one shift a word at 4 bits, none for its low
    byte) and masked where the pair sits in it, m bits up: 1024 + 2**m·c by the exponent
    trick, which one fp16 fma, ·2**-m - 2**(10-m), takes to c (where :func:`_pairs` shifted
    each pair down and subtracted 1024). One-warp KV4 g32 decode, sm_90a: one shift a word of
    keys, not three (:func:`element_read`)."""
    MASK2: tl.constexpr = ((1 << BITS) - 1) * 0x10001
    m = start % 8  # [P/2]
    pairs = words.to(tl.uint32, bitcast=True)[:, :, None] >> (start - m).to(tl.uint32)
    masks = tl.broadcast_to((MASK2 << m)[None, None, :], pairs.shape)
    pairs = and_masks(pairs, masks, 0x64006400)  # [BT, N, P/2]: 1024 + 2**m·c a half
    unit = tl.broadcast_to(((15 - m) * 0x4000400)[None, None, :], pairs.shape)  # 2**-m a half
    # -2**(10-m) a half: its exponent, and the sign bits (0x80008000 as an int32)
    bias = tl.broadcast_to(((25 - m) * 0x4000400 - 0x7FFF8000)[None, None, :], pairs.shape)
    if PTX:
        pairs = tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r",
                                          [pairs, unit, bias], dtype=tl.int32, is_pure=True,
                                          pack=1)  # fmt: skip
        return _fp16_pairs(pairs, False)
    return tl.fma(_fp16_pairs(pairs, False), _fp16_pairs(unit, False), _fp16_pairs(bias, False))


@triton.jit
def _fp16_pairs(pairs, LESS_1024: tl.constexpr, IN_WORD: tl.constexpr = False):
    """int32 ``pairs`` (two fp16 a word) -> fp16 [*pairs.shape, 2] (low half, high half), each
    less 1024 where ``LESS_1024`` (the exponent trick's 1024 + c -> c, exact). ``IN_WORD``
    (codes masked by :func:`and_or`, bound for :func:`register_pairs_fma`): the GPU's build
    takes the 1024 off the word as it is, one ``sub.f16x2`` in PTX, as LLVM no longer paired
    the halves' fp16 subtraction after the PTX mask (Triton 3.9, one-warp KV4 g32 decode:
    64 ``HADD2`` and 64 ``PRMT`` more a tile, 32 bytes spilled). The interpreter subtracts
    after the split, the same result."""
    SUB_IN_PTX: tl.constexpr = LESS_1024 and IN_WORD and PTX
    if SUB_IN_PTX:
        pairs = tl.inline_asm_elementwise(
            "{.reg .b32 t; mov.b32 t, 0x64006400; sub.rn.f16x2 $0, $1, t;}", "=r,r", [pairs],
            dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    codes = tl.join(_fp16_half(pairs, 0), _fp16_half(pairs, 1))
    if LESS_1024 and not SUB_IN_PTX:
        codes = codes - 1024.0
    return codes


@triton.constexpr_function
def exponent_bits(read: int, dtype) -> int:
    """The fp16 exponent :func:`row_codes` puts over each half's code: 1.0 (``TOP``) or
    1024.0 (the exponent trick); none off the fp16 path."""
    if dtype != tl.float16:
        return 0
    return 0x3C003C00 if read == TOP else 0x64006400


@triton.constexpr_function
def _lop3(mask: int | None, bits: int) -> str:
    """PTX ``($1 & mask) | bits``: the mask a constant, or None for operand ``$2``."""
    b = "$2" if mask is None else f"{mask & 0xFFFFFFFF:#x}"
    return f"lop3.b32 $0, $1, {b}, {bits:#x}, 0xEA;"  # (a & b) | c


@triton.jit
def and_or(x, MASK: tl.constexpr, BITS: tl.constexpr):
    """x (32 bits) & MASK | BITS, int32: one ``LOP3`` on the GPU build, named in PTX, whose
    two constants ptxas otherwise re-made in a register before each use (3.9) or split into
    two ``LOP3`` (3.6); the interpreter computes it as written."""
    x = x.to(tl.int32, bitcast=True)
    if PTX and BITS != 0:
        return tl.inline_asm_elementwise(_lop3(MASK, BITS), "=r,r", [x], dtype=tl.int32,
                                         is_pure=True, pack=1)  # fmt: skip
    return (x & MASK) | BITS


@triton.jit
def and_masks(x, masks, BITS: tl.constexpr):
    """:func:`and_or` with a mask each element (int32 ``masks`` shaped as x): one ``LOP3``, the
    mask a register where it differs between lanes."""
    x = x.to(tl.int32, bitcast=True)
    masks = masks.to(tl.int32, bitcast=True)
    if PTX:
        return tl.inline_asm_elementwise(_lop3(None, BITS), "=r,r,r", [x, masks],
                                         dtype=tl.int32, is_pure=True, pack=1)  # fmt: skip
    return (x & masks) | BITS


@triton.constexpr_function
def code_unit(read: int, bits: int) -> int:
    """Code steps a unit of the codes as :func:`row_codes` reads them (``TOP``: 2**bits): the
    factor a scale takes to apply to the codes as read."""
    return 1 << bits if read == TOP else 1


@triton.constexpr_function
def code_origin(read: int) -> float:
    """What a code of 0 reads as (with the scale times :func:`code_unit`, its share of the
    zero to take off): 1.0 on ``TOP``, 1024.0 ``BIASED``, 0 ``EXACT``."""
    if read == TOP:
        return 1.0
    return 1024.0 if read == BIASED else 0.0


@triton.constexpr_function
def after_dot_read(bits: int, dtype) -> int:
    """How raw codes dotted before their scale are read (:func:`scores`, :func:`values`): on the
    fp16 path ``TOP`` (1 + c/2**bits: sub-8-bit codes are shifted anyway), at 8 bits
    ``BIASED`` (1024 + c: the low byte of each half needs no shift; one-warp KV8 g64 decode,
    sm_90a: 893 -> 850 loop instructions a tile, Triton 3.6 1147 -> 1058; its fp32 sums carry
    1024·s·Σ|q|, s a 255th of the range: 5.2e-4 off the reference where ``TOP`` was 5.0e-4);
    exact codes on the interpreter's fp32 path."""
    if dtype != tl.float16:
        return EXACT
    return BIASED if bits == 8 else TOP


@triton.constexpr_function
def element_read(bits: int, dtype, lanes: bool, in_byte: bool = False) -> int:
    """How a tile dequantized element-wise reads its codes (:func:`row_codes`' ``READ``):
    ``TOP`` for 4-bit codes in fp16 read in a lane order where each register's pair of codes
    has a shift of its own (:func:`value_lanes`; in pair order the shift is the lane's, and
    moving codes up or down by a lane's amount took two shifts). One-warp decode, sm_90a:
    KV4 g32 1025 -> 967 loop instructions a tile, the `HADD2`s of its values gone; KV2 g32
    spilled 40 bytes with it, and 8-bit codes would lose an eighth of a step to the folded
    zero. ``IN_BYTE`` for other 2/4-bit codes in fp16 where ``in_byte`` (keys in
    :func:`key_lanes` order, 2-bit values in :func:`value_lanes` order, whole-row pre-RoPE spans
    on one warp, KIVI pages under Triton 3.6): exact codes, one shift a word
    (:func:`_in_byte_codes`; one-warp KV2 g32 decode, sm_90a, 2-bit values: 857 -> 813 loop
    instructions a tile under 3.6, 816 -> 773 under 3.9). Else ``EXACT``."""
    if dtype != tl.float16:
        return EXACT
    if lanes and bits == 4:
        return TOP
    return IN_BYTE if in_byte and (bits == 2 or bits == 4) else EXACT


@triton.jit
def pair_order(x, BITS: tl.constexpr):
    """x [R, D] in channel order -> the pair order of :func:`row_codes` (codes of BITS)."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    P: tl.constexpr = 32 // low_bits(BITS)
    x = tl.permute(tl.reshape(x, [R, D // P, 2, P // 2]), (0, 1, 3, 2))
    return tl.reshape(x, [R, D])


@triton.jit
def channel_order(x, BITS: tl.constexpr):
    """Inverse of :func:`pair_order`."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    P: tl.constexpr = 32 // low_bits(BITS)
    x = tl.permute(tl.reshape(x, [R, D // P, P // 2, 2]), (0, 1, 3, 2))
    return tl.reshape(x, [R, D])


@triton.jit
def value_lanes(x, BITS: tl.constexpr):
    """Values x [BT, D] in pair order -> *value lane order*. The fp16 MMA's B operand (the
    value tile, [BT, D]) gives lane g of each 8 the columns g + 8i of a pair of tokens; in
    this order those columns are the codes of D/(8P) consecutive words of a row (P =
    32/low bits), so each lane dequantizes only the words it reads and the tile reaches the dot
    without a change of layout through shared memory (one-warp KV4 g32 decode, sm_90a: 245
    -> 182 registers, 8 -> 11 programs an SM, shared-memory bytes a tile halved). Identity
    where D is not a multiple of 8P."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    P: tl.constexpr = 32 // low_bits(BITS)
    if D % (8 * P) == 0:
        x = tl.permute(tl.reshape(x, [R, 8, D // (8 * P), P]), (0, 2, 3, 1))
        x = tl.reshape(x, [R, D])
    return x


@triton.jit
def value_channels(x, BITS: tl.constexpr, SPANS: tl.constexpr = 1):
    """Inverse of :func:`value_lanes`, applied to each of x's ``SPANS`` equal spans of
    channels (the groups dotted apart, each tile in lane order on its own)."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    W: tl.constexpr = D // SPANS
    P: tl.constexpr = 32 // low_bits(BITS)
    if W % (8 * P) == 0:
        x = tl.permute(tl.reshape(x, [R * SPANS, W // (8 * P), P, 8]), (0, 3, 1, 2))
        x = tl.reshape(x, [R, D])
    return x


@triton.jit
def key_lanes(x, SPANS: tl.constexpr = 1, WIDTH: tl.constexpr = 0):
    """Raw key codes (or q) x [R, D] in pair order -> *key lane order*, each of its ``SPANS``
    equal spans of channels on its own (the groups dotted apart: :func:`dotted_groups`). The
    fp16 MMA's A operand (the key tile, [BT, D], keys dotted first: :func:`.tiles._qk`) gives
    lane t of each 4 runs of K side-by-side columns, run 4r + t (r < D/4K), K its kWidth
    (``WIDTH``; 0: :data:`K_WIDTH`, the building Triton's); in this order they are runs
    (D/4K)·t + r of the pair order, so each lane reads D/4 channels of whole words of its own
    (one 16-byte load a row at 4 bits, d 128), not one pair of every word of the row, and each
    register's shift is a constant. Raw codes (groups dotted apart, :func:`scores`), or
    2/4/8-bit keys dequantized with :func:`register_pairs_fma` (with ``tl.fma`` LLVM left the
    fp16 ``fma`` unpaired and ptxas swapped each pair's halves before and after it: one-warp KV4
    g32, sm_90a, 967 -> 1053 loop instructions). Identity where a span is not a multiple of
    32 channels. Under Triton 3.6 (K 4) the order for K 2 gave a lane half the pairs of twice
    the words, a shift of the lane's own for each (one-warp decode, sm_90a, loop instructions a
    tile: KV8 g64 847 -> 808, K8V4 884 -> 840, KV4 g32 sym 872 -> 847, KV4 g128 850 -> 838 at
    138 registers against 164). Rotary tiles keep K 2 (:func:`rotary_tile`): at 4, 3.6 built
    KIVI K4 pre-RoPE pages in 2014 against 1884."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    W: tl.constexpr = D // SPANS
    if W % 32 == 0:
        K: tl.constexpr = WIDTH if WIDTH else K_WIDTH
        x = tl.permute(tl.reshape(x, [R * SPANS, 4, W // (4 * K), K]), (0, 2, 1, 3))
        x = tl.reshape(x, [R, D])
    return x


@triton.jit
def row_meta(words_ptr, half_ptr, meta, C0: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
             BITS: tl.constexpr, G: tl.constexpr, SYM: tl.constexpr, DT: tl.constexpr,
             JOINT: tl.constexpr = False, LANES: tl.constexpr = False):  # fmt: skip
    """Scales and zeros of channels [C0, C0 + W) of the rows whose metadata start at word
    ``meta`` [BT] (the codes' word plus :func:`~kvtuner.quant.triton_codes.meta_offset`) ->
    ``DT`` [BT, NG] each (NG the span's groups; 1 where the span lies inside one group), such that
    x = zero + scale·code (symmetric rows: scale/HALF and -scale). Loaded as whole int32
    words where they lie in them (:func:`_meta_words`), so that Triton's pipeline copies them
    ahead like the codes (an fp16 load is 2 bytes, too narrow for an async copy: KV8 g64 and
    one scale a token-head loaded theirs in the loop). Unmasked: every row a tile reads is one
    some query of the program attends, or a re-read of one (:func:`packed_part`). ``JOINT``
    (a span of the whole row): the row's scales and zeros in one copy, not a copy of scales
    and one of zeros (sm_90a, decode, loop instructions a tile: KV8 g64, 4-byte copies to one
    of 8 bytes, 1491 -> 1323; KV4 g32's and KV8 g32's keys, two 8-byte copies to one of 16,
    796 -> 790 and 866 -> 853; the extend kernel, at 255 registers, spilled 8 bytes with it;
    d 256's eight groups, two 16-byte copies, took 4-warp Gemma 3 tiles to 184 registers).
    ``LANES``: each group's scale and zero read
    from its own whole word (:func:`_meta_halves`), for a tile in :func:`value_lanes` order,
    where a lane holds one group of a token (their join of a word's halves changed layout
    through shared memory every tile)."""
    NG: tl.constexpr = (W + G - 1) // G
    RG: tl.constexpr = D // G  # the row's groups: its scales, then (asymmetric) its zeros
    first = meta  # the word of the row's first scale
    if RG == 1 and not SYM:  # one scale and zero a row: one word, scale in its low half
        word = tl.load(words_ptr + first)[:, None]  # [BT, 1]
        scale, zero = _fp16_half(word, 0), _fp16_half(word, 1)
    elif LANES:
        g = C0 // G + tl.arange(0, NG)
        scale = _meta_halves(words_ptr, first, g)
        zero = scale if SYM else _meta_halves(words_ptr, first, RG + g)
    elif JOINT and NG == RG and (RG == 2 or RG == 4) and not SYM:  # scales, then zeros
        BT: tl.constexpr = first.shape[0]
        words = tl.load(words_ptr + first[:, None] + tl.arange(0, RG)[None, :])  # [BT, RG]
        words = tl.permute(tl.reshape(words, [BT, 2, RG // 2]), (0, 2, 1))
        scale_word, zero_word = tl.split(words)  # [BT, RG/2] each
        scale, zero = _word_halves(scale_word), _word_halves(zero_word)
    elif NG % 2 == 0 and (C0 // G) % 2 == 0 and RG % 2 == 0:
        scale = _meta_words(words_ptr, first + C0 // G // 2, NG)
        zero = scale if SYM else _meta_words(words_ptr, first + (RG + C0 // G) // 2, NG)
    else:  # fp16 loads
        at_g = 2 * first[:, None] + C0 // G + tl.arange(0, NG)[None, :]
        scale = tl.load(half_ptr + at_g)
        zero = scale if SYM else tl.load(half_ptr + at_g + RG)
    if SYM:  # (code - HALF)·scale/HALF
        zero = (-scale).to(DT)
        scale = (scale.to(tl.float32) / ((1 << (BITS - 1)) - 1)).to(DT)
    else:
        zero = zero.to(DT)
        scale = scale.to(DT)
    return scale, zero


@triton.jit
def _meta_words(words_ptr, first, NG: tl.constexpr):
    """NG fp16 (NG even) in NG/2 int32 words from word ``first`` [BT] -> fp16 [BT, NG]."""
    return _word_halves(tl.load(words_ptr + first[:, None] + tl.arange(0, NG // 2)[None, :]))


@triton.jit
def _word_halves(words):
    """int32 ``words`` [BT, N] -> the fp16 they hold [BT, 2N], each word's low half first."""
    BT: tl.constexpr = words.shape[0]
    N: tl.constexpr = words.shape[1]
    return tl.reshape(tl.join(_fp16_half(words, 0), _fp16_half(words, 1)), [BT, 2 * N])


@triton.jit
def _meta_halves(words_ptr, first, index):
    """The fp16 at places ``index`` [NG] after word ``first`` [BT] -> fp16 [BT, NG], each read
    from its whole int32 word (a lane-ordered tile's lane needs only its own group's)."""
    words = tl.load(words_ptr + first[:, None] + (index // 2)[None, :])
    half = (words >> (16 * (index % 2))[None, :]).to(tl.int16)
    return half.to(tl.float16, bitcast=True)


@triton.jit
def _fp16_half(words, HIGH: tl.constexpr):
    """The low (``HIGH`` 0) or high 16 bits of int32 ``words``, as the fp16 they hold."""
    return (words >> (16 * HIGH)).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def dequantized(words_ptr, half_ptr, at, meta, C0: tl.constexpr, W: tl.constexpr,
                D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr, SYM: tl.constexpr,
                DT: tl.constexpr, JOINT: tl.constexpr = False,
                LANES: tl.constexpr = False, KEY_LANES: tl.constexpr = False):  # fmt: skip
    """Channels [C0, C0 + W) of the rows at word ``at`` [BT] (metadata at ``meta``) -> ``DT``
    [BT, W], in the codes' order: one fma an element (16-bit rows: loaded). A span starts at a
    word of codes (2/4/8 bits) or of high-plane codes (3/5/6 bits: 32 channels, 16 at 6 bits),
    and covers whole groups or lies in one.
    ``JOINT`` and ``LANES`` as in :func:`row_meta`; ``LANES`` and ``KEY_LANES`` (keys the
    caller puts in :func:`key_lanes` order) dequantize with :func:`register_pairs_fma`."""
    if BITS == 16:
        x = tl.load(half_ptr + 2 * at[:, None] + C0 + tl.arange(0, W)[None, :]).to(DT)
    else:
        NG: tl.constexpr = (W + G - 1) // G
        READ: tl.constexpr = element_read(BITS, DT, LANES, LANES or KEY_LANES)
        PAIRED: tl.constexpr = (LANES or KEY_LANES) and DT == tl.float16  # noqa: SIM300
        codes = row_codes(words_ptr, at, C0, W, D, BITS, DT, READ, LANES, PAIRED)
        codes = tl.reshape(codes, [at.shape[0], NG, W // NG])
        scale, zero = row_meta(words_ptr, half_ptr, meta, C0, W, D, BITS, G, SYM, DT, JOINT,
                               LANES)  # fmt: skip
        if READ == TOP:  # fp16: z - s'·o is one rounding, half an ulp of |z| + s' at most
            scale = scale * code_unit(READ, BITS)
            zero = zero - scale * code_origin(READ)
        x = _scaled(codes, scale, zero, PAIRED)
    return x


@triton.jit
def _scaled(codes, scale, zero, PAIRED: tl.constexpr = False):
    """Codes [BT, NG, W/NG] with their groups' scales and zeros [BT, NG] -> values [BT, W]
    (``PAIRED``: :func:`register_pairs_fma`)."""
    BT: tl.constexpr = codes.shape[0]
    W: tl.constexpr = codes.shape[1] * codes.shape[2]
    if PAIRED:
        x = register_pairs_fma(codes, scale[:, :, None], zero[:, :, None])
    else:
        x = tl.fma(codes, scale[:, :, None], zero[:, :, None])
    return tl.reshape(x, [BT, W])


@triton.jit
def register_pairs_fma(x, scale, zero):
    """fp16 x·scale + zero (scale and zero broadcast to x), rounded once as ``tl.fma``. The
    GPU's build pairs the halves of x's own registers (``fma.rn.f16x2``, in PTX): LLVM paired
    the scalar fp16 ``fma`` where the scale is the same, so a value tile whose registers hold
    two tokens of a channel (:func:`_token_paired`) was taken apart and put back with a
    ``PRMT`` each way (one-warp KV4 g32 decode, sm_90a: 1022 loop instructions and 24 bytes
    spilled, against 913 and none in PTX; 951 before either). The interpreter runs no PTX:
    ``tl.fma`` there, the same rounding."""
    if PTX:
        return tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r",
                                         [x, scale, zero], dtype=tl.float16, is_pure=True,
                                         pack=2)  # fmt: skip
    return tl.fma(x, scale, zero)


@triton.constexpr_function
def dotted_groups(bits: int, group: int, head_dim: int, one_warp: bool,
                  beside_dequantized: bool = False) -> int:  # fmt: skip
    """In how many dots a row's raw codes meet q or p, each group's scale and zero applied
    after its dot in fp32 (:func:`scores`, :func:`values`): 1 for one scale a token-head; 2
    for a row's two groups (g64 at d 128) on the one-warp decode tile, each group's dot whole
    MMAs (one-warp KV8 g64 decode, sm_90a: 1138 -> 893 loop instructions a tile: the fp16
    subtraction of 1024 and the ``fma`` a pair of codes gone, and each lane's 16-byte key
    loads of :func:`key_lanes`); 0 where codes are dequantized element-wise first: groups of
    32 channels, whose dots and scales cost what the element-wise ``fma`` saves (one-warp
    decode at d 64 in two dots of g32: KV4 605 -> 714 loop instructions, KV3 835 -> 974).
    ``beside_dequantized``: keys whose values are dequantized element-wise stay so too (in two
    dots beside them K8 g64 V4 g32 spilled 32 bytes at 168 registers, ptxas's choice)."""
    if bits >= 16:
        return 0
    if group == head_dim:
        return 1
    two = one_warp and 2 * group == head_dim and group >= 64 and not beside_dequantized
    return 2 if two else 0


@triton.jit
def scores(q, q_sum, k_words, k_half, at, meta, D: tl.constexpr, BITS: tl.constexpr,
           G: tl.constexpr, SYM: tl.constexpr, IEEE: tl.constexpr, JOINT: tl.constexpr = False,
           KEYS_FIRST: tl.constexpr = False, DOTS: tl.constexpr = 0,
           KEY_LANES: tl.constexpr = False):  # fmt: skip
    """Raw scores fp32 [QP, BT] of q [QP, D] against the keys at word ``at`` [BT]. ``DOTS``
    (:func:`dotted_groups`) 1 or 2: the row's groups each dotted apart, raw codes, then
    Σ_g scale_g·(q_g·codes_g) + zero_g·Σq_g (q's group sums ``q_sum`` fp32 [QP, DOTS]), the
    codes read as :func:`after_dot_read` says (what a code of 0 reads as comes off with the
    zero) and, keys first, in :func:`key_lanes` order a group (q put in it once by
    :func:`packed_part`); 0, dequantized element-wise, in :func:`key_lanes` order too where
    ``KEY_LANES``.
    ``JOINT`` as in :func:`row_meta`, ``KEYS_FIRST`` as in :func:`.tiles._qk`."""
    BT: tl.constexpr = at.shape[0]
    if DOTS:  # the dots first, then the metadata (one-warp KV4 g128 planes: 130 -> 128 registers)
        READ: tl.constexpr = after_dot_read(BITS, q.dtype)
        if DOTS == 1:
            s = _qk(q, _key_codes(k_words, at, 0, D, D, BITS, q.dtype, READ, KEYS_FIRST), IEEE,
                    KEYS_FIRST)  # fmt: skip
        else:
            q0, q1 = _halves(q)
            s0 = _qk(q0, _key_codes(k_words, at, 0, G, D, BITS, q.dtype, READ, KEYS_FIRST),
                     IEEE, KEYS_FIRST)  # fmt: skip
            s1 = _qk(q1, _key_codes(k_words, at, G, G, D, BITS, q.dtype, READ, KEYS_FIRST),
                     IEEE, KEYS_FIRST)  # fmt: skip
        scale, zero = row_meta(k_words, k_half, meta, 0, D, D, BITS, G, SYM, tl.float32, JOINT)
        # codes read as o + c/u: q·x = (s·u)·(q·codes) + (z - s·u·o)·Σq, in fp32
        scale *= code_unit(READ, BITS)
        if READ != EXACT:
            zero -= scale * code_origin(READ)
        if DOTS == 1:  # scale, zero [BT, 1]
            s = s * tl.reshape(scale, [1, BT]) + q_sum * tl.reshape(zero, [1, BT])
        else:  # scale, zero [BT, 2]
            scale0, scale1 = tl.split(scale)
            zero0, zero1 = tl.split(zero)
            q_sum0, q_sum1 = tl.split(q_sum)
            s = s0 * scale0[None, :] + s1 * scale1[None, :]
            s += q_sum0[:, None] * zero0[None, :] + q_sum1[:, None] * zero1[None, :]
    else:
        k = dequantized(k_words, k_half, at, meta, 0, D, D, BITS, G, SYM, q.dtype, JOINT,
                        KEY_LANES=KEY_LANES)  # fmt: skip
        if KEY_LANES:
            k = key_lanes(k)
        s = _qk(q, k, IEEE, KEYS_FIRST)
    return s


@triton.jit
def _key_codes(k_words, at, C0: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
               BITS: tl.constexpr, DT: tl.constexpr, READ: tl.constexpr,
               KEYS_FIRST: tl.constexpr):  # fmt: skip
    """Raw codes of channels [C0, C0 + W) of the keys at ``at`` [BT] -> ``DT`` [BT, W], in
    :func:`key_lanes` order keys first."""
    codes = row_codes(k_words, at, C0, W, D, BITS, DT, READ)
    if KEYS_FIRST:
        codes = key_lanes(codes)
    return codes


@triton.jit
def values(p, v_words, v_half, at, meta, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
           SYM: tl.constexpr, DT: tl.constexpr, IEEE: tl.constexpr,
           JOINT: tl.constexpr = False, LANES: tl.constexpr = False,
           KEYS_FIRST: tl.constexpr = False, DOTS: tl.constexpr = 0):  # fmt: skip
    """p fp32 [QP, BT] times the values at word ``at`` [BT] -> (fp32 [QP, D], the zeros' part
    Σ_t p·zero fp32: [QP] for one group, [QP, 2, 1] for two, to be added to each group's
    channels by the caller; :func:`packed_part` carries it so). ``DOTS``
    (:func:`dotted_groups`): the row's groups each dotted apart, raw codes against p·scale_g
    (read as :func:`after_dot_read` says, a code of 0's share taken off with the zero); 0:
    dequantized element-wise, no zeros' part. ``JOINT`` as in :func:`row_meta`; ``LANES`` (2/4/8-bit
    codes): the result in :func:`value_lanes` order a group; ``KEYS_FIRST`` as in
    :func:`.tiles._pv`."""
    BT: tl.constexpr = at.shape[0]
    QP: tl.constexpr = p.shape[0]
    if DOTS:
        READ: tl.constexpr = after_dot_read(BITS, DT)
        scale, zero = row_meta(v_words, v_half, meta, 0, D, D, BITS, G, SYM, tl.float32, JOINT)
        scale = scale * code_unit(READ, BITS)  # codes o + c/u: s·c = (s·u)·codes - (s·u)·o
        if DOTS == 1:  # scale, zero [BT, 1]
            codes = _value_codes(v_words, at, 0, D, D, BITS, DT, READ, LANES)
            ps = (p * tl.reshape(scale, [1, BT])).to(DT)  # the dot's own rounding of p·s
            pv = _pv(ps, codes, IEEE, KEYS_FIRST)
            pz = tl.sum(_zeros_part(p, ps, tl.reshape(zero, [1, BT]), READ), 1)
        else:  # scale, zero [BT, 2]; both groups' codes, then both dots
            scale0, scale1 = tl.split(scale)
            zero0, zero1 = tl.split(zero)
            codes0 = _value_codes(v_words, at, 0, G, D, BITS, DT, READ, LANES)
            codes1 = _value_codes(v_words, at, G, G, D, BITS, DT, READ, LANES)
            ps0 = (p * scale0[None, :]).to(DT)
            ps1 = (p * scale1[None, :]).to(DT)
            pv0 = _pv(ps0, codes0, IEEE, KEYS_FIRST)
            pv1 = _pv(ps1, codes1, IEEE, KEYS_FIRST)
            pv = tl.reshape(tl.permute(tl.join(pv0, pv1), (0, 2, 1)), [QP, D])
            pz0 = _zeros_part(p, ps0, zero0[None, :], READ)
            pz = tl.permute(tl.join(pz0, _zeros_part(p, ps1, zero1[None, :], READ)), (0, 2, 1))
            pz = tl.sum(pz, 2, keep_dims=True)
    else:
        v = dequantized(v_words, v_half, at, meta, 0, D, D, BITS, G, SYM, DT, JOINT, LANES)
        if LANES:
            v = value_lanes(v, BITS)
        pv = _pv(p.to(DT), v, IEEE, KEYS_FIRST)
        pz = tl.zeros([QP], tl.float32)
    return pv, pz


@triton.jit
def _value_codes(v_words, at, C0: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
                 BITS: tl.constexpr, DT: tl.constexpr, READ: tl.constexpr,
                 LANES: tl.constexpr):  # fmt: skip
    """Raw codes of channels [C0, C0 + W) of the values at ``at`` [BT] -> ``DT`` [BT, W], in
    :func:`value_lanes` order where ``LANES``."""
    codes = row_codes(v_words, at, C0, W, D, BITS, DT, READ, LANES)
    if LANES:
        codes = value_lanes(codes, BITS)
    return codes


@triton.jit
def _token_paired(words, AT: tl.constexpr, EXPONENT: tl.constexpr):
    """Rows' words of 4-bit codes int32 [BT, N] -> fp16 [BT, 8N] in channel order, each code
    moved to bit AT of its half under ``EXPONENT`` (``TOP``: 1 + c/16), each register two
    *tokens* of a channel (rows 2i and 2i + 1: the value MMA's pairs), not two channels of a
    token: a word of each row gives
    two words of four codes (codes 0-3 of both rows, codes 4-7), each code then one shift and
    one and-or, and no ``PRMT`` re-pairs them for the MMA (one-warp KV4 g64 decode, sm_90a:
    its 72 ``PRMT`` down to 8, 894 -> 814 loop instructions a tile; rows loaded apart, even
    and odd, cost more in addresses and 4-byte copies than they saved: 947)."""
    BT: tl.constexpr = words.shape[0]
    W: tl.constexpr = 8 * words.shape[1]
    words = tl.permute(tl.reshape(words.to(tl.uint32, bitcast=True), [BT // 2, 2, W // 8]),
                       (0, 2, 1))  # fmt: skip
    even, odd = tl.split(words)  # [BT/2, W/8]
    low = halves_joined(even, odd, 0)  # codes 0-3 of both rows at bits 4j of each half
    high = halves_joined(even, odd, 1)  # codes 4-7
    up = tl.join(low, high)  # [BT/2, W/8, 2]: codes 4h + j of both rows at bits 4j
    x = tl.join(tl.join(up << AT, up << (AT - 4)), tl.join(up >> (8 - AT), up >> (12 - AT)))
    x = tl.reshape(tl.permute(x, (0, 1, 2, 4, 3)), [BT // 2, W // 8, 2, 4])  # code j: j%2, j//2
    x = and_or(x, 0xF * 0x10001 << AT, EXPONENT)  # code j at bit AT (KV4 g32: 899 -> 852)
    tokens = _fp16_pairs(x.to(tl.int32, bitcast=True), False)  # [BT/2, W/8, 2, 4, 2]
    codes = tl.permute(tokens, (0, 4, 1, 2, 3))  # [BT/2, 2, W/8, 2, 4]
    return tl.reshape(codes, [BT, W])


@triton.constexpr_function
def _prmt(high: bool) -> str:
    return f"prmt.b32 $0, $1, $2, {0x7632 if high else 0x5410:#x};"  # bytes of $1, then $2


@triton.jit
def halves_joined(a, b, HIGH: tl.constexpr):
    """uint32 words a, b -> their low (``HIGH``: high) 16-bit halves in one word, a's below:
    one PTX ``prmt`` on the GPU (where its build took two integer instructions a half)."""
    if PTX:
        return tl.inline_asm_elementwise(_prmt(HIGH), "=r,r,r", [a, b], dtype=tl.uint32,
                                         is_pure=True, pack=1)  # fmt: skip
    if HIGH:
        return (a >> 16) | (b & 0xFFFF0000)
    return (a & 0xFFFF) | (b << 16)


@triton.jit
def _zeros_part(p, ps, zero, READ: tl.constexpr):
    """p fp32 [QP, BT], p·scale as dotted ``ps`` [QP, BT], a group's zeros fp32 [1, BT] -> the
    group's zeros' part p·zero fp32 [QP, BT], less p·scale times what a code of 0 reads as."""
    pz = p * zero
    if READ != EXACT:
        pz -= ps.to(tl.float32) * code_origin(READ)
    return pz


@triton.jit
def _halves(x):
    """x [R, 2W] -> its two halves [R, W]."""
    R: tl.constexpr = x.shape[0]
    W: tl.constexpr = x.shape[1] // 2
    return tl.split(tl.permute(tl.reshape(x, [R, 2, W]), (0, 2, 1)))


@triton.jit
def packed_part(q, k_words, k_half, v_words, v_half, table_ptr, row, k_at0, v_at0, k_st, v_st,
                k_md, v_md, stride_table, lo, hi, qpos, window, score_scale, cap_log2, rope, pages,
                D: tl.constexpr, BT: tl.constexpr, K_BITS: tl.constexpr, K_G: tl.constexpr,
                K_SYM: tl.constexpr, K_VEC: tl.constexpr, V_BITS: tl.constexpr,
                V_G: tl.constexpr, V_SYM: tl.constexpr, V_VEC: tl.constexpr,
                PAGED: tl.constexpr, WINDOW: tl.constexpr,
                SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                ROPE_HALF: tl.constexpr, K_CHANNEL: tl.constexpr,
                ONE_WARP: tl.constexpr = False, NARROW: tl.constexpr = False,
                ROPE_PAIRS: tl.constexpr = False):  # fmt: skip
    """Online softmax of q [QP, D] (channel order) over packed positions [lo, hi) -> (m, denom,
    acc [QP, D] in channel order) fp32. A row's scales start ``k_md`` / ``v_md`` words after
    its codes (:func:`~kvtuner.quant.triton_codes.meta_offset`: rows or planes). Decode:
    ``qpos`` is the one query's position (every row sees every position in range); ``CAUSAL``
    (extend): ``qpos`` [QP], row r sees positions <= qpos[r] (and with a window the last
    ``window`` of them). ``lo`` is never before the
    first row's window (nor a decode's left padding), so some row attends every row read.
    Pre-RoPE keys (``ROPE_HALF`` = R/2 > 0): the scores are :func:`rope_scores` of ``rope``
    (q's spans, from :func:`.rope_rows.rope_query`); q gives only its shape and dtype.
    Channel-axis (KIVI) keys in a pool's pages of ``K_G`` slots, each tile inside one page
    (``lo`` and ``BT`` divide into pages): ``K_CHANNEL`` 1, full pages' blocks
    (:func:`page_rows`); 2, a filling page's staged values (:func:`staged_rows`, ``pages`` its
    staging). ``NARROW`` (:func:`narrow_offsets`): a row's slot × stride in int32 (the
    program's base ``k_at0`` / ``v_at0`` stays int64). ``ROPE_PAIRS``: the rotary tiles'
    order (:func:`rotary_pairs`), the one ``rope``'s q tile was built in."""
    QP: tl.constexpr = q.shape[0]
    # one-warp decode: the value tile in lane order (on 4 warps, d 256, it took more shared
    # memory, not less; extend, at 4-8 warps and up to 255 registers, spilled 80 bytes with it
    # at KV8 g64); one scale a row too since keys come first (KV4 g128, sm_90a: 168 registers
    # and 8 bytes spilled without, 134 and none with)
    V_LANES: tl.constexpr = ONE_WARP and V_BITS < 16
    V_DOTS: tl.constexpr = dotted_groups(V_BITS, V_G, D, ONE_WARP)
    V_ELEMENTWISE: tl.constexpr = V_BITS < 16 and not V_DOTS
    K_DOTS: tl.constexpr = 0 if K_CHANNEL else dotted_groups(K_BITS, K_G, D, ONE_WARP,
                                                             V_ELEMENTWISE)  # fmt: skip
    K_SPANS: tl.constexpr = max(K_DOTS, 1)
    # keys dequantized element-wise, one warp: in key lane order (constant shifts, whole words
    # a lane; sm_90a loop instructions a tile: KV4 g32 sym 1108 -> 936, K8V4 1007 -> 911; 3/5/6
    # bits too, a lane's quarter of the row whole words of both planes, Triton 3.6: KV3 g32
    # 1265 -> 1165, KV6 g32 1312 -> 1180, K5V3 1317 -> 1173; 3.9: 1224 -> 1123, 1285 -> 1138,
    # 1284 -> 1125), codes exact (the top's folded zero rounds once for a whole group's Σq: K4
    # g32 V16 1.7e-3 -> 8.8e-3 off the reference)
    K_LANES: tl.constexpr = (ONE_WARP and not K_DOTS and not K_CHANNEL and not ROPE_HALF
                             and K_BITS < 16)  # fmt: skip
    V_SPANS: tl.constexpr = max(V_DOTS, 1)  # the value tile's spans in lane order
    if not ROPE_HALF:
        q_sum = tl.sum(tl.reshape(q.to(tl.float32), [QP, K_SPANS, D // K_SPANS]), 2)  # a group
        if K_BITS < 16 and K_CHANNEL != 2:
            q = pair_order(q, K_BITS)  # the keys' code order (staged keys: channel order)
            if ONE_WARP and K_DOTS or K_LANES:  # as scores() reads such keys, keys first
                q = key_lanes(q, K_SPANS)
    m = tl.full([QP], -float("inf"), tl.float32)
    denom = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    # the values' zeros' part, as values() returns it (a [QP, 2] carry spilled 8 bytes in
    # KV8 g64 rows padded to 16 B; [QP, 1, 1] for one group took 130-166 registers, not 128)
    acc_z = tl.zeros([QP] if V_DOTS < 2 else [QP, 2, 1], tl.float32)
    # a row's offset (slot × stride) in int32 where it fits: Triton 3.6, the GPU machines',
    # built it in int64 with about twice the address instructions (sm_90a, one-warp decode, loop
    # instructions a tile: KV8 g64 930 -> 847, its IMAD 132 -> 69; KV4 g128 997 -> 850, KV4 g32
    # 886 -> 838; Triton 3.9 805 -> 796 at KV4 g32)
    k_sv, v_sv = _offset(k_st * K_VEC, NARROW), _offset(v_st * V_VEC, NARROW)
    k_md, v_md = _offset(k_md, NARROW), _offset(v_md, NARROW)
    for t0 in range(lo, hi, BT):
        t = t0 + tl.arange(0, BT)
        ok = t < hi
        tok = tl.minimum(t, hi - 1)  # past the end: the last row again, read as masked
        if PAGED:
            tok = tl.load(table_ptr + row * stride_table + tok)
        tok = _offset(tok, NARROW)
        seen = _seen(t, ok, qpos, window, WINDOW, CAUSAL)
        k_at, v_at = k_at0 + tok * k_sv, v_at0 + tok * v_sv
        k_meta, v_meta = k_at + k_md, v_at + v_md  # their scales' words (k_md, v_md: per head)
        if K_CHANNEL:  # the tile's page (pools only): its block, or its staged values
            slot0 = tl.load(table_ptr + row * stride_table + t0)
            page = slot0 // K_G
            j = slot0 % K_G + tl.arange(0, BT)  # the tile's rows of its page
            block = k_at0 + _offset(page, NARROW) * k_sv  # a full page's
            if ROPE_HALF:
                spans = page_spans(k_words, k_half, pages, block, page, j, ok, K_CHANNEL == 2,
                                   D, ROPE_HALF, K_BITS, K_G, K_SYM, q.dtype)  # fmt: skip
                s = rope_scores(rope, spans, t0, D, ROPE_HALF, IEEE, ONE_WARP,
                                stepped_rope(ROPE_HALF, D, 1, BT))  # fmt: skip
            elif K_CHANNEL == 1:
                k = page_rows(k_words, k_half, block, j, 0, D, D, K_BITS, K_G, K_SYM, q.dtype)
                s = _qk(q, k, IEEE, ONE_WARP)
            else:  # q in channel order
                k = staged_rows(pages, page, j, ok, tl.arange(0, D)).to(q.dtype)
                s = _qk(q, k, IEEE, ONE_WARP)
        elif ROPE_HALF:  # each key rotated forward to its position: element-wise tiles
            spans = key_spans(k_words, k_half, k_at, k_meta, D, ROPE_HALF, K_BITS, K_G, K_SYM,
                              q.dtype, ONE_WARP)  # fmt: skip
            s = rope_scores(rope, spans, t0, D, ROPE_HALF, IEEE, ONE_WARP,
                            stepped_rope(ROPE_HALF, D, 0, BT), ROPE_PAIRS)  # fmt: skip
        else:
            s = scores(q, q_sum, k_words, k_half, k_at, k_meta, D, K_BITS, K_G, K_SYM, IEEE,
                       not CAUSAL, ONE_WARP, K_DOTS, K_LANES)  # fmt: skip
        m, denom, alpha, p = _softmax_step(s, seen, m, denom, score_scale, cap_log2, SOFTCAP)
        pv, pz = values(p, v_words, v_half, v_at, v_meta, D, V_BITS, V_G, V_SYM,
                        q.dtype, IEEE, not CAUSAL, V_LANES, ONE_WARP, V_DOTS)  # fmt: skip
        acc = acc * alpha[:, None] + pv
        if V_DOTS == 1:
            acc_z = acc_z * alpha + pz
        elif V_DOTS:
            acc_z = acc_z * alpha[:, None, None] + pz
    if V_LANES:
        acc = value_channels(acc, V_BITS, V_SPANS)
    if V_BITS < 16:  # acc is in the values' code order (pairs)
        acc = channel_order(acc, V_BITS)
    if V_DOTS == 1:
        acc += acc_z[:, None]
    elif V_DOTS:  # each group's zeros' part on its channels
        acc = tl.reshape(tl.reshape(acc, [QP, 2, D // 2]) + acc_z, [QP, D])
    return m, denom, acc


@triton.jit
def _offset(x, NARROW: tl.constexpr):
    """Integer ``x`` as a row offset: int32 where ``NARROW``, else int64."""
    return tl.cast(x, tl.int32 if NARROW else tl.int64)


@triton.jit
def _seen(t, ok, qpos, window, WINDOW: tl.constexpr, CAUSAL: tl.constexpr):
    """bool [QP or 1, BT]: which rows attend positions t [BT] (``ok``: in range)."""
    if CAUSAL:
        seen = ok[None, :] & (t[None, :] <= qpos[:, None])
        if WINDOW:
            seen = seen & (t[None, :] > qpos[:, None] - window)
    else:
        seen = ok[None, :]
    return seen


@triton.jit
def page_rows(k_words, k_half, block, j, C0: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
              BITS: tl.constexpr, G: tl.constexpr, SYM: tl.constexpr,
              DT: tl.constexpr):  # fmt: skip
    """Channels [C0, C0 + W) of rows j [BT] of one full page's channel-axis block at word
    ``block`` (G code rows, D scales, D zeros) -> ``DT`` [BT, W] in the codes' order: one fma
    an element with the page's scale and zero of each channel, as a token row's groups; 2/4-bit
    codes read in place in their byte where :data:`PAGES_IN_BYTE`."""
    order = C0 + code_order(W, BITS)  # scales and zeros in the codes' order
    READ: tl.constexpr = element_read(BITS, DT, False, PAGES_IN_BYTE)
    codes = row_codes(k_words, block + j * (D * BITS // 32), C0, W, D, BITS, DT, READ)
    first = 2 * (block + G * D * BITS // 32) + order  # fp16 index of the span's scales
    scale = tl.load(k_half + first)
    if SYM:  # (code - HALF)·scale/HALF
        zero = (-scale).to(DT)
        scale = (scale.to(tl.float32) / ((1 << (BITS - 1)) - 1)).to(DT)
    else:
        zero = tl.load(k_half + first + D).to(DT)
        scale = scale.to(DT)
    return tl.fma(codes, scale[None, :], zero[None, :])


@triton.jit
def staged_rows(pages, page, j, ok, channels):
    """``channels`` [W] of rows j [BT] (``ok`` masks them) of a filling page, as staged ->
    [BT, W] in the stage's dtype; ``pages`` = (stage fp [rows, G, ., D], each page's stage
    row, the row, position and head strides, this head's offset)."""
    stage, stage_rows, s_row, s_pos, s_head = pages
    srow = tl.load(stage_rows + page).to(tl.int64)
    at = stage + srow * s_row + s_head + j[:, None] * s_pos + channels[None, :]
    return tl.load(at, mask=ok[:, None], other=0.0)


@triton.jit
def page_spans(k_words, k_half, pages, block, page, j, ok, STAGED: tl.constexpr,
               D: tl.constexpr, HALF: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
               SYM: tl.constexpr, DT: tl.constexpr):  # fmt: skip
    """Pre-RoPE keys of rows j [BT] of one page (a full page's block, or ``STAGED`` a filling
    page's values) -> their spans ``DT``, as :func:`key_spans` reads token rows."""
    lo = _page_span(k_words, k_half, pages, block, page, j, ok, 0, HALF, STAGED, D, BITS, G,
                    SYM, DT)  # fmt: skip
    hi = _page_span(k_words, k_half, pages, block, page, j, ok, HALF, HALF, STAGED, D, BITS, G,
                    SYM, DT)  # fmt: skip
    PASS0: tl.constexpr = pass_start(D, HALF)
    if PASS0 < D:
        rest = _page_span(k_words, k_half, pages, block, page, j, ok, PASS0, D - PASS0, STAGED,
                          D, BITS, G, SYM, DT)  # fmt: skip
    else:
        rest = lo
    return lo, hi, rest


@triton.jit
def _page_span(k_words, k_half, pages, block, page, j, ok, C0: tl.constexpr, W: tl.constexpr,
               STAGED: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
               SYM: tl.constexpr, DT: tl.constexpr):  # fmt: skip
    if STAGED:
        x = staged_rows(pages, page, j, ok, C0 + code_order(W, BITS)).to(DT)
    else:
        x = page_rows(k_words, k_half, block, j, C0, W, D, BITS, G, SYM, DT)
    return x


@triton.jit
def code_order(W: tl.constexpr, BITS: tl.constexpr):
    """int32 [W]: the channel at each place of a row read in the codes' order: pair order
    (place ``P·w + 2j + h`` holds channel ``P·w + j + h·P/2``, P = 32/low bits,
    :func:`row_codes`); 16-bit rows in channel order."""
    x = tl.arange(0, W)
    if BITS < 16:
        P: tl.constexpr = 32 // low_bits(BITS)
        i = x % P
        x = x - i + i // 2 + (i % 2) * (P // 2)
    return x


@triton.jit
def key_spans(k_words, k_half, at, meta, D: tl.constexpr, HALF: tl.constexpr, BITS: tl.constexpr,
              G: tl.constexpr, SYM: tl.constexpr, DT: tl.constexpr,
              ONE_WARP: tl.constexpr = False):  # fmt: skip
    """Packed keys at word ``at`` [BT] -> their spans ``DT`` (low half [BT, HALF], high half,
    pass-through [BT, D - PASS0]; the last the low half again where there is none).

    Keys rotated over the whole row, in groups that halve: the row's scales and zeros in one
    copy, then each half's (one-warp decode, sm_90a, Triton 3.6, loop instructions a 16-key
    tile: KV4 g32 1740 -> 1206, 168 -> 136 registers; KV8 g64 1515 -> 1283; KV3 g32 1987 ->
    1446). Each half read its own: [BT, 1] words or 2-byte loads, which Triton 3.6 built as a
    branch around each 4-byte copy (16 a load) and 271 shared-memory loads a tile. Keys
    rotated over part of the row keep each span's own: their spans taken from the row's
    copy built 2 % more instructions a tile under both Tritons. The whole-row branch takes a
    word's mask and exponent in one PTX ``lop3`` and dequantizes with
    :func:`register_pairs_fma`, as keys in key lane order do (Triton 3.6, KV4 g32: 1103 -> 1073
    loop instructions a tile); on ``ONE_WARP`` tiles 2/4-bit codes read ``IN_BYTE`` (3.6, KV4
    g32: 1473 -> 1445, 230 -> 224 registers; the HF cache's 4-warp tile took 234 registers
    with it, against 168)."""
    if BITS < 16 and 2 * HALF == D and (D // G) % 2 == 0:
        BT: tl.constexpr = at.shape[0]
        READ: tl.constexpr = element_read(BITS, DT, False, ONE_WARP)
        lo = row_codes(k_words, at, 0, HALF, D, BITS, DT, READ, PAIRED_FMA=True)
        hi = row_codes(k_words, at, HALF, HALF, D, BITS, DT, READ, PAIRED_FMA=True)
        lo = tl.reshape(lo, [BT, HALF // G, G])
        hi = tl.reshape(hi, [BT, HALF // G, G])
        scale, zero = row_meta(k_words, k_half, meta, 0, D, D, BITS, G, SYM, DT, True)
        scale_lo, scale_hi = _halves(scale)
        zero_lo, zero_hi = _halves(zero)
        lo = _scaled(lo, scale_lo, zero_lo, True)
        return lo, _scaled(hi, scale_hi, zero_hi, True), lo
    lo = dequantized(k_words, k_half, at, meta, 0, HALF, D, BITS, G, SYM, DT)
    hi = dequantized(k_words, k_half, at, meta, HALF, HALF, D, BITS, G, SYM, DT)
    PASS0: tl.constexpr = pass_start(D, HALF)
    if PASS0 < D:
        rest = dequantized(k_words, k_half, at, meta, PASS0, D - PASS0, D, BITS, G, SYM, DT)
    else:
        rest = lo
    return lo, hi, rest


@triton.jit
def rope_scores(rope, spans, t0, D: tl.constexpr, HALF: tl.constexpr, IEEE: tl.constexpr,
                KEYS_FIRST: tl.constexpr = False, STEPS: tl.constexpr = False,
                PAIRS: tl.constexpr = False):  # fmt: skip
    """Raw scores fp32 [QP, BT] of q (``rope``: :func:`.rope_rows.rope_query`'s tuple) against
    keys stored at position 0 (``spans``: :func:`key_spans`) of token indices t0 + i (i < BT),
    each rotated forward to ``pos0 + t0 + i``: channel pair (j, j + HALF) turns by that
    position times f_j. ``STEPS`` (:func:`stepped_rope`): the turn split in two, the keys by
    i·f_j, read from the launch's table (:func:`~.rope.rotary_steps`), and q back by
    (pos0 + t0)·f_j once a tile, whose cos and sin are then the tile's only ones. ``KEYS_FIRST``
    as in :func:`.tiles._qk`; ``PAIRS`` as in :func:`rotary_tile` (q's tile in ``rope`` too)."""
    q_lo, q_hi, q, q_pass, freq, pos0, steps = rope
    lo, hi, rest = spans
    DT: tl.constexpr = q.dtype
    BT: tl.constexpr = lo.shape[0]
    if STEPS:
        cos, sin = cos_sin((pos0 + t0).to(tl.float32) * freq, IEEE)  # [HALF]
        q = _turned_back(q_lo, q_hi, cos[None, :], sin[None, :], KEYS_FIRST, PAIRS)
        at = tl.arange(0, BT)[:, None] * (2 * HALF) + tl.arange(0, HALF)[None, :] + _in_loop(t0)
        cos, sin = tl.load(steps + at).to(DT), tl.load(steps + HALF + at).to(DT)
    else:
        t = t0 + tl.arange(0, BT)
        angle = (pos0 + t).to(tl.float32)[:, None] * freq[None, :]
        cos, sin = cos_sin(angle, IEEE)  # [BT, HALF]
        cos, sin = cos.to(DT), sin.to(DT)
    k = rotary_tile(lo * cos - hi * sin, hi * cos + lo * sin, KEYS_FIRST, PAIRS)
    s = _qk(q, k, IEEE, KEYS_FIRST)
    if pass_start(D, HALF) < D:
        s += _qk(q_pass, key_lanes(rest, 1, 2) if KEYS_FIRST else rest, IEEE, KEYS_FIRST)
    return s


@triton.jit
def _turned_back(lo, hi, cos, sin, KEYS_FIRST: tl.constexpr, PAIRS: tl.constexpr):
    """q's rotary halves [QP, HALF] turned back by the angles of ``cos``, ``sin`` (in fp32, once
    rounded to q's dtype) -> :func:`rotary_tile`."""
    DT: tl.constexpr = lo.dtype
    lo, hi = lo.to(tl.float32), hi.to(tl.float32)
    turned_lo, turned_hi = (lo * cos + hi * sin).to(DT), (hi * cos - lo * sin).to(DT)
    return rotary_tile(turned_lo, turned_hi, KEYS_FIRST, PAIRS)


@triton.jit
def _in_loop(t0):
    """0 for a tile's first token index t0 (>= 0), in a form the compiler cannot fold: added to
    a load's offsets that would not otherwise change from tile to tile, it keeps that load in
    the loop, where it is copied ahead through shared memory, not hoisted out of it into
    registers held across the loop (the rotary steps of a 16-key tile: 32 registers; Triton
    3.6, one-warp KV4 g32, 168 -> 231)."""
    return tl.minimum(t0, 0)


@triton.constexpr_function
def stepped_rope(half: int, head_dim: int, channel: int, tokens: int) -> bool:
    """Whether pre-RoPE keys turn by the launch's rotary steps (:func:`rope_scores`' ``STEPS``):
    keys rotated over the whole row, in token rows, or in KIVI pages (``channel``) on tiles of
    32 ``tokens``. sm_90a, one-warp 16-key tiles, Triton 3.6, loop instructions a tile: KV4 g32
    1073 -> 904, KV8 g32 1136 -> 974, KV3 g32 1313 -> 1120, KV8 g64 1018 -> 972; KIVI K4 pages
    on 32-key tiles 58.9 a key against 68.4 on 16 without (3.9: 53.9 against 72.1). Where the
    rotation covers part of the row (32-key tiles), q's turn and the table cost more than they
    save (R = D/2: 1521 -> 1614 and 168 -> 236 registers); so do KIVI pages of 16-key tiles
    (1094 -> 1104 at K4, 1352 -> 1405 at K3)."""
    return 2 * half == head_dim and (not channel or tokens >= 32)


@triton.jit
def rotary_tile(lo, hi, KEYS_FIRST: tl.constexpr, PAIRS: tl.constexpr = False):
    """A row's two rotary halves [N, HALF] -> one tile [N, 2·HALF], channel j of each half side
    by side (``PAIRS``: channels j and j + 1 of each, :func:`rotary_pairs`), in
    :func:`key_lanes` order where ``KEYS_FIRST``. One dot for both halves: the rotation then
    feeds a single MMA operand, and Triton builds it in the operand's own layout; with one dot
    a half, each half's rotation also fed the other's, and Triton 3.6 and 3.9 took both
    through shared memory (64 2-byte stores a 16-key tile)."""
    N: tl.constexpr = lo.shape[0]
    HALF: tl.constexpr = lo.shape[1]
    if PAIRS:  # [N, HALF/2, 2 halves, 2 channels]
        x = tl.join(tl.reshape(lo, [N, HALF // 2, 2]), tl.reshape(hi, [N, HALF // 2, 2]))
        x = tl.reshape(tl.permute(x, (0, 1, 3, 2)), [N, 2 * HALF])
    else:
        x = tl.reshape(tl.join(lo, hi), [N, 2 * HALF])
    return key_lanes(x, 1, 2) if KEYS_FIRST else x


@triton.constexpr_function
def rotary_pairs(bits: int, half: int, head_dim: int, one_warp: bool, channel: int) -> bool:
    """Whether a rotary tile puts each half's channel *pairs* side by side (:func:`rotary_tile`'s
    ``PAIRS``), not single channels: a register of a rotated half holds two of its channels
    (j, j + 1), and the MMA's operand takes a register of consecutive columns, so with single
    channels side by side each register was split and re-paired. One-warp decode of 4/8-bit
    token rows rotated over the whole row, sm_90a, loop instructions a tile, Triton 3.9: KV4
    g32 1337 -> 1145 (its ``PRMT`` 221 -> 28), KV8 g32 1439 -> 1248, KV8 g64 984 -> 827;
    Triton 3.6: 1428 -> 1358, 1544 -> 1479, 972 -> 926. Elsewhere it built longer: a rotary
    half of the row (R = D/2, 3.6: 1507 -> 1599), 3-bit keys (1853 -> 1878), KIVI K3 pages
    (1352 -> 1394), the HF cache's 4-warp tile (3.9 at its cap of 168: 1197 -> 1337)."""
    return one_warp and 2 * half == head_dim and (bits == 4 or bits == 8) and not channel


@triton.jit
def cos_sin(angle, IEEE: tl.constexpr):
    """cos and sin of fp32 angles (radians, any size). ``IEEE`` (fp32 q), and under the
    interpreter (no libdevice there): exact; else the hardware's approximations after reducing
    to [-π, π] (2^-21 off there, where the exact ones keep a slow path for large angles in local
    memory and ~40 instructions)."""
    if IEEE or INTERPRETED:
        cos, sin = tl.cos(angle), tl.sin(angle)
    else:
        turns = libdevice.rint(angle * 0.15915494309189535)  # angle / 2π
        r = tl.fma(turns, -6.28125, angle)  # 2π in two parts, the first exact in 8 bits
        r = tl.fma(turns, -1.9353071795864769e-3, r)
        cos, sin = libdevice.fast_cosf(r), libdevice.fast_sinf(r)
    return cos, sin


@triton.constexpr_function
def pass_start(head_dim: int, half: int) -> int:
    """The pass-through span's first channel: R = 2·half (span [R, D), a power of two wide or
    empty), else 0 (the whole row); for the kernels and the host check alike."""
    rest = head_dim - 2 * half
    return 2 * half if not rest & (rest - 1) else 0


def decodable(spec: QuantSpec, head_dim: int) -> bool:
    """16-bit rows, or token-axis codes in groups of at least a (low-plane) word's codes (32/bits,
    3/5/6 bits 32/2 or 32/4: a word never spans two groups); 3/5/6 bits in whole high-plane
    words too (head_dim a multiple of 32)."""
    if not spec.is_quantized:
        return True
    if spec.axis != "token":
        return False
    low = spec.bits if 32 % spec.bits == 0 else split_bits(spec.bits)[0]
    return spec.group_size >= 32 // low and (32 % spec.bits == 0 or head_dim % 32 == 0)


def wide_rows(*specs: QuantSpec) -> bool:
    """Rows a tile of 64 tokens (decode) or 64-128 query rows (extend) holds in registers at
    d <= 128 (the sm_90a build): 16-bit, or token-axis asymmetric codes of 2, 4 or 8 bits
    (3/5/6-bit rows and symmetric ones took 157-210 registers at 64 decode tokens; KIVI keys
    are read a page a tile)."""
    return all(
        not s.is_quantized or (s.axis == "token" and 32 % s.bits == 0 and not s.symmetric)
        for s in specs
    )


def kivi_keys(batch) -> bool:
    """Whether the batch's keys are channel-axis (KIVI) codes."""
    return batch.k_spec.is_quantized and batch.k_spec.axis == "channel"


def pages_decodable(batch) -> bool:
    """KIVI keys the decode and extend kernels read a page at a time: a pool's pages as
    SGLang's pages of G slots hold them (a request's token t in slot ``page·G + t % G``; every
    page before its last packed, the last staged until full), G >= 16 (one tile inside a
    page), code rows of whole words (3/5/6 bits: whole high-plane words, 32 channels), no window
    (tiles start at pages). Pre-RoPE pages are read in spans as token rows are
    (:func:`.rope_rows.rope_decodable`)."""
    spec, dim = batch.k_spec, batch.head_dim
    words = (dim * spec.bits) % 32 == 0 and (32 % spec.bits == 0 or dim % 32 == 0)
    return batch.k_stage is not None and spec.group_size >= 16 and words and batch.window is None


def keys_decodable(batch) -> bool:
    """Keys the decode and extend kernels read: KIVI pages as :func:`pages_decodable` says,
    token rows as :func:`decodable` does."""
    if kivi_keys(batch):
        return pages_decodable(batch)
    return decodable(batch.k_spec, batch.head_dim)


def page_tile(batch, block_tokens: int) -> int:
    """Tokens a tile: at most a KIVI page (G >= 16 and tiles both powers of two: a tile lies
    inside one page)."""
    return min(block_tokens, batch.k_spec.group_size) if kivi_keys(batch) else block_tokens


def rows_args(batch, name: str) -> tuple:
    """(int32 view, fp16 view, stride_b, stride_tok, stride_head in ``vec``-word units) of K's
    (``"k"``) or V's rows, whose offsets are multiples of ``vec`` words (:func:`.layout.row_vec`;
    strides: :meth:`.layout.AttentionBatch.row_strides`)."""
    rows, vec = getattr(batch, f"{name}_rows"), getattr(batch, f"{name}_vec")
    units = tuple(s // (4 * vec) for s in batch.row_strides(name))
    return (rows.view(torch.int32), rows.view(torch.float16), *units)


def narrow_offsets(batch) -> bool:
    """Whether :func:`packed_part` may take a row's offset in int32 (slot × stride, in int32
    words): each side's rows reach under 8 GiB past their first byte."""
    return all(_reach(getattr(batch, f"{name}_rows")) < 1 << 33 for name in ("k", "v"))


def _reach(rows: torch.Tensor) -> int:
    """Bytes of ``rows``' storage from its first element on."""
    return rows.untyped_storage().nbytes() - rows.storage_offset() * rows.element_size()


def table_rows(batch) -> torch.Tensor:
    """int32 [B]: each request's row of a paged batch's slot table (``arange`` by default)."""
    if batch.table_rows is not None:
        return batch.table_rows
    return torch.arange(batch.batch_size, dtype=torch.int32, device=batch.q.device)
