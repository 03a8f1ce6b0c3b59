"""What one `kvtuner search --target vllm` asks for: the goal (:class:`VllmGoal`: the vLLM
KV dtype and what the skip set may cost) and the run around it (:class:`VllmSettings`: model,
text, study, output), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ...errors import KVTunerError
from ...runtime_loader.vllm import VllmLayout, VllmPlan
from ..budget import Budget
from ..checks import check_engine_run
from ..study import StudySettings

__all__ = ["VllmGoal", "VllmSettings"]


@dataclass(frozen=True)
class VllmGoal:
    """What the skip set may cost: ``budget`` (bytes vs vLLM's cache at the model dtype, ``0.6x``,
    or mean bits per element, ``10bit``), ``max_skip`` layers, or both; ``ppl_within``: percent."""

    kv_cache_dtype: str
    budget: Budget | None = None
    max_skip: int | None = None
    ppl_within: float | None = None
    model_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        VllmPlan(self.kv_cache_dtype, 1)  # one line for an unknown dtype
        m = self.max_skip
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise KVTunerError(f"--max-skip must be a non-negative int, got {m!r}")
        p = self.ppl_within
        if p is not None and not (isinstance(p, int | float) and 0 < p < 1000):
            raise KVTunerError(f"--ppl-within must be a percentage > 0, got {p!r}")
        if self.budget is None and m is None and p is None:
            raise KVTunerError("the vLLM target needs --budget, --max-skip or --ppl-within")

    def ratio_cap(self) -> Fraction | None:
        if self.budget is None:
            return None
        value = self.budget.value
        return value if self.budget.kind == "ratio" else value / 16

    def skip_cap(self, layout: VllmLayout) -> int:
        """The most layers that may be skipped: --max-skip and the bytes budget, as vLLM counts."""
        n = layout.fingerprint.num_layers
        cap, ratio = n if self.max_skip is None else min(self.max_skip, n), self.ratio_cap()
        fp = layout.fp_bytes_per_token()

        def fits(k: int) -> bool:
            cost = layout.bytes_per_token(VllmPlan(self.kv_cache_dtype, n, tuple(range(k))))
            return ratio is None or Fraction(cost, fp) <= ratio

        if not fits(0):
            cost = layout.bytes_per_token(VllmPlan(self.kv_cache_dtype, n))
            raise KVTunerError(
                f"budget {self.budget.label} is below {self.kv_cache_dtype} on every layer "
                f"({cost / fp:.4f}x of {self.model_dtype})"
            )
        return max(k for k in range(cap + 1) if fits(k))


@dataclass(frozen=True, kw_only=True)
class VllmSettings:
    """study: n_trials (skip sets measured; the candidates are fixed, not sampled), storage
    (default :func:`default_storage` of ``output``) and study_name (default: from the dtype,
    the cap and the text)."""

    model: str
    goal: VllmGoal
    output: Path | str = Path("profile.json")
    study: StudySettings = field(default_factory=lambda: StudySettings(n_trials=12))
    dataset: str | None = None
    num_samples: int = 2
    seq_len: int = 256
    data_seed: int = 0
    confirm_samples: int = 4
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_engine_run(self, VllmGoal)
