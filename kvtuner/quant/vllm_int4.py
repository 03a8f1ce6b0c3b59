"""vLLM 0.32's ``int4_per_token_head`` KV format (``KVQuantMode.INT4_PER_TOKEN_HEAD``), in torch.

Read from ``vllm/v1/attention/ops/int4_per_token_head.py``:

- **Rotation** (``single_rht``): before the store kernel, each K and V row [D] is rotated in fp32,
  ``R x = H_b (signs * x)`` blockwise, with ``b`` the largest power-of-two divisor of D, ``H_b``
  the unnormalised Walsh-Hadamard matrix (``R R^T = b I``) and ±1 signs from
  ``torch.bernoulli`` under a CPU generator seeded ``0x9E3779B9``; the result is cast back to the
  states' dtype (bf16 in vLLM). The transform is vLLM's torch butterfly (its CPU / fallback tier).
- **Store** (``_reshape_cache_int4_kernel``), per token and KV head, in fp32:
  ``scale = max((max - min) / 15, 1e-6)``; ``zp = clamp(round(-min / scale), 0, 15)``;
  ``q = clamp(round(x * (1 / scale) + zp), 0, 15)``, rounding half away from zero
  (``trunc(v ± 0.5)``). Element 2i goes to the low nibble of byte i, element 2i+1 to the high
  nibble; the fp32 scale carries ``zp`` in its 4 low mantissa bits (``bits & -16 | zp``).
  A token-head takes ``D / 2`` bytes of codes plus the 4-byte scale, per side.
- **Read** (``_attn_packed``): the kernel reads ``(q - zp) * scale`` (scale with its 4 low bits
  cleared) in the rotated basis, against the query rotated the same way with the softmax scale
  divided by ``b``, and un-rotates the output (``signs * H_b out / b``). Since
  ``(R q) . k' / b = q . (R^T k' / b)``, attention effectively sees the key
  ``R^T k' / b`` and the value ``R^T v' / b`` in the model's basis: :func:`read` returns those.
  vLLM rounds the rotated query and the un-rotated output to the model dtype; this read rounds
  the un-rotated K and V instead (no difference when the model runs in fp32).

GPU differences not reproduced (the tests run vLLM's kernel under the Triton interpreter, IEEE
fp32, unfused): on a GPU Triton's fp32 ``/`` is ``div.full.f32`` (up to 2 ulp), it may fuse
``x * inv + zp`` into one FMA, and on sm_80+ vLLM rotates with its hadacore CUDA kernel (bf16);
each can move a value across a rounding boundary and change a code by one, rarely. Float-to-int
conversions saturate here, as the GPU's do.
"""

from __future__ import annotations

import torch

__all__ = ["read", "read_rotated", "rht", "rht_block", "store"]

QMAX = 15.0
SCALE_FLOOR = 1e-6  # vLLM's scale floor (fp32)
_SIGN_SEED = 0x9E3779B9  # vLLM's _get_rht_signs(d, round_idx=0)
_signs: dict[int, torch.Tensor] = {}


def rht_block(d: int) -> int:
    """The Hadamard block vLLM rotates with: the largest power-of-two divisor of ``d``."""
    return d & -d


def _rht_signs(b: int) -> torch.Tensor:
    """vLLM's deterministic ±1 signs [b] (fp32, CPU)."""
    if b not in _signs:
        gen = torch.Generator(device="cpu").manual_seed(_SIGN_SEED)
        _signs[b] = 2.0 * torch.bernoulli(torch.full((b,), 0.5), generator=gen) - 1.0
    return _signs[b]


def _butterfly(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform over the last dim (a power of two), in vLLM's
    butterfly order (``fast_hadamard_transform``'s torch tier): the fp32 sums round the same."""
    d, h = x.shape[-1], 1
    while h < d:
        xv = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = xv[..., 0, :], xv[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(x.shape)
        h <<= 1
    return x


def rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """vLLM's ``single_rht`` on fp32 x [..., D]: ``H_b (signs * x)`` per block of ``b``, or with
    ``inverse`` ``signs * H_b x`` (= ``b`` times the inverse rotation)."""
    d = x.shape[-1]
    b = rht_block(d)
    xb = x.reshape(*x.shape[:-1], d // b, b)
    signs = _rht_signs(b).to(x.device)
    out = _butterfly(xb) * signs if inverse else _butterfly(xb * signs)
    return out.reshape(x.shape)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """The kernel's ``where(v >= 0, v + 0.5, v - 0.5).to(int32)``, then clamp to [0, 15]."""
    return torch.where(v >= 0, v + 0.5, v - 0.5).trunc().clamp(0.0, QMAX)


def store(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (the states, model dtype) -> (codes [..., D/2] uint8, scales [...] fp32 with
    the zero point in their low 4 bits): the bytes vLLM writes into its page."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"int4_per_token_head needs an even head_dim, got {d}")
    rotated = rht(x.float()).to(x.dtype).float()  # [..., D]; vLLM hands the kernel x's dtype
    lo, hi = rotated.amin(-1), rotated.amax(-1)  # [...]
    scale = ((hi - lo) / QMAX).clamp_min(SCALE_FLOOR)
    zp = _round_half_away(-lo / scale)
    q = _round_half_away(rotated * (1.0 / scale)[..., None] + zp[..., None]).to(torch.uint8)
    codes = q[..., 0::2] | (q[..., 1::2] << 4)
    bits = (scale.view(torch.int32) & -16) | zp.to(torch.int32)
    return codes, bits.view(torch.float32)


def read_rotated(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """What vLLM's attention kernel reads, in the rotated basis: fp32 ``(q - zp) * scale``
    [..., D] (scale with its zero-point bits cleared)."""
    q = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(*codes.shape[:-1], -1)
    bits = scales.view(torch.int32)
    zp = (bits & 0xF).float()[..., None]
    return (q.float() - zp) * (bits & -16).view(torch.float32)[..., None]


def read(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The K or V vLLM's attention effectively uses, in the model's basis:
    ``R^T read_rotated / b`` [..., D] in ``dtype`` (see the module docstring)."""
    rotated = read_rotated(codes, scales)
    return (rht(rotated, inverse=True) / rht_block(rotated.shape[-1])).to(dtype)
