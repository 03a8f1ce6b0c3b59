"""Torch reference quantizer: the definition of the packed format (v2: v1 plus 3/5/6-bit codes).

Every other implementation (Triton kernels, the SGLang pool, the HF cache) must produce the same
bytes as this file. The math runs in fp32 regardless of the input dtype.

Grid (per group of ``group_size`` elements):
- asymmetric: ``zero = fp16(min)`` rounded down, ``scale = fp16((max - zero) / qmax)`` rounded up,
  so the grid ``zero + q*scale, q in [0, qmax]`` always covers [min, max] and the error of every
  element is at most half a step (and a few ulps). ``code = clamp(floor((x - zero) * (1 / scale)
  + 0.5), 0, qmax)``.
- symmetric: ``amax = fp16(max|x|)`` rounded up, ``half = 2^(bits-1) - 1``,
  ``code = clamp(floor(x * (1 / amax) * half + 0.5) + half, 0, 2*half)``,
  ``x^ = (code - half) * amax / half``.
  The stored "scale" is ``amax`` itself, so a constant group dequantizes exactly.
- Constant groups: exact whenever the value is representable in fp16 (every bf16 value inside
  fp16's range); otherwise within half of a (tiny) step.
- Non-finite input (NaN, +-Inf), or a group whose fp16 metadata cannot be finite (symmetric:
  max|x| > 65504; asymmetric: min < -65504 or a (max - zero)/qmax beyond 65504), poisons its
  group: codes 0 and NaN scale/zero (fp16 bits 0x7E00), so the whole group dequantizes to NaN.
  Damage stays visible and local. (An asymmetric group above +65504 with a small range is
  representable and is not poisoned.)
- 16 bits: fp16 of the value; every NaN is stored as 0x7E00 (sign and payload dropped).
- Zeros in the metadata are stored as +0 (the sign of a min/max over signed zeros depends on
  reduction order, and must not reach the bytes).
Rounding is half-up (``floor(v + 0.5)``) so that Triton and torch agree without libdevice;
each group's ``1 / scale`` is one IEEE division and its elements multiply by it (a GPU divides
once a group, not once an element: pack took 19 % fewer instructions on sm_90a), and nothing
may be contracted into an FMA. The encoder's rule only picks codes: rows read back as before.
"""

from __future__ import annotations

import functools

import torch

from .packing import fp16_bytes, from_fp16_bytes, pack_codes, unpack_codes
from .spec import QuantSpec


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(dim: int) -> torch.Tensor:
    # Never cache an inference tensor: a first call under torch.inference_mode() would make
    # every later autograd-tracked x @ H fail ("Inference tensors cannot be saved for backward").
    with torch.inference_mode(False):
        h = torch.ones(1, 1)
        while h.shape[0] < dim:  # Sylvester construction
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return h / dim**0.5


def hadamard(dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Orthonormal, symmetric Hadamard matrix [dim, dim] (its own inverse), fp32; one copy per
    device (the CPU values moved once: no host-to-device copy per call)."""
    device = torch.device(device)
    return _hadamard_cpu(dim) if device.type == "cpu" else _hadamard_on(dim, str(device))


@functools.lru_cache(maxsize=16)
def _hadamard_on(dim: int, device: str) -> torch.Tensor:
    with torch.inference_mode(False):  # cached: never an inference tensor (see _hadamard_cpu)
        return _hadamard_cpu(dim).to(device)


def rotate(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """x[..., D] in fp32 (x itself if already fp32 and unrotated), Hadamard-rotated if the spec
    asks for it (self-inverse). (Skipping no-op calls matters: the CPU pool's cost is per op.)"""
    if x.dtype != torch.float32:
        x = x.float()
    if spec.rotation == "hadamard":
        x = times_hadamard(x)
    return x


def times_hadamard(x: torch.Tensor) -> torch.Tensor:
    """x[..., D] fp32 times the orthonormal Sylvester Hadamard matrix ``hadamard(D)``: log2(D)
    add/subtract butterflies, then one multiply by 1/sqrt(D), in the order the Triton kernels
    use (:func:`.triton_codes.hadamard_tile`), so CPU and GPU bytes agree exactly and no BLAS
    chooses the summation order; each row's result is independent of the rows beside it."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"hadamard rotation needs a power-of-two head_dim, got {d}")
    rows, half = x.reshape(-1, d), 1
    tracked = x.requires_grad and torch.is_grad_enabled()  # out= ops have no autograd
    buffers = None if tracked else (torch.empty_like(rows), torch.empty_like(rows))
    while half < d:  # stage s pairs channels i and i + 2^s: [rows, D / 2^(s+1), 2, 2^s]
        src = rows.view(-1, d // (2 * half), 2, half)
        a, b = src[:, :, 0], src[:, :, 1]
        if tracked:
            rows = torch.stack((a + b, a - b), 2).view(-1, d)
        else:  # the same sums, written in place of a ping-pong buffer: 2-3x faster on CPU
            rows, buffers = buffers[0], buffers[::-1]
            dst = rows.view(-1, d // (2 * half), 2, half)
            torch.add(a, b, out=dst[:, :, 0])
            torch.sub(a, b, out=dst[:, :, 1])
        half *= 2
    scale = 1.0 / d**0.5
    return (rows * scale if tracked else torch.mul(rows, scale, out=buffers[0])).view(x.shape)


@functools.lru_cache(maxsize=8)
def _fp16_inf(sign: int, device: str) -> torch.Tensor:
    with torch.inference_mode(False):  # cached: never an inference tensor (see _hadamard_cpu)
        return torch.tensor(sign * float("inf"), dtype=torch.float16, device=device)


def _fp16_round(v: torch.Tensor, sign: int) -> torch.Tensor:
    """The fp16 nearest to v in the direction ``sign`` (-1: largest <= v, +1: smallest >= v),
    as fp32; a zero result is +0 (``+ 0.0`` maps -0 to +0 and leaves every other value)."""
    r = v.half()
    beyond = r.float() > v if sign < 0 else r.float() < v
    r = torch.where(beyond, torch.nextafter(r, _fp16_inf(sign, str(r.device))), r)
    return r.float().add_(0.0)


def _fp16_down(v: torch.Tensor) -> torch.Tensor:
    """Largest fp16 <= v (as fp32); a zero result is +0 (min/max of signed zeros is
    order-dependent, so the sign of a zero must not reach the stored bytes)."""
    return _fp16_round(v, -1)


def _fp16_up(v: torch.Tensor) -> torch.Tensor:
    """Smallest fp16 >= v (as fp32); a zero result is +0."""
    return _fp16_round(v, 1)


def _group_grid(g: torch.Tensor, spec: QuantSpec, dim: int):
    """Codes and metadata for fp32 groups laid out along ``dim``.

    Returns codes (fp32 holding integers, g's shape), scale and zero (fp32, ``dim`` reduced to 1;
    zero is None when symmetric). NaN and +-Inf reach the group's min/max/absmax (torch
    reductions propagate NaN), so a group is poisoned exactly when its fp16 metadata is not
    finite: such groups get NaN metadata and zero codes. In-place ops: this is the CPU hot path.
    """
    if spec.symmetric:
        half = (1 << (spec.bits - 1)) - 1
        amax = _fp16_up(g.abs().amax(dim, keepdim=True))
        ok = torch.isfinite(amax)
        codes = g * (1.0 / torch.where(amax > 0, amax, 1.0))  # amax == 0: all-zero, codes half
        codes.mul_(half).add_(0.5).floor_().add_(half).clamp_(0, 2 * half)
        scale, zero = amax, None
    else:
        low, high = torch.aminmax(g, dim=dim, keepdim=True)
        zero = _fp16_down(low)
        scale = _fp16_up((high - zero) / spec.qmax)
        ok = torch.isfinite(zero + scale)  # fp16 values: the fp32 sum is finite iff both are
        codes = g - zero
        codes.mul_(1.0 / torch.where(scale > 0, scale, 1.0)).add_(0.5).floor_().clamp_(0, spec.qmax)
    if not bool(ok.all()):  # rare: only then pay for the masking passes
        codes = torch.where(ok, codes, 0.0)
        scale = torch.where(ok, scale, float("nan"))
        zero = None if zero is None else torch.where(ok, zero, float("nan"))
    return codes, scale, zero


def _dequant_grid(codes: torch.Tensor, scale: torch.Tensor, zero, spec: QuantSpec):
    """fp32 values of integer codes (any dtype; integer codes become fp32 inside the first op,
    an exact cast, instead of in a pass of their own). Float codes are consumed (in place)."""
    if spec.symmetric:
        half = (1 << (spec.bits - 1)) - 1
        c = codes.sub_(half) if codes.is_floating_point() else torch.sub(codes, float(half))
        return c.mul_(scale).div_(half)  # ((c - half) * scale) / half
    c = codes.mul_(scale) if codes.is_floating_point() else torch.mul(codes, scale)
    return c.add_(zero)  # zero + c * scale, same rounding


def _quantize_token(x: torch.Tensor, spec: QuantSpec, values: bool = False):
    """Rows of x (fp32, rotated); with ``values`` also the grid values the rows dequantize to
    (before un-rotation), computed from the codes and metadata in hand instead of unpacked."""
    d = x.shape[-1]
    g = x.reshape(*x.shape[:-1], d // spec.group_size, spec.group_size)
    codes, scale, zero = _group_grid(g, spec, dim=-1)
    meta = scale.squeeze(-1)  # [..., G] scales, then (asymmetric) G zeros
    if zero is not None:
        meta = torch.cat([meta, zero.squeeze(-1)], -1)
    rows = torch.cat([pack_codes(codes.reshape(x.shape), spec.bits), fp16_bytes(meta)], -1)
    if not values:
        return rows
    # scale/zero are fp16 values held in fp32 (what the bytes read back as); codes are ours now
    return rows, _dequant_grid(codes, scale, zero, spec).reshape(x.shape)


def _split_meta(rows: torch.Tensor, spec: QuantSpec, n_codes: int, n_meta: int):
    # whole-byte codes unpack straight into fp32 (the scale multiply then runs in place); split
    # (3/5/6-bit) codes stay integer and become fp32 inside the multiply (one pass fewer for them)
    # token rows: their code and metadata slices are short strided runs (32 + 8 bytes for 4-bit
    # D=64), which slow every later pass on CPU; one contiguous copy each is cheaper overall
    # (channel blocks' runs are long: copying them costs more than it saves)
    codes = rows[..., :n_codes]
    meta = from_fp16_bytes(rows[..., n_codes:])  # [..., n_meta] scales, then n_meta zeros
    scale, zero = meta[..., :n_meta], None if spec.symmetric else meta[..., n_meta:]
    if spec.axis == "token":
        codes, scale = codes.contiguous(), scale.contiguous()
        zero = None if zero is None else zero.contiguous()
    else:  # a block's G code rows, each packed on its own (3/5/6 bits: two planes a row)
        codes = codes.unflatten(-1, (spec.group_size, -1))
    dtype = torch.float32 if 8 % spec.bits == 0 else None
    return unpack_codes(codes, spec.bits, dtype), scale, zero


def _dequantize_token(rows: torch.Tensor, spec: QuantSpec, d: int) -> torch.Tensor:
    groups = d // spec.group_size
    codes, scale, zero = _split_meta(rows, spec, spec.code_bytes(d), groups)
    codes = codes.reshape(*rows.shape[:-1], groups, spec.group_size)
    zero = None if zero is None else zero.unsqueeze(-1)
    out = _dequant_grid(codes, scale.unsqueeze(-1), zero, spec)
    return out.reshape(*rows.shape[:-1], d)


def _quantize_channel(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    # x [..., T, D] with T % G == 0 -> blocks [..., T/G, G, D]; groups run along the G tokens
    *lead, t, d = x.shape
    if t % spec.group_size:
        raise ValueError(f"channel axis needs tokens ({t}) divisible by group_size")
    g = x.reshape(*lead, t // spec.group_size, spec.group_size, d)
    codes, scale, zero = _group_grid(g, spec, dim=-2)
    packed = pack_codes(codes, spec.bits).flatten(-2)  # [..., T/G, G*D*bits/8]
    parts = [packed, fp16_bytes(scale.squeeze(-2))]
    if zero is not None:
        parts.append(fp16_bytes(zero.squeeze(-2)))
    return torch.cat(parts, -1)


def _dequantize_channel(blocks: torch.Tensor, spec: QuantSpec, d: int) -> torch.Tensor:
    g = spec.group_size
    codes, scale, zero = _split_meta(blocks, spec, spec.code_bytes(d) * g, d)
    codes = codes.reshape(*blocks.shape[:-1], g, d)
    zero = None if zero is None else zero.unsqueeze(-2)
    out = _dequant_grid(codes, scale.unsqueeze(-2), zero, spec)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * g, d)


def _canonical_nan(x: torch.Tensor) -> torch.Tensor:
    """Every NaN (any sign or payload) as the format's NaN, fp16 0x7E00 (a GPU's fp32 -> fp16
    conversion would otherwise pick its own payload)."""
    return torch.where(x.isnan(), float("nan"), x)


def quantize(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Pack x into uint8 rows.

    token axis: x[..., D] -> uint8[..., spec.row_bytes(D)].
    channel axis: x[..., T, D] (T divisible by group_size) -> uint8[..., T/G, spec.block_bytes(D)].
    16 bits: the fp16 bytes of x, uint8[..., 2*D].
    """
    spec.check_head_dim(x.shape[-1])
    if not spec.is_quantized:
        return fp16_bytes(_canonical_nan(x.float()))
    x = rotate(x, spec)
    if spec.axis == "channel":
        return _quantize_channel(x, spec)
    return _quantize_token(x, spec)


def dequantize(
    rows: torch.Tensor, spec: QuantSpec, head_dim: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize`; returns [..., D] (channel axis: [..., T, D]) in ``dtype``."""
    if rows.dtype != torch.uint8:
        raise ValueError(f"packed rows must be uint8, got {rows.dtype}")
    expected = spec.block_bytes(head_dim) if spec.axis == "channel" and spec.is_quantized else None
    expected = expected or spec.row_bytes(head_dim)
    if rows.shape[-1] != expected:
        raise ValueError(f"packed rows have {rows.shape[-1]} bytes, spec expects {expected}")
    if not spec.is_quantized:
        return from_fp16_bytes(rows).to(dtype)
    if spec.axis == "channel":
        out = _dequantize_channel(rows, spec, head_dim)
    else:
        out = _dequantize_token(rows, spec, head_dim)
    return rotate(out, spec).to(dtype)


def quantize_dequantize(
    x: torch.Tensor, spec: QuantSpec, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, dequantize(rows, spec, D, dtype))`` with ``rows = quantize(x, spec)``, x[..., D].
    Token axis: the values come from the codes in hand (no unpacking), same bits (a NaN-poisoned
    group's NaN payload aside)."""
    if spec.axis != "token" or not spec.is_quantized:
        rows = quantize(x, spec)
        return rows, dequantize(rows, spec, x.shape[-1], dtype)
    spec.check_head_dim(x.shape[-1])
    rows, grid = _quantize_token(rotate(x, spec), spec, values=True)
    return rows, rotate(grid, spec).to(dtype)


def fake_quantize(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """dequantize(quantize(x)) in x's dtype; 16 bits is the identity.

    Channel axis: x[..., T, D]; a trailing partial group of tokens is quantized on its own
    statistics (padded by repeating its last token, which leaves min/max unchanged).
    """
    if not spec.is_quantized:
        return x
    if spec.axis == "token":
        return dequantize(quantize(x, spec), spec, x.shape[-1], x.dtype)
    t = x.shape[-2]
    pad = -t % spec.group_size
    x_pad = x
    if pad:
        x_pad = torch.cat([x, x[..., -1:, :].expand(*x.shape[:-2], pad, x.shape[-1])], -2)
    out = dequantize(quantize(x_pad, spec), spec, x.shape[-1], x.dtype)
    return out[..., :t, :]
