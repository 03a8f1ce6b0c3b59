"""Properties of the torch reference quantizer (the definition of the packed format)."""

from __future__ import annotations

import itertools

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtuner.quant import QuantSpec, dequantize, fake_quantize, hadamard, quantize
from kvtuner.quant.packing import pack_codes, unpack_codes

SPECS = [
    QuantSpec(bits, group, sym)
    for bits, sym, group in itertools.product((2, 4, 8), (False, True), (8, 16, 32, 64))
] + [
    QuantSpec(bits, group, sym)
    for bits, sym, group in ((3, False, 8), (5, True, 32), (6, False, 64))
]
EPS = float(torch.finfo(torch.float32).eps)


def _finite_rows(head_dim: int, max_rows: int = 6, bound: float = 1000.0):
    """float32 [rows, head_dim] arrays, finite, within fp16 range (hypothesis picks edge cases:
    repeated values, zeros, subnormals, huge spreads)."""
    elems = st.floats(-bound, bound, width=32, allow_nan=False, allow_infinity=False)
    shape = st.tuples(st.integers(1, max_rows), st.just(head_dim))
    return hnp.arrays(np.float32, shape, elements=elems)


def stored_meta(rows: torch.Tensor, spec: QuantSpec, head_dim: int, n_meta: int):
    """The fp16 scales (and zeros) stored in packed rows, as fp32 [..., n_meta]."""
    start = rows.shape[-1] - n_meta * 2 * (1 if spec.symmetric else 2)
    meta = rows[..., start:].contiguous().view(torch.float16).float()
    return meta[..., :n_meta], (None if spec.symmetric else meta[..., n_meta:])


def _half_step(spec: QuantSpec, scale: torch.Tensor) -> torch.Tensor:
    """Half of the grid step; symmetric grids store amax and step by amax / half."""
    if spec.symmetric:
        return scale / ((1 << (spec.bits - 1)) - 1) / 2
    return scale / 2


def _assert_within_half_step(x, out, half_step, zero=None):
    # fp32 rounding of (x - zero) * (1 / scale) and of zero + code * scale: a few ulps of the
    # values, and of |zero| (x - zero rounds at its own size: x = -2.00001 in a group whose
    # zero is -274.5 and step 5 lands 1e-5 past half a step, found by hypothesis)
    magnitude = x.abs() + out.abs() + (0 if zero is None else zero.abs())
    slack = 4 * EPS * magnitude + 1e-30
    excess = (out - x).abs() - (half_step * (1 + 4 * EPS) + slack)
    assert excess.max() <= 0, f"error exceeds half a step by {excess.max().item()}"


@pytest.mark.parametrize("spec", SPECS, ids=QuantSpec.short)
@settings(max_examples=40, deadline=None)
@given(data=_finite_rows(64))
def test_token_round_trip_within_half_step(spec, data):
    x = torch.from_numpy(data)
    rows = quantize(x, spec)
    assert rows.dtype == torch.uint8 and rows.shape == (x.shape[0], spec.row_bytes(64))
    out = dequantize(rows, spec, 64)
    scale, zero = stored_meta(rows, spec, 64, 64 // spec.group_size)
    half = _half_step(spec, scale).repeat_interleave(spec.group_size, -1)
    zero = None if zero is None else zero.repeat_interleave(spec.group_size, -1)
    _assert_within_half_step(x, out, half, zero)


@pytest.mark.parametrize("spec", SPECS, ids=QuantSpec.short)
@settings(max_examples=25, deadline=None)
@given(data=_finite_rows(16, max_rows=3))
def test_channel_round_trip_within_half_step(spec, data):
    spec = QuantSpec(spec.bits, spec.group_size // 4, spec.symmetric, axis="channel")
    g = spec.group_size
    x = torch.from_numpy(data).repeat(g, 1)[: g * data.shape[0]]  # [T, 16], T = blocks * g
    x = x + torch.arange(x.shape[0]).unsqueeze(1) * 0.25  # tokens differ
    blocks = quantize(x, spec)
    assert blocks.shape == (x.shape[0] // g, spec.block_bytes(16))
    out = dequantize(blocks, spec, 16)
    assert out.shape == x.shape
    scale, zero = stored_meta(blocks, spec, 16, 16)  # [blocks, D]: one scale per channel
    half = _half_step(spec, scale).repeat_interleave(g, 0)
    zero = None if zero is None else zero.repeat_interleave(g, 0)
    _assert_within_half_step(x, out, half, zero)


@pytest.mark.parametrize("spec", SPECS, ids=QuantSpec.short)
@settings(max_examples=25, deadline=None)
@given(value=st.floats(-65504, 65504, width=16), axis=st.sampled_from(["token", "channel"]))
def test_constant_groups_are_exact(spec, value, axis):
    """Every fp16 value (so every bf16 value within fp16's range) survives a constant group."""
    spec = QuantSpec(spec.bits, spec.group_size, spec.symmetric, axis=axis)
    x = torch.full((spec.group_size, 64), value)
    out = dequantize(quantize(x, spec), spec, 64)
    assert torch.equal(out, x)
    xb = x.bfloat16()  # bf16 values inside fp16's range are fp16 values too
    if xb.float().abs().max() <= 65504:
        assert torch.equal(fake_quantize(xb, spec), xb)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@settings(max_examples=20, deadline=None)
@given(data=_finite_rows(64))
def test_hadamard_round_trip_l2_bound(bits, data):
    """The rotation is orthonormal, so the L2 error equals the rotated domain's error."""
    spec = QuantSpec(bits, 32, rotation="hadamard")
    x = torch.from_numpy(data)
    rows = quantize(x, spec)
    scale, _ = stored_meta(rows, spec, 64, 2)
    out = dequantize(rows, spec, 64)
    bound = (scale / 2).square().sum(-1).mul(32).sqrt()  # sqrt(sum over 64 elements of step²/4)
    err = (out - x).norm(dim=-1)
    assert (err <= bound * (1 + 1e-3) + 1e-4 * x.norm(dim=-1) + 1e-6).all()


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_codes_are_one_little_endian_bit_stream(bits):
    """Byte j of a packed row holds bits [8j, 8j+8) of sum(code_i << (i*bits))."""
    codes = torch.randint(0, 1 << bits, (3, 64))
    packed = pack_codes(codes, bits)
    for row, out in zip(codes.tolist(), packed.tolist(), strict=True):
        assert out == _stream_bytes(row, [i * bits for i in range(64)], 64 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits, torch.int64), codes)


@pytest.mark.parametrize("bits, low", [(3, 2), (5, 4), (6, 4)])
@pytest.mark.parametrize("dim", [64, 72])
def test_split_codes_are_a_low_and_a_high_plane(bits, low, dim):
    """3/5/6 bits: the low ``low`` bits of every code as one stream, then the rest as another,
    where the high bits of code P·(E·k + e) + (P/2)·h + j (P = 32/low, E = low/high) sit at
    bit 32·k + 16·h + low·j + high·e: a pair's high bits 16 apart in one word, as its low bits
    are; past the last whole word (d 72: 8 codes), in channel order."""
    high = bits - low
    p = 32 // low
    codes = torch.randint(0, 1 << bits, (3, dim))
    packed = pack_codes(codes, bits)
    at = [0] * dim
    for i in range(dim):
        k, r = divmod(i, 32 // high)
        e, r = divmod(r, p)
        h, j = divmod(r, p // 2)
        whole = (k + 1) * (32 // high) <= dim
        at[i] = 32 * k + 16 * h + low * j + high * e if whole else i * high
    for row, out in zip(codes.tolist(), packed.tolist(), strict=True):
        low_plane = _stream_bytes([c % (1 << low) for c in row], [i * low for i in range(dim)],
                                  dim * low // 8)  # fmt: skip
        high_plane = _stream_bytes([c >> low for c in row], at, dim * high // 8)
        assert out == low_plane + high_plane
    assert torch.equal(unpack_codes(packed, bits, torch.int64), codes)


def _stream_bytes(codes: list[int], bit_at: list[int], n_bytes: int) -> list[int]:
    """Bytes of the stream holding code i at bit ``bit_at[i]``."""
    stream = sum(c << at for c, at in zip(codes, bit_at, strict=True))
    return [(stream >> (8 * j)) & 0xFF for j in range(n_bytes)]


def test_hadamard_cache_survives_inference_mode():
    """The cached matrix first built under inference_mode must still work with autograd."""
    from kvtuner.quant.reference import _hadamard_cpu

    _hadamard_cpu.cache_clear()
    spec = QuantSpec(4, 32, rotation="hadamard")
    with torch.inference_mode():
        fake_quantize(torch.randn(2, 64), spec)
    x = torch.randn(2, 64, requires_grad=True)
    assert fake_quantize(x, spec).shape == (2, 64)


def test_hadamard_butterflies_with_and_without_autograd_agree_bit_for_bit():
    from kvtuner.quant.reference import times_hadamard

    x = torch.randn(5, 3, 128)
    plain = times_hadamard(x)
    tracked = times_hadamard(x.clone().requires_grad_())
    assert tracked.requires_grad and torch.equal(plain, tracked.detach())
    assert torch.allclose(plain, x @ hadamard(128), atol=1e-5)
    assert torch.equal(times_hadamard(plain), times_hadamard(plain.clone()))  # x untouched


def test_hadamard_is_orthonormal_and_self_inverse():
    h = hadamard(64)
    assert torch.allclose(h @ h, torch.eye(64), atol=1e-6)
    assert torch.equal(h, h.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sixteen_bits_stores_fp16_bytes(dtype):
    x = torch.randn(3, 2, 64).to(dtype)
    rows = quantize(x, QuantSpec(16))
    assert rows.shape == (3, 2, 128)
    assert torch.equal(rows.view(torch.float16), x.half())
    assert fake_quantize(x, QuantSpec(16)) is x
    assert dequantize(rows, QuantSpec(16), 64, dtype).dtype == dtype


@pytest.mark.parametrize("spec", SPECS[::3], ids=QuantSpec.short)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_poisons_only_its_group(spec, bad):
    torch.manual_seed(0)
    x = torch.randn(4, 128)
    x[1, 3] = bad
    rows = quantize(x, spec)
    out = dequantize(rows, spec, 128)
    g = spec.group_size
    assert out[1, :g].isnan().all()  # the poisoned group
    clean = torch.ones_like(out, dtype=torch.bool)
    clean[1, :g] = False
    assert not out[clean].isnan().any()
    scale, zero = stored_meta(rows, spec, 128, 128 // g)
    assert scale[1, 0].isnan() and (zero is None or zero[1, 0].isnan())
    codes = unpack_codes(rows[1, : spec.code_bytes(128)], spec.bits)  # codes 0 in the group
    assert torch.equal(codes[:g], torch.zeros(g, dtype=torch.uint8))
    # other groups: the same bytes as quantizing them without the bad value
    y = x.clone()
    y[1, :g] = 0
    assert torch.equal(dequantize(quantize(y, spec), spec, 128)[clean], out[clean])


@pytest.mark.parametrize("symmetric", [False, True])
def test_group_beyond_fp16_range_poisons(symmetric):
    x = torch.zeros(1, 64)
    x[0, 0] = -7e4  # below fp16's lowest: no fp16 zero/amax can cover it
    out = fake_quantize(x, QuantSpec(4, 32, symmetric))
    assert out[0, :32].isnan().all() and not out[0, 32:].isnan().any()


def test_hadamard_poison_covers_the_head_vector():
    x = torch.randn(2, 64)
    x[0, 5] = float("nan")
    out = fake_quantize(x, QuantSpec(4, 32, rotation="hadamard"))
    assert out[0].isnan().all() and not out[1].isnan().any()


def test_signed_zero_bytes_are_canonical():
    """min/max of {-0, +0} depends on reduction order; the stored zero/scale must not."""
    a = torch.zeros(1, 32)
    b = a.clone()
    b[0, ::2] = -0.0
    for spec in (QuantSpec(4, 32), QuantSpec(8, 32, True)):
        assert torch.equal(quantize(a, spec), quantize(b, spec))
        assert torch.equal(quantize(-a, spec), quantize(a, spec))


def test_channel_fake_quantize_partial_group():
    """A trailing partial token group is quantized on its own statistics."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 37, 64)
    spec = QuantSpec(4, 32, axis="channel")
    out = fake_quantize(x, spec)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out[..., :32, :], fake_quantize(x[..., :32, :], spec))
    tail = x[..., 32:, :]
    assert torch.equal(
        out[..., 32:, :], fake_quantize(tail.repeat(1, 1, 7, 1)[..., :32, :], spec)[..., :5, :]
    )


def test_quantize_rejects_bad_shapes():
    with pytest.raises(ValueError, match="does not divide head_dim"):
        quantize(torch.randn(2, 48), QuantSpec(4, 32))
    with pytest.raises(ValueError, match="divisible by group_size"):
        quantize(torch.randn(30, 64), QuantSpec(4, 32, axis="channel"))
    with pytest.raises(ValueError, match="spec expects 40"):
        dequantize(torch.zeros(2, 39, dtype=torch.uint8), QuantSpec(4, 32), 64)
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize(torch.zeros(2, 40), QuantSpec(4, 32), 64)
