"""vLLM 0.32's TurboQuant KV-cache presets (``--kv-cache-dtype turboquant_*``), in torch.

Read from vLLM 0.32: ``model_executor/layers/quantization/turboquant/config.py`` (presets, slot
sizes, boundary layers) and ``centroids.py`` (Lloyd-Max tables),
``v1/attention/ops/triton_turboquant_store.py`` (store launcher and kernels),
``v1/attention/ops/triton_turboquant_decode.py`` (decode and dequant kernels),
``v1/attention/backends/turboquant_attn.py`` (rotation, midpoints, prefill/decode routing),
``v1/kv_cache_interface.py`` and ``engine/arg_utils.py`` (page size, skipped layers).

=================== ===== ======================== ===== ======================== =========
preset              K     key numerics             V     value numerics           NC
=================== ===== ======================== ===== ======================== =========
turboquant_k8v4     8     fp8 e4m3 cast            4     uniform, asymmetric      no
turboquant_4bit_nc  4     Lloyd-Max, rotated       4     uniform, asymmetric      yes
turboquant_k3v4_nc  3     Lloyd-Max, rotated       4     uniform, asymmetric      yes
turboquant_3bit_nc  3     Lloyd-Max, rotated       3     uniform, asymmetric      yes
=================== ===== ======================== ===== ======================== =========

Per token and KV head, vLLM writes one slot: ``[key bytes | value bytes]``, rounded up to an
even size (``TurboQuantConfig.slot_size_aligned``, the page's ``state_content_bytes``).

- **Lloyd-Max keys** (3 or 4 bits): in fp32, ``n = ||k||`` (torch ``norm``),
  ``y = (k / (n + 1e-8)) @ H`` with ``H`` the Sylvester Hadamard matrix divided by
  ``sqrt(D)`` (orthonormal and symmetric; no random signs, one matrix for every layer).
  Each ``y_i`` gets the index of its Lloyd-Max centroid for N(0, 1/D): the number of fp32
  midpoints ``(c_j + c_{j+1}) / 2`` that are ``<= y_i`` (the kernel's binary search, ties go
  up). Codes pack little-endian: 4-bit two per byte (element 2i in the low nibble); 3-bit
  eight per three bytes (element j of a group at bit 3j). Then ``n`` as fp16.
  Key bytes: ``ceil(D * bits / 8) + 2``.
- **Norm correction** ("nc"): the decode kernel reads the centroid vector ``c`` renormalised,
  ``c_hat = c / sqrt(sum(c^2) + 1e-16)``, and scores ``n_fp16 * (q H) . c_hat``: the key
  attention sees is ``n_fp16 * c_hat @ H`` in the model's basis (:func:`read`), whose norm is
  the stored fp16 norm. Without it (no preset) the kernel uses ``n_fp16 * c``.
- **fp8 keys** (k8v4): the key cast to fp8 e4m3 (round to nearest even, saturating, as
  Triton's ``cvt.rn.satfinite`` on sm_89+), no rotation, no scale. Key bytes: ``D``.
- **Values** (3 or 4 bits), unrotated, in fp32: ``scale = (max - min) / (2^b - 1)``, floored
  ``where(scale > 1e-8, scale, 1e-8)``; ``q = clamp(trunc((v - min) / scale + 0.5), 0,
  2^b - 1)`` (round half up), packed as the key codes; then ``scale`` and ``min`` as fp16.
  The read is ``q * scale_fp16 + min_fp16`` in fp32, so the fp16 rounding of ``min`` shifts
  every element of a row. Value bytes: ``ceil(D * bits / 8) + 4``.

Head sizes: the Lloyd-Max presets need a power-of-two head_dim (vLLM's Hadamard is D x D only
then; otherwise its store GEMM fails) of at least 8 (3-bit groups of eight); k8v4 needs an even
head_dim (vLLM allocates no Hadamard there).

Skipped layers: vLLM adds :func:`boundary_skip_layers` (the first two and last two layers of a
dense model; none for a hybrid attention/Mamba model) to ``--kv-cache-dtype-skip-layers``
itself, always, as a union with whatever the user lists: those layers keep the model's dtype.

What is emulated is the cache read: every token stored, then read back, as a decode step (and
a prefill continuation chunk of at most 128 tokens, which vLLM runs through the decode kernel)
sees it. vLLM's first prefill chunk attends over the unquantized K/V instead, and a longer
continuation chunk attends over its own unquantized K/V plus the cache dequantized to fp16 (and
un-rotated by an fp16 GEMM); what a query sees therefore depends on vLLM's chunk schedule.

vLLM runs these presets for fp16 and bf16 models (``TurboQuantAttentionBackend.supported_dtypes``).

Tested against vLLM's own code (tests/runtime_loader/vllm/test_turboquant_bitexact.py), its
Triton kernels under TRITON_INTERPRET=1 (IEEE fp32): the slot bytes its store launcher writes,
its centroid and Hadamard tables and page sizes, bit for bit; its fp16 full-dequant kernel's K
(rotated basis) and V, bit for bit; its decode attention, to fp32 rounding. Not reproduced: on a
GPU the norm and the rotation GEMM (cuBLAS) reduce in another order, Triton's fp32 ``/`` is
``div.full.f32`` and ``tl.sqrt`` approximate, so a code can move across a boundary and ``c_hat``
differ in its last bits, rarely; on Ampere (sm < 8.9) vLLM stores and reads k8v4 keys as
Triton's fp8e4b15 (exponent bias 15: a far smaller range), and on ROCm with FlyDSL (gfx950) it
lays a block out another way (SoA) with other kernels; neither is emulated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from itertools import pairwise

import torch

__all__ = [
    "PRESETS",
    "TurboQuantPreset",
    "boundary_skip_layers",
    "centroids",
    "fake_quantize",
    "hadamard",
    "head_bytes",
    "midpoints",
    "read",
    "read_rotated",
    "slot_bytes",
    "store",
    "to_slot",
]

FP8_MAX = 448.0  # float8_e4m3fn
NORM_EPS = 1e-8  # the store's k / (||k|| + 1e-8)
NC_EPS = 1e-16  # the decode kernel's 1 / sqrt(sum c^2 + 1e-16)
_SCALE_FLOOR = torch.tensor(1e-8, dtype=torch.float32)  # the value store's fp32 floor
_LLOYD_ITERS, _LLOYD_TOL, _TRAPZ_STEPS = 200, 1e-10, 200  # vLLM's solve_lloyd_max defaults


@dataclass(frozen=True)
class TurboQuantPreset:
    """One vLLM TurboQuant preset: bits per side and the decode's norm correction."""

    name: str
    key_bits: int  # 8: fp8 e4m3 keys; 3 or 4: Lloyd-Max codes on rotated unit keys
    value_bits: int  # 3 or 4: uniform asymmetric codes, fp16 scale and zero
    norm_correction: bool  # the decode renormalises each key's centroid vector

    def __post_init__(self) -> None:
        if self.key_bits not in (3, 4, 8):
            raise ValueError(f"{self.name}: key_bits must be 3, 4 or 8, got {self.key_bits!r}")
        if self.value_bits not in (3, 4):
            raise ValueError(f"{self.name}: value_bits must be 3 or 4, got {self.value_bits!r}")
        if not isinstance(self.norm_correction, bool):
            raise ValueError(f"{self.name}: norm_correction must be a bool")
        if self.key_fp8 and self.norm_correction:
            raise ValueError(f"{self.name}: fp8 keys have no centroids to renormalise")

    @property
    def key_fp8(self) -> bool:
        return self.key_bits == 8

    def bits(self, which: str) -> int:
        return {"k": self.key_bits, "v": self.value_bits}[_check_which(which)]

    def check_head_dim(self, head_dim: int) -> None:
        """Raise unless vLLM runs this preset at ``head_dim`` (see the module docstring)."""
        d = head_dim
        if self.key_fp8:
            if d < 2 or d % 2:
                raise ValueError(f"{self.name} needs an even head_dim, got {d}")
        elif d < 8 or d & (d - 1):
            raise ValueError(f"{self.name} needs a power-of-two head_dim >= 8, got {d}")


PRESETS: dict[str, TurboQuantPreset] = {
    p.name: p
    for p in (
        TurboQuantPreset("turboquant_k8v4", 8, 4, False),
        TurboQuantPreset("turboquant_4bit_nc", 4, 4, True),
        TurboQuantPreset("turboquant_k3v4_nc", 3, 4, True),
        TurboQuantPreset("turboquant_3bit_nc", 3, 3, True),
    )
}


def _check_which(which: str) -> str:
    if which not in ("k", "v"):
        raise ValueError(f"which must be 'k' or 'v', got {which!r}")
    return which


def _preset(preset: TurboQuantPreset | str) -> TurboQuantPreset:
    if isinstance(preset, TurboQuantPreset):
        return preset
    if preset not in PRESETS:
        names = ", ".join(PRESETS)
        raise ValueError(f"unknown TurboQuant preset {preset!r}; choose one of {names}")
    return PRESETS[preset]


# ── tables: Lloyd-Max centroids, midpoints, Hadamard ─────────────────────────────────────────


def _trapezoid(f, a: float, b: float) -> float:
    """vLLM's trapezoid rule: 200 steps, summed left to right in Python floats."""
    h = (b - a) / _TRAPZ_STEPS
    total = 0.5 * (f(a) + f(b))
    for i in range(1, _TRAPZ_STEPS):
        total += f(a + i * h)
    return total * h


@functools.cache
def _lloyd_max(d: int, bits: int) -> tuple[float, ...]:
    """Lloyd-Max centroids for N(0, 1/d), as vLLM's ``solve_lloyd_max`` computes them (same
    float64 operations in the same order, so the fp32 tables are equal)."""
    levels, var = 1 << bits, 1.0 / d
    lo = -3.5 * math.sqrt(var)
    hi = -lo
    coef = 1.0 / math.sqrt(2 * math.pi * var)

    def pdf(x: float) -> float:
        return coef * math.exp(-x * x / (2 * var))

    def first_moment(x: float) -> float:
        return x * pdf(x)

    cents = [lo + (hi - lo) * (i + 0.5) / levels for i in range(levels)]
    for _ in range(_LLOYD_ITERS):
        cuts = [lo * 3, *((a + b) / 2.0 for a, b in pairwise(cents)), hi * 3]  # [levels + 1]
        new = []
        for i, (a, b) in enumerate(pairwise(cuts)):
            mass = _trapezoid(pdf, a, b)
            new.append(_trapezoid(first_moment, a, b) / mass if mass > 1e-15 else cents[i])
        if max(abs(new[i] - cents[i]) for i in range(levels)) < _LLOYD_TOL:
            break  # vLLM returns the table before this last update
        cents = new
    return tuple(cents)


def centroids(head_dim: int, bits: int) -> torch.Tensor:
    """vLLM's sorted Lloyd-Max centroids [2^bits] (fp32) for rotated unit keys of ``head_dim``."""
    return torch.tensor(_lloyd_max(head_dim, bits), dtype=torch.float32)


def midpoints(head_dim: int, bits: int) -> torch.Tensor:
    """The store's decision boundaries [2^bits - 1]: fp32 means of neighbouring centroids."""
    c = centroids(head_dim, bits)
    return (c[:-1] + c[1:]) / 2


@functools.cache
def _hadamard(d: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < d:  # Sylvester: [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def hadamard(d: int) -> torch.Tensor:
    """vLLM's rotation [d, d] (fp32): Sylvester Hadamard / sqrt(d), orthonormal and symmetric
    (vLLM's ``Pi`` and ``PiT`` are this one matrix)."""
    return _hadamard(d).clone()


# ── bit packing (little-endian, as the store kernel writes and the decode kernel reads) ──────


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (0 .. 2^bits - 1) -> bytes [..., ceil(D * bits / 8)] uint8."""
    q = q.to(torch.int32)
    if bits == 4:  # element 2i low nibble, 2i+1 high nibble
        return (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)
    groups = q.reshape(*q.shape[:-1], -1, 8)  # [..., D/8, 8]: eight codes in 24 bits
    word = (groups << (3 * torch.arange(8, dtype=torch.int32))).sum(-1)  # [..., D/8]
    out = torch.stack([word & 0xFF, (word >> 8) & 0xFF, word >> 16], -1)  # [..., D/8, 3]
    return out.reshape(*q.shape[:-1], -1).to(torch.uint8)


def _unpack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Bytes [..., ceil(D * bits / 8)] uint8 -> codes [..., D] int64."""
    c = codes.long()
    if bits == 4:
        return torch.stack([c & 0xF, c >> 4], -1).reshape(*c.shape[:-1], -1)
    b = c.reshape(*c.shape[:-1], -1, 3)  # [..., D/8, 3]
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)  # [..., D/8]
    q = (word[..., None] >> (3 * torch.arange(8))) & 0x7  # [..., D/8, 8]
    return q.reshape(*c.shape[:-1], -1)


# ── store ─────────────────────────────────────────────────────────────────────────────────────


def _store_key_lloyd(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (codes [..., D*bits/8] uint8, norms [...] fp16), the store launcher's torch
    prologue on rows [R, D] (as it flattens [N, H, D]) and its kernel's bucketize and pack."""
    d = x.shape[-1]
    rows = x.float().reshape(-1, d)  # [R, D]
    norms = rows.norm(dim=1, keepdim=True)  # [R, 1] fp32
    rotated = (rows / (norms + NORM_EPS)) @ _hadamard(d)  # [R, D]: rotated unit keys
    idx = torch.bucketize(rotated, midpoints(d, bits), right=True)  # midpoints <= y
    codes = _pack(idx, bits).reshape(*x.shape[:-1], -1)
    return codes, norms.reshape(x.shape[:-1]).to(torch.float16)


def _store_value(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., D] -> (codes [..., D*bits/8] uint8, scale [...] fp16, zero [...] fp16)."""
    v = x.float()  # [..., D]
    lo, hi = v.amin(-1, keepdim=True), v.amax(-1, keepdim=True)  # [..., 1]
    qmax = (1 << bits) - 1
    scale = (hi - lo) / float(qmax)
    scale = torch.where(scale > _SCALE_FLOOR, scale, _SCALE_FLOOR)
    q = ((v - lo) / scale + 0.5).trunc().clamp(0, qmax)  # .to(int32): toward zero, then clamp
    half = (scale.squeeze(-1).to(torch.float16), lo.squeeze(-1).to(torch.float16))
    return _pack(q, bits), *half


def _store_key_fp8(x: torch.Tensor) -> tuple[torch.Tensor]:
    """x [..., D] -> (fp8 e4m3 [..., D],): round to nearest even, saturating at ±448."""
    return (x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn),)


def store(x: torch.Tensor, which: str, preset: TurboQuantPreset | str) -> tuple[torch.Tensor, ...]:
    """x [..., D] (post-RoPE states, model dtype) -> what vLLM's slot holds for that side:
    Lloyd-Max keys ``(codes uint8 [..., ceil(D*bits/8)], norm fp16 [...])``; fp8 keys
    ``(codes float8_e4m3fn [..., D],)``; values ``(codes uint8 [..., ceil(D*bits/8)],
    scale fp16 [...], zero fp16 [...])``. :func:`to_slot` lays them out as the page does."""
    p = _preset(preset)
    p.check_head_dim(x.shape[-1])
    if _check_which(which) == "v":
        return _store_value(x, p.value_bits)
    return _store_key_fp8(x) if p.key_fp8 else _store_key_lloyd(x, p.key_bits)


# ── read ──────────────────────────────────────────────────────────────────────────────────────


def read_rotated(stored: tuple[torch.Tensor, ...], preset: TurboQuantPreset | str) -> torch.Tensor:
    """Lloyd-Max keys: what the decode kernel dots the rotated query ``q @ H`` with, fp32
    ``n_fp16 * c_hat`` [..., D] (``c_hat`` the centroid vector, renormalised under nc)."""
    p = _preset(preset)
    if p.key_fp8:
        raise ValueError(f"{p.name} stores fp8 keys in the model's basis; use read()")
    codes, norms = stored
    d = codes.shape[-1] * 8 // p.key_bits
    c = centroids(d, p.key_bits)[_unpack(codes, p.key_bits)]  # [..., D] fp32
    if p.norm_correction:
        c = c * (1.0 / torch.sqrt((c * c).sum(-1, keepdim=True) + NC_EPS))
    return norms.float()[..., None] * c


def read(
    stored: tuple[torch.Tensor, ...],
    which: str,
    preset: TurboQuantPreset | str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The K or V vLLM's decode attention effectively uses, in the model's basis, [..., D] in
    ``dtype``: Lloyd-Max keys ``read_rotated @ H`` (``(q H) . k_r = q . (k_r H)``, H symmetric
    and orthonormal); fp8 keys their fp32 value; values ``q * scale + zero`` (fp32). The
    kernel keeps these in fp32: a narrower ``dtype`` rounds them once more."""
    p = _preset(preset)
    if _check_which(which) == "v":
        codes, scale, zero = stored
        q = _unpack(codes, p.value_bits).float()  # [..., D]
        return (q * scale.float()[..., None] + zero.float()[..., None]).to(dtype)
    if p.key_fp8:
        return stored[0].float().to(dtype)
    rotated = read_rotated(stored, p)
    return (rotated @ _hadamard(rotated.shape[-1])).to(dtype)


def fake_quantize(x: torch.Tensor, which: str, preset: TurboQuantPreset | str) -> torch.Tensor:
    """``read(store(x))`` in x's dtype: the K or V a decode step sees for states ``x``."""
    return read(store(x, which, preset), which, preset, x.dtype)


# ── page layout ───────────────────────────────────────────────────────────────────────────────


def head_bytes(preset: TurboQuantPreset | str, which: str, head_dim: int) -> int:
    """Slot bytes one token-head of that side takes (vLLM's ``key_packed_size`` /
    ``value_packed_size``): fp8 keys ``D``; Lloyd-Max keys ``ceil(D*b/8) + 2`` (fp16 norm);
    values ``ceil(D*b/8) + 4`` (fp16 scale and zero)."""
    p = _preset(preset)
    p.check_head_dim(head_dim)
    if _check_which(which) == "k" and p.key_fp8:
        return head_dim
    codes = math.ceil(head_dim * p.bits(which) / 8)
    return codes + (2 if which == "k" else 4)


def slot_bytes(preset: TurboQuantPreset | str, head_dim: int) -> int:
    """Page bytes per token and KV head (K and V together): vLLM's ``slot_size_aligned``, the
    two sides rounded up to an even size."""
    total = head_bytes(preset, "k", head_dim) + head_bytes(preset, "v", head_dim)
    return total + total % 2


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[...] fp16 -> [..., 2] uint8 little-endian; 1-byte tensors [..., n] -> [..., n] uint8."""
    if t.dtype == torch.float16:
        return t.contiguous()[..., None].view(torch.uint8)
    return t.contiguous().view(torch.uint8)


def to_slot(
    k_stored: tuple[torch.Tensor, ...],
    v_stored: tuple[torch.Tensor, ...],
    preset: TurboQuantPreset | str,
) -> torch.Tensor:
    """The page cell [..., slot_bytes] uint8 vLLM writes: key codes (and fp16 norm), value
    codes, fp16 scale, fp16 zero, then a zero pad byte when the sum is odd (vLLM leaves it
    unwritten)."""
    p = _preset(preset)
    if (len(k_stored), len(v_stored)) != (1 if p.key_fp8 else 2, 3):
        raise ValueError(f"{p.name}: pass store()'s K and V tuples")
    cell = torch.cat([_as_bytes(t) for t in (*k_stored, *v_stored)], -1)
    pad = cell.shape[-1] % 2
    return torch.nn.functional.pad(cell, (0, pad)) if pad else cell


def boundary_skip_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's ``TurboQuantConfig.get_boundary_skip_layers`` for a dense model of
    ``num_layers`` attention layers: the first and last ``min(2, num_layers // 2)``. vLLM
    adds them to ``--kv-cache-dtype-skip-layers`` itself (a union, whatever the user passes);
    for a hybrid model (attention + Mamba / linear attention) it adds none."""
    if num_layers <= 0:
        return ()
    n = min(2, num_layers // 2)
    return tuple(sorted({*range(n), *range(num_layers - n, num_layers)}))
