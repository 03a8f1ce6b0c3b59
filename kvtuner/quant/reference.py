"""Torch reference quantizer: the definition of the packed format (v2: v1 plus 3/5/6-bit codes).

Every other implementation (Triton kernels, the SGLang pool, the HF cache) must produce the same
bytes as this file. The math runs in fp32 regardless of the input dtype.

Grid (per group of ``group_size`` elements):
- asymmetric: ``zero = fp16(min)`` rounded down, ``scale = fp16((max - zero) / qmax)`` rounded up,
  so the grid ``zero + q*scale, q in [0, qmax]`` always covers [min, max] and the error of every
  element is at most half a step. ``code = clamp(floor((x - zero) / scale + 0.5), 0, qmax)``.
- symmetric: ``amax = fp16(max|x|)`` rounded up, ``half = 2^(bits-1) - 1``,
  ``code = clamp(floor(x / amax * half + 0.5) + half, 0, 2*half)``,
  ``x^ = (code - half) * amax / half``.
  The stored "scale" is ``amax`` itself, so a constant group dequantizes exactly.
- Constant groups: exact whenever the value is representable in fp16 (every bf16 value inside
  fp16's range); otherwise within half of a (tiny) step.
- Non-finite input (NaN, +-Inf), or a group whose fp16 metadata cannot be finite (symmetric:
  max|x| > 65504; asymmetric: min < -65504 or a (max - zero)/qmax beyond 65504), poisons its
  group: codes 0 and NaN scale/zero (fp16 bits 0x7E00), so the whole group dequantizes to NaN.
  Damage stays visible and local. (An asymmetric group above +65504 with a small range is
  representable and is not poisoned.)
- Zeros in the metadata are stored as +0 (the sign of a min/max over signed zeros depends on
  reduction order, and must not reach the bytes).
Rounding is half-up (``floor(v + 0.5)``) so that Triton and torch agree without libdevice;
divisions are IEEE (no reciprocal multiply), and nothing may be contracted into an FMA.
"""

from __future__ import annotations

import functools

import torch

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
    """Orthonormal, symmetric Hadamard matrix [dim, dim] (its own inverse), fp32."""
    h = _hadamard_cpu(dim)
    return h if h.device == torch.device(device) else h.to(device)


def rotate(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """x[..., D] in fp32 (x itself if already fp32 and unrotated), Hadamard-rotated if the spec
    asks for it (self-inverse). (Skipping no-op calls matters: the CPU pool's cost is per op.)"""
    if x.dtype != torch.float32:
        x = x.float()
    if spec.rotation == "hadamard":
        x = x @ hadamard(x.shape[-1], x.device)
    return x


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
        codes = g / torch.where(amax > 0, amax, 1.0)  # amax == 0: an all-zero group, codes half
        codes.mul_(half).add_(0.5).floor_().add_(half).clamp_(0, 2 * half)
        scale, zero = amax, None
    else:
        low, high = torch.aminmax(g, dim=dim, keepdim=True)
        zero = _fp16_down(low)
        scale = _fp16_up((high - zero) / spec.qmax)
        ok = torch.isfinite(zero + scale)  # fp16 values: the fp32 sum is finite iff both are
        codes = g - zero
        codes.div_(torch.where(scale > 0, scale, 1.0)).add_(0.5).floor_().clamp_(0, spec.qmax)
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


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (any dtype holding 0..2^bits-1) -> uint8 [..., D*bits/8].

    The codes form one little-endian bit stream: code i occupies stream bits
    ``[i*bits, (i+1)*bits)``, and byte j holds stream bits ``[8j, 8j+8)``. For 2/4/8 bits a byte
    holds whole codes (code i of a byte at bit ``i*bits``); 3/5/6-bit codes straddle bytes, so
    every 8 codes make one ``bits``-byte word. D must be a multiple of 8.
    """
    if 8 % bits:
        return _pack_words(codes, bits)
    per_byte = 8 // bits
    if per_byte == 1:
        return codes.to(torch.int32).to(torch.uint8)  # via int32: torch's float->uint8 is slow
    c = codes.unflatten(-1, (-1, per_byte))  # [..., D/per_byte, per_byte]: one byte each
    if not c.is_floating_point():
        c = c.to(torch.int32)
    # code i of a byte times 2^(i*bits), summed: codes < 2^bits never carry, and every partial
    # sum is an integer < 256, exact in any float dtype
    packed = (c * _byte_weights(bits, c.dtype, str(c.device))).sum(-1)
    return packed.to(torch.int32).to(torch.uint8)  # via int32: torch's float->uint8 is slow


@functools.lru_cache(maxsize=16)
def _byte_weights(bits: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """[8 // bits] weights 2^(i*bits) of the codes in a byte; cached (never an inference tensor,
    see _hadamard_cpu)."""
    with torch.inference_mode(False):
        return torch.tensor([1 << i for i in range(0, 8, bits)], dtype=dtype, device=device)


def _pack_words(codes: torch.Tensor, bits: int) -> torch.Tensor:
    # a word of 8 codes is 8*bits stream bits: 24 fit int32, 40/48 int64
    dtype = torch.int32 if 8 * bits < 32 else torch.int64
    c = codes.to(dtype).unflatten(-1, (-1, 8))  # [..., D/8, 8]: 8 codes = one word
    byte_shifts, code_shifts = _word_shifts(bits, dtype, str(codes.device))
    word = (c << code_shifts).sum(-1, dtype=dtype)  # codes never overlap: sum == OR
    out = (word.unsqueeze(-1) >> byte_shifts) & 0xFF  # [..., D/8, bits]
    return out.flatten(-2).to(torch.uint8)


def unpack_codes(
    packed: torch.Tensor, bits: int, dtype: torch.dtype | None = torch.uint8
) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: uint8 [..., B] -> codes [..., B*8/bits] in ``dtype``
    (None: whatever integer dtype unpacking produced, uint8 or a word dtype; no extra cast)."""
    if 8 % bits:
        codes = _unpack_words(packed, bits)
        return codes if dtype is None else codes.to(dtype)
    per_byte = 8 // bits
    if per_byte == 1:
        return packed if dtype is None else packed.to(dtype)
    out = torch.empty(*packed.shape, per_byte, dtype=dtype or torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    for i in range(per_byte):
        out[..., i] = (packed >> (i * bits)) & mask
    return out.flatten(-2)


def _unpack_words(packed: torch.Tensor, bits: int) -> torch.Tensor:
    # a word of 8 codes is 8*bits stream bits: 24 fit int32 (half the bytes moved), 40/48 int64
    dtype = torch.int32 if 8 * bits < 32 else torch.int64
    b = packed.to(dtype).unflatten(-1, (-1, bits))  # [..., D/8, bits]: one word each
    byte_shifts, code_shifts = _word_shifts(bits, dtype, str(packed.device))
    word = (b << byte_shifts).sum(-1, dtype=dtype)  # bytes never overlap: sum == OR
    return ((word.unsqueeze(-1) >> code_shifts) & ((1 << bits) - 1)).flatten(-2)


@functools.lru_cache(maxsize=16)
def _word_shifts(bits: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifts of a word's ``bits`` bytes ([bits]) and of its 8 codes ([8]); cached (never an
    inference tensor, see _hadamard_cpu)."""
    with torch.inference_mode(False):
        byte_shifts = torch.arange(0, 8 * bits, 8, dtype=dtype, device=device)
        code_shifts = torch.arange(0, 8 * bits, bits, dtype=dtype, device=device)
    return byte_shifts, code_shifts


def _fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """fp32 [..., n] -> uint8 [..., 2n] (fp16 little-endian)."""
    return v.half().contiguous().view(torch.uint8)


def _from_fp16_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _quantize_token(x: torch.Tensor, spec: QuantSpec, values: bool = False):
    """Rows of x (fp32, rotated); with ``values`` also the grid values the rows dequantize to
    (before un-rotation), computed from the codes and metadata in hand instead of unpacked."""
    d = x.shape[-1]
    g = x.reshape(*x.shape[:-1], d // spec.group_size, spec.group_size)
    codes, scale, zero = _group_grid(g, spec, dim=-1)
    meta = scale.squeeze(-1)  # [..., G] scales, then (asymmetric) G zeros
    if zero is not None:
        meta = torch.cat([meta, zero.squeeze(-1)], -1)
    rows = torch.cat([pack_codes(codes.reshape(x.shape), spec.bits), _fp16_bytes(meta)], -1)
    if not values:
        return rows
    # scale/zero are fp16 values held in fp32 (what the bytes read back as); codes are ours now
    return rows, _dequant_grid(codes, scale, zero, spec).reshape(x.shape)


def _split_meta(rows: torch.Tensor, spec: QuantSpec, n_codes: int, n_meta: int):
    # whole-byte codes unpack straight into fp32 (the scale multiply then runs in place); word
    # codes stay integer and become fp32 inside the multiply (one pass fewer for them)
    dtype = torch.float32 if 8 % spec.bits == 0 else None
    codes = unpack_codes(rows[..., :n_codes], spec.bits, dtype)
    meta = _from_fp16_bytes(rows[..., n_codes:])  # [..., n_meta] scales, then n_meta zeros
    scale = meta[..., :n_meta]
    zero = None if spec.symmetric else meta[..., n_meta:]
    return codes, scale, zero


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
    parts = [packed, _fp16_bytes(scale.squeeze(-2))]
    if zero is not None:
        parts.append(_fp16_bytes(zero.squeeze(-2)))
    return torch.cat(parts, -1)


def _dequantize_channel(blocks: torch.Tensor, spec: QuantSpec, d: int) -> torch.Tensor:
    g = spec.group_size
    codes, scale, zero = _split_meta(blocks, spec, spec.code_bytes(d) * g, d)
    codes = codes.reshape(*blocks.shape[:-1], g, d)
    zero = None if zero is None else zero.unsqueeze(-2)
    out = _dequant_grid(codes, scale.unsqueeze(-2), zero, spec)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * g, d)


def quantize(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Pack x into uint8 rows.

    token axis: x[..., D] -> uint8[..., spec.row_bytes(D)].
    channel axis: x[..., T, D] (T divisible by group_size) -> uint8[..., T/G, spec.block_bytes(D)].
    16 bits: the fp16 bytes of x, uint8[..., 2*D].
    """
    spec.check_head_dim(x.shape[-1])
    if not spec.is_quantized:
        return _fp16_bytes(x.float())
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
        return _from_fp16_bytes(rows).to(dtype)
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
