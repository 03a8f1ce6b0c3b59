"""KL vs fp, and perplexity, of vLLM skip sets (:class:`SkipKL`): layers in
``--kv-cache-dtype-skip-layers`` keep the model dtype, the rest are stored in the vLLM KV dtype
(measured as plans, :class:`~kvtuner.tuner.plan_kl.PlanKL`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...runtime_loader.vllm import VllmPlan
from ..plan_kl import PlanKL

__all__ = ["SkipKL"]


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
        from ...calibration import fp_reference

        return cls(lm, kv_cache_dtype, num_layers, tokens, fp_reference(lm, tokens))

    def plan(self, skip: tuple[int, ...]) -> VllmPlan:
        return VllmPlan(self.kv_cache_dtype, self.num_layers, tuple(skip))

    def kl(self, skip: tuple[int, ...]) -> float:
        return PlanKL(self.lm, self.tokens, self.reference).kl(self.plan(skip))

    def ppl(self, skip: tuple[int, ...]) -> float:
        return PlanKL(self.lm, self.tokens, self.reference).ppl(self.plan(skip))
