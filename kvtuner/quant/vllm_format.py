"""vLLM's own KV cache formats (``--kv-cache-dtype``), emulated exactly as vLLM 0.32 stores them.

vLLM stores a layer either at the model's dtype (``auto``, or a layer listed in
``--kv-cache-dtype-skip-layers``) or in one format for the whole model. The definitions, read from
vLLM 0.32's source:

- ``fp8`` / ``fp8_e4m3`` / ``fp8_e5m2`` (per-tensor scale, ``KVQuantMode.FP8_PER_TENSOR``): the
  cache holds ``(x / k_scale).to(float8)`` (fp32 divide, round to nearest even); reads multiply by
  the scale. Without calibrated scales vLLM uses 1.0, so e4m3 saturates at ±448; torch's own
  cast would give NaN, so this module clamps first. vLLM's CPU kernel
  (``cpu_attn_reshape_and_cache``) saturates too but rounds toward zero: its codes are these or
  one nearer zero (tested bit-exact against that rule in tests/runtime_loader/vllm).
- ``int8_per_token_head`` / ``fp8_per_token_head`` (Triton ``_reshape_cache_per_token_head``):
  one fp32 scale per token and KV head, ``scale = max(absmax / QMAX, 1e-6)``;
  ``q = x * (1 / scale)``; int8 rounds half away from zero, then clamps to [-128, 127]; fp8
  clamps to ±448 and casts. The page holds the codes and the fp32 scale inline.
- ``int4_per_token_head``: Hadamard-rotated, asymmetric 4-bit codes packed two per byte, the
  zero point hidden in the fp32 scale's low mantissa bits (:mod:`kvtuner.quant.vllm_int4`);
  reads return the K and V attention effectively sees in the model's basis.

Tested bit-exact against vLLM's kernels under the Triton interpreter (IEEE fp32). On a GPU,
Triton's fp32 ``/`` is ``div.full.f32`` (up to 2 ulp), so a per-token-head scale can differ in its
last bit there and, rarely, a code by one (docs/engines.md).

- ``nvfp4`` / ``nvfp4_4over6``: E2M1 in blocks of 16 with FP8 block scales under the layer's
  per-tensor scale (:mod:`kvtuner.quant.vllm_nvfp4`).
- ``turboquant_k8v4`` / ``turboquant_4bit_nc`` / ``turboquant_k3v4_nc`` / ``turboquant_3bit_nc``:
  Hadamard-rotated Lloyd-Max (or fp8) keys and uniform values
  (:mod:`kvtuner.quant.vllm_turboquant`).
  What a decode step reads from the cache; vLLM's first prefill chunk attends over the unquantized
  K/V instead, so a prompt's own first chunk sees less damage in vLLM than here. vLLM adds its
  boundary layers (first and last two) to the skip set itself (:func:`effective_skip_layers`).

Not emulated (named in docs/engines.md, reason in :data:`NOT_EMULATED`): ``ultraquant_4bit``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import vllm_int4, vllm_nvfp4, vllm_turboquant

__all__ = [
    "NOT_EMULATED",
    "VLLM_KV_DTYPES",
    "VllmKVFormat",
    "effective_skip_layers",
    "kv_scale",
    "model_dtype_bytes",
]

FP8_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
PER_TOKEN_HEAD = {  # dtype -> (storage dtype, QUANT_MIN, QUANT_MAX) as vLLM's Triton kernel
    "int8_per_token_head": (torch.int8, -128.0, 127.0),
    "fp8_per_token_head": (torch.float8_e4m3fn, -448.0, 448.0),
}
INT4 = "int4_per_token_head"
NVFP4 = tuple(vllm_nvfp4.KV_CACHE_DTYPES)  # nvfp4, nvfp4_4over6
TURBOQUANT = tuple(vllm_turboquant.PRESETS)
VLLM_KV_DTYPES = (*FP8_DTYPES, *PER_TOKEN_HEAD, INT4, *NVFP4, *TURBOQUANT)
NOT_EMULATED = {"ultraquant_4bit": "packed fp4 with UE8M0 group scales; not reproduced"}
SCALE_FLOOR = vllm_int4.SCALE_FLOOR  # vLLM's per-token-head scale floor (int8, fp8, int4)
_MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def model_dtype_bytes(dtype: str) -> int:
    """Bytes per element of a layer vLLM keeps at the model's dtype (a skipped layer)."""
    if dtype not in _MODEL_DTYPE_BYTES:
        raise ValueError(f"model dtype must be one of {tuple(_MODEL_DTYPE_BYTES)}, got {dtype!r}")
    return _MODEL_DTYPE_BYTES[dtype]


def kv_scale(kv_cache_dtype: str, amax: float) -> float:
    """The per-tensor scale a calibrated checkpoint gives ``kv_cache_dtype`` for a side whose
    largest |x| is ``amax``: ModelOpt's amax / 448 for FP8 (nothing saturates) and for NVFP4
    (its global scale 448 / amax keeps block scales inside E4M3); 1.0 for the formats that
    compute their own scales, or for an all-zero side."""
    if kv_cache_dtype in (*FP8_DTYPES, *NVFP4) and amax > 0:
        return float(amax) / torch.finfo(torch.float8_e4m3fn).max
    return 1.0


def effective_skip_layers(
    kv_cache_dtype: str, skip: tuple[int, ...], num_layers: int
) -> tuple[int, ...]:
    """The layers vLLM keeps at the model dtype: ``skip``, plus TurboQuant's boundary layers
    (vLLM adds them whatever the user passes)."""
    if kv_cache_dtype in TURBOQUANT:
        skip = (*skip, *vllm_turboquant.boundary_skip_layers(num_layers))
    return tuple(sorted(set(skip)))


def _check_scale(name: str, value: float) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if bad or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class VllmKVFormat:
    """One vLLM ``--kv-cache-dtype`` and, for the per-tensor fp8 formats, the k/v scales vLLM
    would load (1.0 when the checkpoint has none)."""

    kv_cache_dtype: str
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in VLLM_KV_DTYPES:
            name = self.kv_cache_dtype
            why = next((v for k, v in NOT_EMULATED.items() if name.startswith(k)), "")
            detail = f" ({why})" if why else ""
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not emulated{detail}; "
                f"choose one of {', '.join(VLLM_KV_DTYPES)}"
            )
        _check_scale("k_scale", self.k_scale)
        _check_scale("v_scale", self.v_scale)
        own = self.per_token_head or self.kv_cache_dtype in TURBOQUANT
        if own and (self.k_scale, self.v_scale) != (1.0, 1.0):
            raise ValueError(f"{self.kv_cache_dtype} computes its own scales; k/v scales are 1.0")

    @property
    def per_token_head(self) -> bool:
        return self.kv_cache_dtype in PER_TOKEN_HEAD or self.kv_cache_dtype == INT4

    @property
    def storage_dtype(self) -> torch.dtype:
        if self.kv_cache_dtype in (INT4, *NVFP4, *TURBOQUANT):
            return torch.uint8  # two codes per byte (TurboQuant: a slot of bytes)
        if self.per_token_head:
            return PER_TOKEN_HEAD[self.kv_cache_dtype][0]
        return FP8_DTYPES[self.kv_cache_dtype]

    def side_bytes(self, head_dim: int, which: str) -> int:
        """Bytes one token-head of side ``which`` ("k" or "v") takes in vLLM's page: codes (+
        fp32 scale); int4 packs two codes per byte (vLLM's ``customize_spec``); NVFP4 adds a
        block scale byte per 16; TurboQuant's sides differ (:mod:`.vllm_turboquant`)."""
        if self.kv_cache_dtype in NVFP4:
            return vllm_nvfp4.head_bytes(head_dim)
        if self.kv_cache_dtype in TURBOQUANT:
            return vllm_turboquant.head_bytes(self.kv_cache_dtype, which, head_dim)
        codes = head_dim // 2 if self.kv_cache_dtype == INT4 else head_dim
        return codes + (4 if self.per_token_head else 0)

    def token_head_bytes(self, head_dim: int) -> int:
        """K plus V bytes of one token-head in vLLM's page (TurboQuant's slot rounds up to even)."""
        if self.kv_cache_dtype in TURBOQUANT:
            return vllm_turboquant.slot_bytes(self.kv_cache_dtype, head_dim)
        return self.side_bytes(head_dim, "k") + self.side_bytes(head_dim, "v")

    def scale_of(self, which: str) -> float:
        return {"k": self.k_scale, "v": self.v_scale}[which]

    def store(self, x: torch.Tensor, which: str) -> tuple[torch.Tensor | None, ...]:
        """x [..., head_dim] -> what vLLM's page holds for it, exactly as vLLM writes it, every
        tensor with x's leading dims: (codes [..., head_dim] in storage dtype, per-row fp32
        scales [...] or None) after :meth:`prepare` and the store's cast (fp8: round to nearest
        even, saturating like PTX ``cvt.rn.satfinite``; int8: truncation); int4:
        :func:`.vllm_int4.store`; NVFP4: (codes [..., head_dim / 2], fp8 block scales [...,
        head_dim / 16]); TurboQuant: :func:`.vllm_turboquant.store`'s tensors."""
        if self.kv_cache_dtype == INT4:
            return vllm_int4.store(x)
        if self.kv_cache_dtype in NVFP4:
            four_over_six = vllm_nvfp4.KV_CACHE_DTYPES[self.kv_cache_dtype]
            return vllm_nvfp4.store(x, self.scale_of(which), four_over_six=four_over_six)
        if self.kv_cache_dtype in TURBOQUANT:
            return vllm_turboquant.store(x, which, self.kv_cache_dtype)
        values, scales = self.prepare(x, which)
        if self.storage_dtype == torch.int8:
            return values.trunc().to(torch.int8), scales
        fmax = torch.finfo(self.storage_dtype).max
        return values.clamp(-fmax, fmax).to(self.storage_dtype), scales

    def prepare(self, x: torch.Tensor, which: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fp32 values vLLM's store kernel hands to its final cast, and the scales."""
        if self.kv_cache_dtype in (INT4, *NVFP4, *TURBOQUANT):
            raise ValueError(f"{self.kv_cache_dtype} has no separate final cast; use store()")
        xf = x.float()
        if not self.per_token_head:
            return xf / torch.tensor(self.scale_of(which), dtype=torch.float32), None
        store_dtype, qmin, qmax = PER_TOKEN_HEAD[self.kv_cache_dtype]
        scale = (xf.abs().amax(-1) / qmax).clamp_min(SCALE_FLOOR)  # [...] fp32
        q = xf * (1.0 / scale)[..., None]
        if store_dtype == torch.int8:  # round half away from zero; the store then truncates
            q = torch.where(q >= 0, q + 0.5, q - 0.5)
        return q.clamp(qmin, qmax), scale

    def load(
        self, stored: tuple[torch.Tensor | None, ...], which: str, dtype: torch.dtype
    ) -> torch.Tensor:
        """What attention reads from :meth:`store`'s tensors: codes times the scale (fp32), in
        ``dtype``; int4 and TurboQuant: what it effectively reads in the model's basis."""
        if self.kv_cache_dtype == INT4:
            return vllm_int4.read(*stored, dtype)
        if self.kv_cache_dtype in NVFP4:
            return vllm_nvfp4.read(*stored, self.scale_of(which), dtype)
        if self.kv_cache_dtype in TURBOQUANT:
            return vllm_turboquant.read(stored, which, self.kv_cache_dtype, dtype)
        codes, scales = stored
        scale = scales[..., None] if scales is not None else self.scale_of(which)
        return (codes.float() * scale).to(dtype)

    def fake_quantize(self, x: torch.Tensor, which: str) -> torch.Tensor:
        return self.load(self.store(x, which), which, x.dtype)

    def to_dict(self) -> dict:
        out: dict = {"kv_cache_dtype": self.kv_cache_dtype}
        if (self.k_scale, self.v_scale) != (1.0, 1.0):
            out.update(k_scale=self.k_scale, v_scale=self.v_scale)
        return out
