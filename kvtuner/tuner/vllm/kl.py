"""KL vs fp, and perplexity, of an engine plan (:class:`PlanKL`: a vLLM skip set's plan or a
per-layer recipe) and of vLLM skip sets (:class:`SkipKL`: layers in
``--kv-cache-dtype-skip-layers`` keep the model dtype, the rest are stored in the vLLM KV dtype),
through the HF cache that stores K/V as vLLM does
(:func:`kvtuner.runtime_loader.hf.vllm_cache.make_vllm_cache`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..runtime_loader.vllm import VllmPlan

__all__ = ["PlanKL", "SkipKL"]


@dataclass(frozen=True)
class PlanKL:
    """KL vs fp (and perplexity) of plans on ``tokens`` (int64 [samples, seq]); a plan has
    ``num_layers`` and ``layer_formats(layer)`` (``VllmPlan``, ``EngineRecipe``)."""

    lm: Any
    tokens: Any
    reference: Any  # the fp log-probs of ``tokens``

    @classmethod
    def on(cls, lm: Any, tokens: Any) -> PlanKL:
        from ..calibration import fp_reference

        return cls(lm, tokens, fp_reference(lm, tokens))

    def _run(self, plan: Any, nll: bool) -> tuple[float, float | None]:
        from ..calibration.kl import measure_with_cache
        from ..runtime_loader.hf.vllm_cache import make_vllm_cache

        new_cache = lambda: make_vllm_cache(self.lm, plan)  # noqa: E731
        return measure_with_cache(self.lm, self.tokens, self.reference, new_cache, nll=nll)

    def kl(self, plan: Any) -> float:
        return self._run(plan, nll=False)[0]

    def ppl(self, plan: Any) -> float:
        return math.exp(self._run(plan, nll=True)[1])


@dataclass(frozen=True)
class SkipKL:
    """KL vs fp (and perplexity) of skip sets on ``tokens`` (int64 [samples, seq])."""

    lm: Any
    kv_cache_dtype: str
    num_layers: int
    tokens: Any
    reference: Any  # the fp log-probs of ``tokens``

    @classmethod
    def on(cls, lm: Any, kv_cache_dtype: str, num_layers: int, tokens: Any) -> SkipKL:
        from ..calibration import fp_reference

        return cls(lm, kv_cache_dtype, num_layers, tokens, fp_reference(lm, tokens))

    def plan(self, skip: tuple[int, ...]) -> VllmPlan:
        return VllmPlan(self.kv_cache_dtype, self.num_layers, tuple(skip))

    def kl(self, skip: tuple[int, ...]) -> float:
        return PlanKL(self.lm, self.tokens, self.reference).kl(self.plan(skip))

    def ppl(self, skip: tuple[int, ...]) -> float:
        return PlanKL(self.lm, self.tokens, self.reference).ppl(self.plan(skip))
