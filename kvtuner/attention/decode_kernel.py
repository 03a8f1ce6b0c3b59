"""The decode kernel: one query token per request over token-axis packed K/V rows (2 to 8
bits, or 16), and its launcher. Specialised for the serving hot path; everything else runs the
general kernel (:mod:`.kernel`), which :func:`serves` tells apart. Pre-RoPE keys are a
constexpr specialisation (``ROPE_HALF`` = R/2 > 0; 0 builds the kernel without a trace of
them): q and each K tile are read as the two rotary halves and a pass-through span, the halves
rotated forward element-wise before their dots (:mod:`.rope_rows`). KIVI keys in a pool's
pages (``K_CHANNEL``) are another: a tile lies inside one page, its codes dequantized with the
page's per-channel scales and zeros; the request's filling page (staged fp values) is one more
program's, as a tail is (:func:`.packed_rows.pages_decodable`).

Grid ``(B, Hkv, splits + tail)``: a program owns one KV head of one request and one slice of
its packed tokens (flash decoding); the ``Hq / Hkv`` query heads of that KV head share each K/V
tile, loaded once for all of them: on one warp the tile's tokens are the MMA's rows and the
heads its 8 columns (:func:`.tiles._qk`), on more q's rows are, padded to 16. A request with
an unpacked tail (the HF cache) gets one more program that attends only the tail. Partials merge
in :func:`.splits.merge_splits` (sinks there).

How the rows are read (word loads, the fp16 exponent trick, scale and zero after the dot at one
group a token-head) is :mod:`.packed_rows`, shared with the extend kernel;
``benchmarks/kernel_resources.py`` reads the result off the sm_90a build. bf16 q becomes fp16
once per program (clamped to fp16's range).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..quant.intmath import next_power_of_2
from ..quant.triton_codes import meta_offset
from ..quant.triton_kernels import interpreted
from .layout import AttentionBatch, choose_splits, placeholder, programs_an_sm
from .packed_rows import (
    decodable,
    dot_operand,
    keys_decodable,
    kivi_keys,
    narrow_offsets,
    packed_part,
    page_tile,
    rope_scores,
    rotary_pairs,
    rows_args,
    stepped_rope,
    table_rows,
    wide_rows,
)
from .rope import kernel_rope
from .rope_rows import rope_decodable, rope_query, rope_steps, spans
from .splits import merge_splits, softmax_args, split_chunk, store_partial
from .tiles import _pv, _qk, _softmax_step

__all__ = ["DecodePlan", "launch_decode", "plan_decode", "serves"]


@triton.jit
def _tail_part(q, kt_base, vt_base, kt_st, vt_st, tail_len, packed, start, qpos, window,
               score_scale, cap_log2, rope, D: tl.constexpr, BT: tl.constexpr,
               HAS_START: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
               IEEE: tl.constexpr, ROPE_HALF: tl.constexpr, K_BITS: tl.constexpr,
               KEYS_FIRST: tl.constexpr, ROPE_PAIRS: tl.constexpr):  # fmt: skip
    """Online softmax over the unpacked tail ([Tt, D] rows after ``packed`` positions);
    pre-RoPE keys read in spans and rotated as the packed ones (:mod:`.rope_rows`; their
    rotary tiles' order ``ROPE_PAIRS``, q's)."""
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
        if ROPE_HALF:  # keys rotated to their positions, read in the packed keys' spans
            k_spans = spans(k.to(q.dtype), ROPE_HALF, K_BITS)
            s = rope_scores(rope, k_spans, packed + i0, D, ROPE_HALF, IEEE, KEYS_FIRST,
                            stepped_rope(ROPE_HALF, D, 0, BT), ROPE_PAIRS)  # fmt: skip
        else:
            s = _qk(q, k.to(q.dtype), IEEE, KEYS_FIRST)
        m, denom, alpha, p = _softmax_step(s, ok[None, :], m, denom, score_scale, cap_log2,
                                           SOFTCAP)  # fmt: skip
        acc = acc * alpha[:, None] + _pv(p.to(q.dtype), v.to(q.dtype), IEEE, KEYS_FIRST)
    return m, denom, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_words, k_half, v_words, v_half, kt_ptr, vt_ptr, table_ptr, rows_ptr, len_ptr,
    start_ptr, o_ptr, lse_ptr, freq_ptr, steps_ptr, roff_ptr, stage_ptr, srows_ptr, stride_qb,
    stride_qh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, kt_sb, kt_sh, kt_st, vt_sb, vt_sh, vt_st, s_sr,
    s_sg, s_sh, stride_table, tail_len, chunk, num_splits, window, score_scale, cap_log2,
    D: tl.constexpr, GROUP: tl.constexpr,
    QP: tl.constexpr, BT: tl.constexpr, K_BITS: tl.constexpr, K_G: tl.constexpr,
    K_SYM: tl.constexpr, K_VEC: tl.constexpr, V_BITS: tl.constexpr, V_G: tl.constexpr,
    V_SYM: tl.constexpr, V_VEC: tl.constexpr, PAGED: tl.constexpr, HAS_START: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, DOT_IEEE: tl.constexpr,
    HAS_TAIL: tl.constexpr, ROPE_HALF: tl.constexpr, K_CHANNEL: tl.constexpr,
    ONE_WARP: tl.constexpr, K_PLANES: tl.constexpr, V_PLANES: tl.constexpr,
    NARROW: tl.constexpr,
):  # fmt: skip
    b, h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    DT: tl.constexpr = tl.float32 if DOT_IEEE else tl.float16
    r, d = tl.arange(0, QP), tl.arange(0, D)
    q_ok = r < GROUP
    q_row = q_ptr + b64 * stride_qb + (h64 * GROUP + r)[:, None] * stride_qh  # [QP, 1]
    q = dot_operand(tl.load(q_row + d[None, :], mask=q_ok[:, None], other=0.0), DT)  # [QP, D]
    # pre-RoPE keys' rotary tiles in channel pairs (the packed rows' and the tail's alike)
    ROPE_PAIRS: tl.constexpr = rotary_pairs(K_BITS, ROPE_HALF, D, ONE_WARP, K_CHANNEL)
    if ROPE_HALF:  # pre-RoPE keys: q's spans, the frequencies, stored key 0's position
        pos0 = tl.load(roff_ptr + b)
        rope = rope_query(q, freq_ptr, steps_ptr, pos0, ROPE_HALF, K_BITS, ONE_WARP, ROPE_PAIRS)
    else:
        rope = 0
    # KIVI keys: the staging of the pool's filling pages (a tuple only Triton's frontend sees)
    pages = (stage_ptr, srows_ptr, s_sr, s_sg, h64 * s_sh) if K_CHANNEL else 0
    packed = tl.load(len_ptr + b)
    start = tl.load(start_ptr + b) if HAS_START else 0
    qpos = packed + tail_len - 1  # the query is the newest position
    base = tl.maximum(qpos - window + 1, 0) if WINDOW else 0  # no key before it is seen
    base = tl.maximum(base, start)  # nor a left pad: tiles read only rows the query attends
    heads = tl.num_programs(1)  # grid axis 1: a program a KV head
    k_md = meta_offset(h64, heads, D, K_BITS, K_G, K_SYM, K_PLANES, 4)  # codes to scales, in words
    v_md = meta_offset(h64, heads, D, V_BITS, V_G, V_SYM, V_PLANES, 4)
    if not HAS_TAIL or split < num_splits:
        row = tl.load(rows_ptr + b).to(tl.int64) if PAGED else b64
        lo = base + split * chunk
        hi = tl.minimum(lo + chunk, packed)
        if K_CHANNEL:  # full pages; the filling one is the last program's
            hi = tl.minimum(hi, packed // K_G * K_G)
        k_at0 = (b64 * k_sb + h64 * k_sh) * K_VEC  # int32 words; k_sb is 0 when paged
        v_at0 = (b64 * v_sb + h64 * v_sh) * V_VEC
        m, denom, acc = packed_part(
            q, k_words, k_half, v_words, v_half, table_ptr, row, k_at0, v_at0, k_st, v_st, k_md,
            v_md, stride_table, lo, hi, qpos, window, score_scale, cap_log2, rope, pages, D, BT,
            K_BITS, K_G, K_SYM, K_VEC, V_BITS, V_G, V_SYM, V_VEC, PAGED, WINDOW, SOFTCAP, False,
            DOT_IEEE, ROPE_HALF, 1 if K_CHANNEL else 0, ONE_WARP, NARROW, ROPE_PAIRS,
        )  # fmt: skip
    elif K_CHANNEL:  # the filling page's own program: its staged values
        row = tl.load(rows_ptr + b).to(tl.int64)
        m, denom, acc = packed_part(
            q, k_words, k_half, v_words, v_half, table_ptr, row, 0, h64 * v_sh * V_VEC, k_st,
            v_st, k_md, v_md, stride_table, packed // K_G * K_G, packed, qpos, window,
            score_scale, cap_log2, rope, pages, D, BT, K_BITS, K_G, K_SYM, K_VEC, V_BITS, V_G,
            V_SYM, V_VEC, PAGED, WINDOW, SOFTCAP, False, DOT_IEEE, ROPE_HALF, 2, ONE_WARP, NARROW,
            ROPE_PAIRS,
        )  # fmt: skip
    else:  # the tail's own program, 16 tokens a tile (32 spilled 24 bytes on one warp)
        kt_base = kt_ptr + b64 * kt_sb + h64 * kt_sh
        vt_base = vt_ptr + b64 * vt_sb + h64 * vt_sh
        m, denom, acc = _tail_part(
            q, kt_base, vt_base, kt_st, vt_st, tail_len, packed, start, qpos, window,
            score_scale, cap_log2, rope, D, 16, HAS_START, WINDOW, SOFTCAP, DOT_IEEE, ROPE_HALF,
            K_BITS, ONE_WARP, ROPE_PAIRS,
        )  # fmt: skip
    at = ((b64 * tl.num_programs(1) + h64) * GROUP + r) * tl.num_programs(2) + split
    store_partial(o_ptr, lse_ptr, at, m, denom, acc, q_ok)  # [B, Hq, parts] partials


@dataclass(frozen=True)
class DecodePlan:
    """How one decode launch is cut: packed-token splits, tokens a tile, Triton's warps and
    pipeline stages (None: Triton's default), and a cap on registers a thread (ptxas'
    ``maxnreg``; None: the compiler's choice, or with ``fit_registers`` the lowest of
    :data:`REGISTER_CAPS` whose build on this GPU spills nothing and holds more programs an SM,
    chosen at the build's first launch: :func:`_fitted_cap`). A cap that spills loses: on an
    H200 the one-warp KV4 g32 tile ran at 0.80× its uncapped speed at 168 registers (104 bytes
    spilled) and 0.68-0.70× at 128."""

    splits: int
    block_tokens: int = 32
    num_warps: int = 4
    num_stages: int | None = 2
    max_registers: int | None = None
    fit_registers: bool = False

    def __post_init__(self) -> None:
        bt, regs = self.block_tokens, self.max_registers
        if self.splits < 1 or bt < 16 or bt & (bt - 1):
            raise ValueError(f"need splits >= 1 and power-of-two block_tokens >= 16: {self}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")
        if regs is not None and not 64 <= regs <= 255:
            raise ValueError(f"max_registers must be None or 64..255, got {regs}")


def plan_decode(batch: AttentionBatch, *, sms: int | None = None) -> DecodePlan:
    """Tiles as timed on an H200 (docs/results/gpu.md) or, where marked, as the sm_90a build
    predicts; splits from batch × KV heads × context × SMs (``sms`` None: the device's own; on
    CPU the interpreter's 1–2) at the tile's warps and, for one warp, the programs an SM its
    build holds (known once the build has run on this GPU: :func:`_remember`).

    One warp, 2 stages (no cross-warp softmax), at d <= 128:
    - 32 tokens for keys stored after RoPE: a pool's token rows (timed: at 32-64 × 8192 and
      16-64 × 32768 KV4 g32 ran at 1.10-1.15× bf16 SDPA against 0.67× on 64 tokens × 4
      warps, KV8 g64 at 0.81-0.88× against 0.61-0.66×, K8V4 at 0.90-0.91×) and, build-
      predicted, the HF cache's rows with a tail and KIVI pages (38 and 45 instructions a key
      against 49 and 65 on 4 warps at 4 bits; 61-65 against 89-91 at 3/5/6, whose pages
      spilled on one warp until keys came first); and for token rows of pre-RoPE keys
      rotated over part of the row (build-predicted: 52-62 against 69-95). KV4 g128 and KV3
      g32 (rows read in 4-byte copies) ran at 0.58× and 0.36× there, against 0.54× and 0.34×
      at their best tile of 2-4 warps (64 × 32768); KV3 g32 rows of format v3 (two planes)
      read in 16-byte copies, 41.7 instructions a key against 60.5 (build-predicted); and
      token rows of keys rotated over the whole row since a tile's keys turn by a table
      (:func:`.packed_rows.stepped_rope`; build-predicted, Triton 3.6: KV4 g32 46.0
      instructions a key against 56.5 on 16 tokens, KV8 g32 48.2 against 60.9, KV3 g32 57.9
      against 70.0, at 8 programs an SM against 12; the H200 issued a 16-token tile at 12
      warps an SM as fast as a 32-token one at 8);
    - 32 tokens for KIVI pages of 4-bit pre-RoPE keys rotated over the whole row, turned by
      the table (build-predicted, Triton 3.6: 58.9 instructions a key against 68.4 on 16, at
      255 registers and 8 programs an SM; 3.9: 53.9 against 72.1);
    - 16 tokens for other KIVI pages of pre-RoPE keys (build-predicted: 69-104 instructions a
      key against 112; 3 bits: 98 against 120; on 32, 3.9 spilled 48 bytes at 3 bits) and
      token rows of 8-bit keys in groups of 64 rotated over the whole row (KV8 g64 timed at
      0.41-0.43× bf16 SDPA, against 0.36-0.39× on 64 tokens × 4 warps; on 32 tokens Triton
      3.9 spilled 16-24 bytes).
    Those builds: 122-255 registers, 8-16 programs an SM, no spill (keys dotted first,
    :func:`.tiles._qk`). The rest, d > 128 or
    pre-RoPE keys with a tail: 64 tokens on 4 warps where K and V are
    :func:`.packed_rows.wide_rows` at d <= 128 and the keys not pre-RoPE or of 4 bits (3 stages
    where rows load 16 bytes at a time and keys are not pre-RoPE); pre-RoPE keys rotated over
    at least half the row: 16 tokens on 8 warps (2 stages at a full width and 16-byte rows,
    else unpipelined); else 32 tokens on 4 warps, 2 stages."""
    tile = _one_warp_tile(batch) or _multi_warp_tile(batch)
    tile["block_tokens"] = page_tile(batch, tile["block_tokens"])
    uncapped = _build_key(batch, **tile)
    tile["max_registers"] = _FITTED.get(uncapped)  # None until launched
    per_sm = _PROGRAMS_AN_SM.get(_build_key(batch, **tile), GUESSED_PROGRAMS_AN_SM)
    splits = choose_splits(batch.batch_size, batch.kv_heads, batch.span, batch.q.device,
                           sms=sms, num_warps=tile["num_warps"],
                           programs_an_sm=per_sm)  # fmt: skip
    return DecodePlan(splits, **tile, fit_registers=uncapped not in _FITTED)  # fitted once


# caps a build may take to hold more programs an SM (ptxas' maxnreg), lowest first: 16, 14,
# 13, 12, 11 and 10 one-warp programs at Hopper's 65,536 registers. Which spill is the
# compiler's to say: at one-warp KV4 g32 the sm_90a build spills nothing at 128 under Triton 3.6
# (157 registers, 12 programs uncapped) and 16 bytes under 3.9, whose build fits 144 (162
# uncapped, 12 programs); KV8 g64 in planes spills at 128 and 144 under both and fits 152 (3.9:
# 223 registers uncapped, 9 programs, against 13; 3.6: 167, 12 against 13)
REGISTER_CAPS = (128, 144, 152, 168, 184, 200)
# the cap each build (its key uncapped) launches at, fitted at its first launch: :func:`_fitted_cap`
_FITTED: dict[tuple, int | None] = {}


# programs an SM of each decode build launched on this process's GPUs (from its registers and
# shared memory: :func:`_remember`); a build not launched yet is planned at the guess (the
# one-warp tile held 8 before its value tiles came in lane order, 10-12 since, 11-16 with keys
# dotted first: sm_90a)
_PROGRAMS_AN_SM: dict[tuple, int] = {}
GUESSED_PROGRAMS_AN_SM = 8


def _build_key(batch: AttentionBatch, block_tokens: int, num_warps: int,
               num_stages: int | None, max_registers: int | None = None) -> tuple:  # fmt: skip
    """What the decode kernel's build depends on (its arguments' alignment aside)."""
    rotary = None if batch.rope_freq is None else batch.rope_freq.shape[0]
    return (batch.q.device, batch.q.dtype, batch.k_spec, batch.v_spec, batch.q.shape[-2],
            batch.head_dim, batch.kv_heads, batch.slot_table is None, batch.k_tail is None,
            batch.starts is None, batch.window is None, batch.logit_cap is None, rotary,
            batch.planes, block_tokens, num_warps, num_stages, max_registers)  # fmt: skip


def measured_builds() -> int:
    """How many decode builds this process has measured (:func:`_remember`)."""
    return len(_PROGRAMS_AN_SM)


def _remember(batch: AttentionBatch, plan: DecodePlan, kernel) -> None:
    """Record the programs an SM of a build just launched on a GPU (``kernel``: Triton's
    compiled kernel, its registers and shared memory), for :func:`plan_decode`'s splits; a
    kernel object without them leaves the guess."""
    key = _build_key(batch, plan.block_tokens, plan.num_warps, plan.num_stages,
                     plan.max_registers)  # fmt: skip
    registers = getattr(kernel, "n_regs", None)
    shared = getattr(getattr(kernel, "metadata", None), "shared", None)
    if key in _PROGRAMS_AN_SM or registers is None or shared is None:
        return
    _PROGRAMS_AN_SM[key] = _programs(kernel, plan.num_warps, batch.q.device)


def _programs(kernel, num_warps: int, device: torch.device) -> int:
    """Programs an SM of Triton's compiled ``kernel`` (loaded: its registers known) on
    ``device``: its own limits on a GPU, Hopper's off one (a build for sm_90a on a CPU)."""
    limits = {}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        limits = dict(
            sm_registers=getattr(props, "regs_per_multiprocessor", 65536),
            sm_shared=getattr(props, "shared_memory_per_multiprocessor", 233472),
            sm_warps=getattr(props, "max_threads_per_multi_processor", 2048) // 32,
        )
    return programs_an_sm(kernel.n_regs, kernel.metadata.shared, num_warps, **limits)


def _fitted_cap(batch: AttentionBatch, plan: DecodePlan, build) -> int | None:
    """The cap of :data:`REGISTER_CAPS` a build launches at (None: none), chosen once a build
    key: the lowest whose build (``build(cap)``: Triton's compiled kernel, loaded) spills
    nothing and holds more programs an SM than the uncapped one (sm_90a, Triton 3.6: one-warp
    KV4 g32 945 loop instructions a tile at 157 registers, 956 at 128, 16 programs an SM
    against 12; under 3.9 at 144, 852 against 864, 14 against 12). Caps below the uncapped
    build's registers only, so at most a few compiles more. Unmeasured on a GPU."""
    key = _build_key(batch, plan.block_tokens, plan.num_warps, plan.num_stages)
    if key not in _FITTED:
        _FITTED[key] = _lowest_cap(build, plan.num_warps, batch.q.device)
    return _FITTED[key]


def _maxnreg(cap: int | None) -> dict:
    return {"maxnreg": cap} if cap else {}


def _loaded(kernel):
    """Triton's compiled ``kernel`` with its registers and local bytes read (``n_regs``,
    ``n_spills``), as Triton's fused-softmax tutorial reads them after a warmup."""
    kernel._init_handles()
    return kernel


def _lowest_cap(build, num_warps: int, device: torch.device) -> int | None:
    uncapped = build(None)
    if not getattr(uncapped, "n_regs", None):  # a driver that reports no registers: no cap
        return None
    most = _programs(uncapped, num_warps, device)
    for cap in REGISTER_CAPS:
        if cap >= uncapped.n_regs:
            return None
        kernel = build(cap)
        if kernel.n_spills == 0 and _programs(kernel, num_warps, device) > most:
            return cap
    return None


def _one_warp_tile(batch: AttentionBatch) -> dict | None:
    """:func:`plan_decode`'s one-warp tiles, None where the batch takes more warps."""
    kivi = kivi_keys(batch)
    if batch.head_dim > 128:
        return None
    if batch.rope_freq is None:
        return dict(block_tokens=32, num_warps=1, num_stages=2)
    partial = 2 * batch.rope_freq.shape[0] < batch.head_dim
    k = batch.k_spec  # 8-bit keys in groups of 64 over the whole row: 32 keys spilled (3.9)
    spilled = not partial and k.bits == 8 and k.group_size == 64
    if not kivi and batch.k_tail is None and not spilled:
        return dict(block_tokens=32, num_warps=1, num_stages=2)
    if kivi and not partial and k.bits == 4:  # 32-key pages turn by a table (3 bits spilled)
        return dict(block_tokens=32, num_warps=1, num_stages=2)
    if kivi or batch.k_tail is None:
        return dict(block_tokens=16, num_warps=1, num_stages=2)
    return None


def _multi_warp_tile(batch: AttentionBatch) -> dict:
    """:func:`plan_decode`'s tiles of 4-8 warps (d > 128, and what spilled on one warp)."""
    kivi = kivi_keys(batch)
    rotary = 0 if batch.rope_freq is None or kivi else 2 * batch.rope_freq.shape[0]
    vec = min(batch.k_vec, batch.v_vec)
    wide = batch.head_dim <= 128 and wide_rows(batch.k_spec, batch.v_spec)
    if wide and (not rotary or batch.k_spec.bits == 4):  # pre-RoPE: 4-bit keys measured
        return dict(block_tokens=64, num_warps=4, num_stages=3 if vec == 4 and not rotary else 2)
    if 2 * rotary >= batch.head_dim:
        stages = 2 if rotary == batch.head_dim and vec == 4 else 1
        return dict(block_tokens=16, num_warps=8, num_stages=stages)
    return dict(block_tokens=32, num_warps=4, num_stages=2)


def _within_pages(batch: AttentionBatch, plan: DecodePlan) -> DecodePlan:
    """KIVI pages: tiles of at most a page (:func:`.packed_rows.page_tile`)."""
    tile = page_tile(batch, plan.block_tokens)
    return plan if tile == plan.block_tokens else dataclasses.replace(plan, block_tokens=tile)


def _query_rows(group: int, plan: DecodePlan) -> int:
    """Rows of q a program holds (its ``Hq / Hkv`` heads, padded): one warp dots keys first
    (:func:`.tiles._qk`), the heads the MMA's columns, 8 wide (4 padded to 16 were 182
    registers and 64 MMAs a KV4 g32 tile, against 167 and 32 at 8; below 8, 16 bytes spilled
    at KV2 g32); more warps dot q first, its rows the MMA's 16 (keys first took 4 more programs'
    worth of registers at KIVI K3 V3 pages and 31 more instructions a tile at d 256)."""
    return max(8 if plan.num_warps == 1 else 16, next_power_of_2(group))


def serves(batch: AttentionBatch) -> bool:
    """Whether :func:`launch_decode` runs this batch: one query token per request (not ragged),
    token-axis (or 16-bit) K and V as :func:`.packed_rows.decodable` says, rows aligned to 4
    bytes, pre-RoPE keys only as :func:`.rope_rows.rope_decodable` says (R/2 >= 16, halves of
    whole words or chunks, keys neither smoothed nor Hadamard-rotated), KIVI keys only in a
    pool's pages as :func:`.packed_rows.pages_decodable` says. The rest (extend, the HF cache's
    KIVI blocks, KIVI pages with a window, 2/4/8 bits in groups smaller than a word's codes,
    3/5/6 bits at a head_dim not a multiple of 32, narrower rotary halves) runs :mod:`.kernel`."""
    return (
        batch.q_tokens == 1
        and batch.qo_indptr is None
        and rope_decodable(batch)
        and batch.k_delta == 0
        and keys_decodable(batch)
        and decodable(batch.v_spec, batch.head_dim)
        and batch.k_vec > 0
        and batch.v_vec > 0
    )


def launch_decode(
    batch: AttentionBatch,
    q: torch.Tensor,
    k_tail: torch.Tensor | None,
    v_tail: torch.Tensor | None,
    plan: DecodePlan,
    *,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[B, 1, Hq, D] in ``out_dtype`` of a batch :func:`serves`; ``q`` [B, 1, Hq, D] and the
    tails as the kernel reads them (rotated, smoothed), the rest from ``batch``."""
    if not serves(batch):
        raise ValueError("launch_decode: this batch is for the general kernel (see serves())")
    plan = _within_pages(batch, plan)  # a caller's block_tokens too
    bsz, hq, dim, hkv = batch.batch_size, q.shape[-2], batch.head_dim, batch.kv_heads
    paged = batch.slot_table is not None
    chunk, splits = split_chunk(batch, plan.splits, plan.block_tokens)
    tail_len = 0 if k_tail is None else k_tail.shape[2]
    parts = splits + (1 if tail_len or kivi_keys(batch) else 0)  # the tail or the filling page
    dev = q.device
    partial = torch.empty(bsz, hq, parts, dim, dtype=torch.float32, device=dev)
    lse = torch.empty(bsz, hq, parts, dtype=torch.float32, device=dev)
    k_args, v_args = rows_args(batch, "k"), rows_args(batch, "v")
    empty = placeholder(q, dim)  # no tail, no KIVI stage: pointers never read
    k_tail, v_tail = (empty, empty) if k_tail is None else (k_tail, v_tail)
    table = batch.slot_table if paged else batch.lengths  # unused pointers: any int tensor
    rows = table_rows(batch) if paged else batch.lengths
    starts = batch.starts if batch.starts is not None else batch.lengths
    freq, k_pos0, rope_half = kernel_rope(batch)
    steps = rope_steps(batch, plan.block_tokens, q.dtype)
    steps = freq if steps is None else steps  # none read: any pointer
    stage = batch.k_stage if batch.k_stage is not None else empty  # [rows, G, Hkv, D]
    stage_rows = batch.k_stage_rows if batch.k_stage is not None else batch.lengths
    args = (
        q, k_args[0], k_args[1], v_args[0], v_args[1], k_tail, v_tail, table, rows,
        batch.lengths, starts, partial, lse, freq, steps, k_pos0, stage, stage_rows, q.stride(0),
        q.stride(2), *k_args[2:], *v_args[2:], *k_tail.stride()[:3], *v_tail.stride()[:3],
        *stage.stride()[:3], table.stride(0) if paged else 0, tail_len, chunk, splits,
    )  # fmt: skip
    meta = _constexprs(batch, q, plan, has_tail=parts > splits, rope_half=rope_half)
    _launch((bsz, hkv, parts), args, meta, batch, plan)
    return merge_splits(partial, lse, batch.sinks, out_dtype).view(bsz, 1, hq, dim)


def _constexprs(batch: AttentionBatch, q: torch.Tensor, plan: DecodePlan, has_tail: bool,
                rope_half: int) -> dict:  # fmt: skip
    """The decode kernel's constexprs and Triton's launch options for ``plan`` (its cap aside);
    ``rope_half``: R/2 of pre-RoPE keys, 0 without (:func:`.rope.kernel_rope`)."""
    k, v, group = batch.k_spec, batch.v_spec, q.shape[-2] // batch.kv_heads
    return dict(
        **softmax_args(batch), D=batch.head_dim, GROUP=group, QP=_query_rows(group, plan),
        BT=plan.block_tokens, K_BITS=k.bits,
        K_G=k.group_size, K_SYM=k.symmetric and k.is_quantized, K_VEC=batch.k_vec, V_BITS=v.bits,
        V_G=v.group_size, V_SYM=v.symmetric and v.is_quantized, V_VEC=batch.v_vec,
        PAGED=batch.slot_table is not None, HAS_START=batch.starts is not None,
        DOT_IEEE=q.dtype == torch.float32, HAS_TAIL=has_tail, ROPE_HALF=rope_half,
        K_CHANNEL=kivi_keys(batch), ONE_WARP=plan.num_warps == 1, K_PLANES=batch.in_planes("k"),
        V_PLANES=batch.in_planes("v"), NARROW=narrow_offsets(batch),
        num_warps=plan.num_warps, **({"num_stages": plan.num_stages} if plan.num_stages else {}),
    )  # fmt: skip


def _launch(grid: tuple, args: tuple, meta: dict, batch: AttentionBatch, plan: DecodePlan):
    """The decode kernel at ``plan``'s cap on registers, fitted at a build's first launch
    where the plan asks (:func:`_fitted_cap`); a GPU's build's programs an SM remembered."""
    if plan.fit_registers and plan.max_registers is None and not interpreted():
        cap = _fitted_cap(batch, plan, lambda cap: _loaded(
            _decode_kernel.warmup(*args, grid=grid, **meta, **_maxnreg(cap))))  # fmt: skip
        plan = dataclasses.replace(plan, max_registers=cap)
    kernel = _decode_kernel[grid](*args, **meta, **_maxnreg(plan.max_registers))
    if batch.q.is_cuda:
        _remember(batch, plan, kernel)
