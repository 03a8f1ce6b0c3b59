"""PairCodec: the CPU pool's write of one layer's K and V: the token-axis quantizer in numpy.

Why: a decode step writes one token per request and layer, a few hundred values; on CPU the cost
is the number of calls, not the bytes. A torch call costs several µs of dispatch here, a numpy
ufunc about a third of that, and K and V share one pass over a ``[n, 2*heads, G, group]`` array
even when their bit widths differ (the per-head ``qmax`` is a broadcast array). Bit packing is
``unpackbits`` + ``packbits`` (the format's little-endian bit streams, for every width).

Exactness: this is a second implementation of ``kvtuner.quant.reference`` (the definition), for
token-axis specs of 2..8 bits; the rows are the reference's bytes and the values are
``dequantize(rows)`` bit for bit (tests compare them on random, constant, signed-zero,
fp16-subnormal and non-finite groups). Each step is the reference's IEEE fp32 operation in the same
order (a group's IEEE reciprocal, then a multiply; separate multiply and add, no FMA); fp16
conversions round to nearest even, corrected one step in the asked direction as in ``_fp16_round``.
The Hadamard rotation stays the reference's torch matmul, on the same ``[n, heads, D]`` shapes.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .....quant import QuantSpec
from .....quant.packing import high_order, split_bits
from .....quant.reference import times_hadamard

__all__ = ["PairCodec"]

_F16_DOWN, _F16_UP = np.float16(-np.inf), np.float16(np.inf)
_NAN, _TINY = np.float32(np.nan), np.float32(1e-30)  # _TINY: below every nonzero fp16 scale
_ZERO, _HALF, _ONE = np.float32(0.0), np.float32(0.5), np.float32(1.0)
_NUMPY_DTYPES = (torch.float16, torch.float32)  # torch dtypes numpy holds (not bfloat16)


def _fp16_directed(v: np.ndarray, down: bool) -> np.ndarray:
    """fp32 v -> the fp16 nearest in one direction (reference ``_fp16_round``), as fp32; a zero
    result is +0 (the sign of a zero must not reach the stored bytes)."""
    r = v.astype(np.float16)  # nearest even; one step past v at most
    past = r.astype(np.float32) > v if down else r.astype(np.float32) < v
    np.nextafter(r, _F16_DOWN if down else _F16_UP, out=r, where=past)
    return np.add(r, _ZERO, dtype=np.float32)  # widen and map -0 to +0 in one pass


class _Grid:
    """Quantizer constants of heads sharing group size and symmetry: per-head qmax (or half)
    as ``[1, heads, 1, 1]`` fp32, so K and V of different widths share every array op."""

    def __init__(self, specs: list[tuple[QuantSpec, int]]) -> None:
        spec = specs[0][0]
        self.group, self.symmetric = spec.group_size, spec.symmetric
        tops = [(1 << (s.bits - 1)) - 1 if s.symmetric else s.qmax for s, _ in specs]
        heads = [h for _, h in specs]
        self.top = np.repeat(np.array(tops, np.float32), heads).reshape(1, -1, 1, 1)
        self.top2 = 2 * self.top  # symmetric: codes 0..2*half

    def codes(self, x: np.ndarray):
        """x fp32 [n, H, D] -> codes fp32 [n, H, G, group], metadata fp32 [n, H, G or 2G]
        (scales, then zeros; +0 for zeros, NaN for poisoned groups), values fp32 [n, H, D]."""
        n, heads, d = x.shape
        if x.dtype != np.float32:  # fp16 input: widened exactly
            x = x.astype(np.float32)
        g = x.reshape(n, heads, d // self.group, self.group)
        if self.symmetric:
            scale, zero = _fp16_directed(np.abs(g).max(-1, keepdims=True), down=False), None
            codes = g * (_ONE / np.maximum(scale, _TINY))  # scale 0: all-zero group, codes half
            codes *= self.top
            codes += _HALF
            np.floor(codes, out=codes)
            codes += self.top  # >= 0 already: |g| <= scale, so g / scale >= -1
            np.minimum(codes, self.top2, out=codes)
            meta = scale[..., 0]
        else:
            zero = _fp16_directed(g.min(-1, keepdims=True), down=True)
            scale = _fp16_directed((g.max(-1, keepdims=True) - zero) / self.top, down=False)
            codes = g - zero
            codes *= _ONE / np.maximum(scale, _TINY)  # scale 0: a constant group, codes 0
            codes += _HALF
            np.floor(codes, out=codes)  # >= 0 already: g >= zero
            np.minimum(codes, self.top, out=codes)
            meta = np.concatenate([scale[..., 0], zero[..., 0]], -1)  # [n, H, 2G]
        if not np.isfinite(meta).all():  # rare: poisoned groups get codes 0, NaN metadata
            ok = np.isfinite(scale) if zero is None else np.isfinite(zero + scale)
            codes = np.where(ok, codes, np.float32(0))
            scale = np.where(ok, scale, _NAN)
            zero = None if self.symmetric else np.where(ok, zero, _NAN)
            meta = (
                scale[..., 0] if zero is None else np.concatenate([scale[..., 0], zero[..., 0]], -1)
            )
        if self.symmetric:  # ((c - half) * scale) / half, as the reference dequantizes
            values = codes - self.top
            values *= scale
            values /= self.top
        else:  # zero + c * scale
            values = codes * scale
            values += zero
        return codes, meta, values.reshape(n, heads, d)


def _bytes(codes: np.ndarray, meta: np.ndarray, values: np.ndarray):
    """Grid output -> (codes uint8 [n, H, G, group], metadata as fp16 bytes, values)."""
    return codes.astype(np.uint8), meta.astype(np.float16).view(np.uint8), values


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes uint8 [n, h, G, group] -> uint8 [n, h, D*bits/8], the reference's
    :func:`~kvtuner.quant.packing.pack_codes`: one bit stream (code i at stream bits
    [i*bits, (i+1)*bits), byte j = stream bits [8j, 8j+8), least significant first), or for
    3/5/6 bits a low and a high plane, each such a stream."""
    n, h = codes.shape[:2]
    codes = codes.reshape(n, h, -1)  # a copy when codes is K's or V's half of the pair
    if 8 % bits:
        low, high = split_bits(bits)
        order = _high_index(codes.shape[-1], bits)
        return np.concatenate(
            [_stream(codes & ((1 << low) - 1), low), _stream(codes[..., order] >> low, high)], -1
        )
    return _stream(codes, bits)


@functools.lru_cache(maxsize=64)
def _high_index(head_dim: int, bits: int) -> np.ndarray:
    """:func:`~kvtuner.quant.packing.high_order` as an index array, built once a width (a
    decode step writes every layer)."""
    return np.asarray(high_order(head_dim, bits))


def _stream(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes uint8 [n, h, D] -> their little-endian bit stream, uint8 [n, h, D*bits/8]."""
    if bits == 8:
        return codes
    n, h, d = codes.shape
    stream = np.unpackbits(codes[..., None], axis=-1, count=bits, bitorder="little")
    return np.packbits(stream.reshape(n, h, d * bits), axis=-1, bitorder="little")


class PairCodec:
    """One layer's K and V writer: ``encode(k, v)`` -> the rows of ``quantize(k, k_spec)`` and
    ``quantize(v, v_spec)`` (numpy uint8 [n, heads, R]) and, if asked, the values
    ``dequantize`` returns for them (torch [n, heads, D] in ``dtype``). K and V share one grid
    pass when their group size and symmetry agree (bits and rotation may differ)."""

    def __init__(self, k_spec: QuantSpec, v_spec: QuantSpec, heads: int) -> None:
        if not self.supports(k_spec, v_spec):
            raise ValueError(f"PairCodec takes quantized token-axis specs, got {k_spec}, {v_spec}")
        self.specs, self.heads = (k_spec, v_spec), heads
        same = (k_spec.group_size, k_spec.symmetric) == (v_spec.group_size, v_spec.symmetric)
        self.shared = _Grid([(k_spec, heads), (v_spec, heads)]) if same else None
        self.grids = (_Grid([(k_spec, heads)]), _Grid([(v_spec, heads)]))

    @staticmethod
    def supports(k_spec: QuantSpec, v_spec: QuantSpec) -> bool:
        return all(s.is_quantized and s.axis == "token" for s in (k_spec, v_spec))

    def encode(self, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype | None = None):
        """K, V [n, heads, D] (any float dtype) -> (k_rows, v_rows, k_hat, v_hat); the values
        are None unless ``dtype`` is given."""
        x = [self._input(t, s) for t, s in zip((k, v), self.specs, strict=True)]
        with np.errstate(all="ignore"):  # overflow/NaN inputs poison groups; no warnings
            if self.shared is not None:  # codes and metadata of K and V converted in one call
                codes, meta, values = _bytes(*self.shared.codes(np.concatenate(x, 1)))
                h = self.heads
                parts = [(codes[:, :h], meta[:, :h], values[:, :h])]
                parts.append((codes[:, h:], meta[:, h:], values[:, h:]))
            else:
                parts = [_bytes(*grid.codes(xi)) for grid, xi in zip(self.grids, x, strict=True)]
            rows = [
                np.concatenate([_pack(c, s.bits), m], -1)
                for (c, m, _), s in zip(parts, self.specs, strict=True)
            ]
        if dtype is None:
            return rows[0], rows[1], None, None
        k_hat, v_hat = (
            self._values(p[2], s, dtype) for p, s in zip(parts, self.specs, strict=True)
        )
        return rows[0], rows[1], k_hat, v_hat

    def _input(self, t: torch.Tensor, spec: QuantSpec) -> np.ndarray:
        """The reference's ``rotate(t, spec)`` (fp32, rotated) as numpy; fp16 and fp32 inputs
        without rotation go to numpy as they are (the grid widens fp16 exactly)."""
        if spec.rotation == "none" and t.dtype in _NUMPY_DTYPES:
            return t.numpy()
        if t.dtype != torch.float32:
            t = t.float()
        return (times_hadamard(t) if spec.rotation == "hadamard" else t).numpy()

    def _values(self, values: np.ndarray, spec: QuantSpec, dtype: torch.dtype) -> torch.Tensor:
        if spec.rotation == "hadamard":  # un-rotate: the reference's butterflies on [n, heads, D]
            return times_hadamard(torch.from_numpy(np.ascontiguousarray(values))).to(dtype)
        if dtype in _NUMPY_DTYPES:  # fp32 -> fp16 rounds to nearest even in numpy as in torch
            return torch.from_numpy(values.astype(_NP[dtype]))
        return torch.from_numpy(np.ascontiguousarray(values)).to(dtype)


_NP = {torch.float16: np.float16, torch.float32: np.float32}
