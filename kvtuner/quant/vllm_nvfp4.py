"""vLLM 0.32's NVFP4 KV formats (``--kv-cache-dtype nvfp4`` / ``nvfp4_4over6``), in torch.

Read from vLLM 0.32 (``vllm/v1/attention/backends/flashinfer.py``, ``vllm/utils/torch_utils.py``,
``vllm/v1/kv_cache_interface.py``, ``vllm/model_executor/layers/quantization/kv_cache.py``,
``.../quantization/utils/nvfp4_emulation_utils.py``), vLLM's CUDA store kernel
``csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu`` (with ``quantization/fp4/nvfp4_utils.cuh``)
and FlashInfer's ``include/flashinfer/page.cuh`` (``nvfp4_append_quantize_block``):

- **Layout.** Each K (and V) row of D values is cut into blocks of 16 along head_dim. A block
  keeps 16 E2M1 codes (sign bit 3, magnitude index 0..7 into 0, .5, 1, 1.5, 2, 3, 4, 6), two per
  byte, element 2i in the low nibble of byte i (PTX ``cvt.rn.satfinite.e2m1x2.f32`` puts its
  second operand low; vLLM's ``break_fp4_bytes`` reads low first), and one FP8 E4M3 block scale.
  A token-head takes ``D/2 + D/16`` bytes per side (``nvfp4_kv_cache_full_dim``); K and V are
  separate head slots of the page, ``[K data | K scales | V data | V scales]``.
- **The per-layer scale.** ``kv_scale`` is the layer's ``k_scale`` / ``v_scale`` as vLLM loads
  it: the checkpoint's value, else 1.0 (``BaseKVCacheMethod``: nvfp4 is a quantized cache, and
  no per-format conversion is applied). It is the global *decode* scale: the store's global
  scale is ``g = 1 / kv_scale`` (fp32), and attention reads ``e2m1 * block_scale * kv_scale``
  (FlashInfer and trtllm-gen apply ``kv_scale`` to the logits / output in fp32). With 1.0 a
  block scale saturates at 448, so values past ``6 * 448 = 2688`` clamp. ModelOpt's HF export
  writes ``k_scale = amax / 448`` for an NVFP4 KV cache as for FP8 (block scales then top out
  at 448 / 6), not its NVFP4 activations' ``amax / (6 * 448)``.
- **Store, vLLM's kernel** (``reshape_and_cache_nvfp4_kernel``; the SM100 trtllm-gen path and
  the only writer with the 4over6 search), per block in fp32 (``ref_nvfp4_quant`` is the same
  arithmetic): ``sf = e4m3(g * (amax * (1/6)))`` (round to nearest even, saturating at 448),
  ``s = 1 / (sf * (1/g))`` (0 when sf is 0), code ``= e2m1(x * s)``.
- **Store, FlashInfer's writer** (``writer="flashinfer"``: SM80 / SM90 / SM120, where vLLM 0.32
  stores through ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``; ``nvfp4`` only):
  ``sf = e4m3(amax / (6 * kv_scale))``, ``s = 1 / (sf * kv_scale)``. The writers differ only
  in fp32 rounding; on half-precision inputs no stored byte differed (every bf16 / fp16 amax
  and value, against every block scale, at 41 scales).
- **E2M1 rounding** is round to nearest, ties to even code, saturating at ±6: |v| <= .25 -> 0,
  < .75 -> .5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6 (ties
  .25->0, .75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4; the same thresholds as vLLM's
  ``cast_to_fp4`` and ``round_to_nearest_e2m1``). The sign bit is the sign of ``x * s`` (a
  negative value rounding to zero stores -0).
- **4over6** (``cvt_warp_fp16_to_fp4_4over6``): both candidates ``sf_d = e4m3(g * (amax *
  (1/d)))``, ``s_d = 1 / (sf_d * (1/g))`` for d = 6 and 4; each one's error is
  ``sum (e2m1(x * s_d) * (1 / s_d) - x)^2`` in fp32, summed a pair at a time in element order
  (``err += dx*dx + dy*dy``, 16 elements per thread); d = 4 is kept only when its error is
  strictly smaller (ties keep 6), and its own ``sf_4`` is stored. Reads are unchanged.

Not reproduced (GPU arithmetic): vLLM's kernel takes ``1/6``, ``1/g`` and ``1/(...)`` with
``rcp.approx.ftz``, nvcc may fuse the error sums into FMAs, and a build older than CUDA 12.9
sums the 4over6 error as two 8-element halves; this module uses IEEE fp32 throughout (as vLLM's
torch reference does), so on a GPU a block scale, a code or a 4over6 choice can differ where an
fp32 value lies within an ulp or two of a rounding boundary. NaN inputs are not defined here.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

__all__ = [
    "BLOCK",
    "E2M1_GRID",
    "KV_CACHE_DTYPES",
    "decode_e2m1",
    "encode_e2m1",
    "fake_quantize",
    "head_bytes",
    "read",
    "store",
]

BLOCK = 16  # elements per FP8 block scale, along head_dim
E4M3_MAX = 448.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of codes 0..7; bit 3 = sign
KV_CACHE_DTYPES = {"nvfp4": False, "nvfp4_4over6": True}  # name -> stores with 4over6
_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)  # midpoints whose tie goes to the lower (even) code
_TIES_UP = (0.75, 1.75, 3.5)  # midpoints whose tie goes to the upper (even) code
Writer = Literal["vllm", "flashinfer"]


def _check_head_dim(head_dim: int) -> None:
    if head_dim <= 0 or head_dim % BLOCK:
        raise ValueError(f"nvfp4 needs head_dim a positive multiple of {BLOCK}, got {head_dim}")


def head_bytes(head_dim: int) -> int:
    """Bytes one token-head of K (or of V) takes in vLLM's page: ``D/2`` packed codes plus
    ``D/16`` FP8 block scales (``nvfp4_kv_cache_full_dim``)."""
    _check_head_dim(head_dim)
    return head_dim // 2 + head_dim // BLOCK


def _scale32(kv_scale: float, device: torch.device) -> torch.Tensor:
    """The layer scale as vLLM holds it: a positive finite fp32 scalar on ``device``."""
    bad = isinstance(kv_scale, bool) or not isinstance(kv_scale, int | float)
    if bad or not math.isfinite(kv_scale) or kv_scale <= 0:
        raise ValueError(f"kv_scale must be a positive finite number, got {kv_scale!r}")
    return torch.tensor(kv_scale, dtype=torch.float32, device=device)


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """fp32 values -> E2M1 codes (uint8, sign in bit 3): round to nearest, ties to the even
    code, saturating at ±6 (PTX ``cvt.rn.satfinite.e2m1x2.f32``)."""
    a = v.abs()
    mag = sum((a > t).to(torch.uint8) for t in _TIES_DOWN)  # a tie stays below
    mag = mag + sum((a >= t).to(torch.uint8) for t in _TIES_UP)  # a tie goes up
    return mag | (torch.signbit(v).to(torch.uint8) << 3)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, one per element) -> fp32 values."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes -> [..., D/2] bytes, element 2i low nibble, 2i+1 high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    """[..., D/2] bytes -> [..., D] codes."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def _to_e4m3(sf: torch.Tensor) -> torch.Tensor:
    """fp32 -> E4M3, round to nearest even, saturating (torch's own cast would give NaN)."""
    return sf.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def _inverse(sf: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``1 / (sf * denominator)`` where the block scale is nonzero, else 0 (fp32)."""
    safe = torch.where(sf > 0, sf, torch.ones_like(sf))
    return torch.where(sf > 0, 1.0 / (safe * denominator), torch.zeros_like(sf))


def _candidate(
    amax: torch.Tensor, g: torch.Tensor, divisor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's kernel: amax [..., nb] -> (E4M3 block scales, fp32 quantizing scales s)."""
    inv_divisor = torch.tensor(1.0 / divisor, dtype=torch.float32, device=amax.device)
    sf = _to_e4m3(g * (amax * inv_divisor))
    return sf, _inverse(sf.float(), 1.0 / g)


def _flashinfer_candidate(
    amax: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's writer: ``sf = e4m3(amax / (6 k))``, ``s = 1 / (sf k)``."""
    sf = _to_e4m3(amax / (6.0 * scale))
    return sf, _inverse(sf.float(), scale)


def _squared_error(blocks: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The 4over6 kernel's reconstruction error [..., nb] of blocks [..., nb, 16] under the
    quantizing scales s [..., nb]: dequantized with ``1/s``, summed a pair at a time."""
    dequant = _inverse(s, torch.ones((), dtype=torch.float32, device=s.device))  # [..., nb]
    q = decode_e2m1(encode_e2m1(blocks * s[..., None]))
    d = q * dequant[..., None] - blocks
    sq = d * d
    pairs = sq[..., 0::2] + sq[..., 1::2]  # [..., nb, 8]: dx*dx + dy*dy
    err = torch.zeros_like(s)
    for i in range(pairs.shape[-1]):  # the kernel's accumulation order
        err = err + pairs[..., i]
    return err


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> fp32 blocks [..., D/16, 16]."""
    _check_head_dim(x.shape[-1])
    return x.float().unflatten(-1, (-1, BLOCK))


def store(
    x: torch.Tensor,
    kv_scale: float,
    *,
    four_over_six: bool = False,
    writer: Writer = "vllm",
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (K or V, model dtype), the layer's k_scale / v_scale (1.0 without one) ->
    (codes [..., D/2] uint8, block scales [..., D/16] float8_e4m3fn): the bytes vLLM writes.
    ``writer`` picks vLLM's store kernel or FlashInfer's (see the module docstring)."""
    if writer not in ("vllm", "flashinfer"):
        raise ValueError(f"writer must be 'vllm' or 'flashinfer', got {writer!r}")
    if four_over_six and writer != "vllm":
        raise ValueError("vLLM stores nvfp4_4over6 only with its own kernel (writer='vllm')")
    blocks = _blocks(x)  # [..., nb, 16]
    scale = _scale32(kv_scale, x.device)
    amax = blocks.abs().amax(-1)  # [..., nb]
    if writer == "flashinfer":
        sf, s = _flashinfer_candidate(amax, scale)
    else:
        g = 1.0 / scale  # the kernel's global scale
        sf, s = _candidate(amax, g, 6.0)
        if four_over_six:
            sf4, s4 = _candidate(amax, g, 4.0)
            use4 = _squared_error(blocks, s4) < _squared_error(blocks, s)  # a tie keeps 6
            bits = torch.where(use4, sf4.view(torch.uint8), sf.view(torch.uint8))  # fp8 as bytes
            sf, s = bits.view(torch.float8_e4m3fn), torch.where(use4, s4, s)
    codes = encode_e2m1(blocks * s[..., None]).flatten(-2)  # [..., D]
    return _pack(codes), sf


def read(
    codes: torch.Tensor, block_scales: torch.Tensor, kv_scale: float, dtype: torch.dtype
) -> torch.Tensor:
    """What attention reads: ``e2m1 * block_scale * kv_scale`` [..., D] (fp32, then ``dtype``).
    The kernels multiply the exact ``e2m1 * block_scale`` by ``kv_scale`` on the logits / output;
    a half-precision ``dtype`` rounds once more here unless kv_scale is a power of two."""
    if codes.dtype != torch.uint8 or block_scales.dtype != torch.float8_e4m3fn:
        raise ValueError("read needs uint8 codes and float8_e4m3fn block scales")
    if codes.shape[-1] * 2 != block_scales.shape[-1] * BLOCK:
        raise ValueError(f"codes {tuple(codes.shape)} do not match {tuple(block_scales.shape)}")
    values = decode_e2m1(_unpack(codes)).unflatten(-1, (-1, BLOCK))  # [..., nb, 16]
    scaled = (values * block_scales.float()[..., None]).flatten(-2)  # exact in fp32
    return (scaled * _scale32(kv_scale, codes.device)).to(dtype)


def fake_quantize(
    x: torch.Tensor,
    kv_scale: float,
    *,
    four_over_six: bool = False,
    writer: Writer = "vllm",
) -> torch.Tensor:
    """:func:`read` of :func:`store`: x as vLLM's attention sees it, in x's dtype."""
    codes, block_scales = store(x, kv_scale, four_over_six=four_over_six, writer=writer)
    return read(codes, block_scales, kv_scale, x.dtype)
