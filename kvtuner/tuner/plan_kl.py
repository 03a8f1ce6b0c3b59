"""KL vs fp, and perplexity, of an engine plan (a vLLM skip set's plan, a per-layer recipe)
through the HF cache that stores K/V as vLLM does
(:func:`kvtuner.runtime_loader.hf.vllm_cache.make_vllm_cache`): what the engine targets measure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PlanKL"]


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
