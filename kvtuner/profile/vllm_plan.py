"""VllmPlan: what vLLM is told about its KV cache: one ``--kv-cache-dtype`` and the layers
``--kv-cache-dtype-skip-layers`` keeps at the model's dtype. Part of a vLLM profile's schema
(:mod:`.vllm_profile`); the vLLM runtime reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import KVTunerError
from ..quant.vllm_format import VllmKVFormat, effective_skip_layers


@dataclass(frozen=True)
class VllmPlan:
    """kv_cache_dtype: a vLLM dtype kvtuner emulates (:data:`~kvtuner.quant.vllm_format.
    VLLM_KV_DTYPES`); skip_layers: sorted layer indices stored at the model's dtype;
    k_scale/v_scale: the per-tensor fp8 scales vLLM uses (1.0 unless the checkpoint has some)."""

    kv_cache_dtype: str
    num_layers: int
    skip_layers: tuple[int, ...] = ()
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        try:
            VllmKVFormat(self.kv_cache_dtype, self.k_scale, self.v_scale)
        except ValueError as exc:
            raise KVTunerError(str(exc)) from None
        n = self.num_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise KVTunerError(f"num_layers must be a positive int, got {n!r}")
        skip = tuple(self.skip_layers)
        bad = [i for i in skip if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
        if bad:
            raise KVTunerError(f"skip layers must be layer indices 0..{n - 1}, got {bad}")
        object.__setattr__(self, "skip_layers", tuple(sorted(set(skip))))

    @property
    def format(self) -> VllmKVFormat:
        return VllmKVFormat(self.kv_cache_dtype, self.k_scale, self.v_scale)

    @property
    def model_dtype_layers(self) -> tuple[int, ...]:
        """The layers vLLM keeps at the model dtype: the skip set, and for TurboQuant its
        boundary layers (vLLM adds them itself)."""
        return effective_skip_layers(self.kv_cache_dtype, self.skip_layers, self.num_layers)

    def layer_format(self, layer: int) -> VllmKVFormat | None:
        """The format layer ``layer`` is stored in; None: the model's dtype (skipped)."""
        return None if layer in self.model_dtype_layers else self.format

    def layer_formats(self, layer: int) -> tuple[VllmKVFormat | None, VllmKVFormat | None]:
        """K's and V's format in ``layer`` (both None: the model's dtype)."""
        fmt = self.layer_format(layer)
        return fmt, fmt

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM(...)`` / ``EngineArgs``."""
        kw: dict[str, Any] = {"kv_cache_dtype": self.kv_cache_dtype}
        if self.skip_layers:
            kw["kv_cache_dtype_skip_layers"] = [str(i) for i in self.skip_layers]
        return kw

    def cli_args(self) -> list[str]:
        """The same as ``vllm serve`` flags."""
        args = ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.skip_layers:
            # vLLM parses this list flag space-separated (nargs="+"); "0,5" would be one name
            args += ["--kv-cache-dtype-skip-layers", *map(str, self.skip_layers)]
        return args
