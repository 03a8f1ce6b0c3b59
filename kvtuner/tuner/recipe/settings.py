"""What one `kvtuner search --target recipe` asks for: the engine and its formats, the budget in
effective bits as ModelOpt counts them (:class:`RecipeGoal`), and the run around it
(:class:`RecipeSettings`: model, text, study, output), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ...errors import KVTunerError
from ...quant.engine_recipe import ENGINE_FORMATS, LAYER_FORMATS, format_bits
from ..budget import Budget
from ..checks import check_engine_run
from ..study import StudySettings

__all__ = ["RecipeGoal", "RecipeSettings"]


@dataclass(frozen=True)
class RecipeGoal:
    """``engine``: an :data:`ENGINE_FORMATS` key; ``formats``: the per-layer choices (default:
    all the engine serves; always a subset of them); ``budget``: mean effective bits per layer
    (``5.4bit``; the model dtype counts 16)."""

    engine: str
    budget: Budget
    formats: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_FORMATS:
            raise KVTunerError(
                f"unknown engine {self.engine!r}; choose from {', '.join(ENGINE_FORMATS)}"
            )
        if not isinstance(self.budget, Budget) or self.budget.kind != "bits":
            raise KVTunerError("the recipe target's budget is effective bits, e.g. --budget 5.4bit")
        served = ENGINE_FORMATS[self.engine]
        formats = served if self.formats is None else tuple(dict.fromkeys(self.formats))
        unknown = [f for f in formats if f not in LAYER_FORMATS]
        if unknown:
            raise KVTunerError(
                f"unknown format(s) {', '.join(unknown)}; kvtuner knows {', '.join(LAYER_FORMATS)}"
            )
        bad = [f for f in formats if f not in served]
        if bad:
            raise KVTunerError(
                f"{self.engine} does not serve {', '.join(bad)} per layer; it serves "
                f"{', '.join(served)}"
            )
        if len(formats) < 2:
            raise KVTunerError(f"a recipe needs at least two formats to choose from, got {formats}")
        object.__setattr__(self, "formats", formats)

    def by_bits(self, head_dim: int) -> tuple[str, ...]:
        """The formats, fewest bits first (ties by name)."""
        return tuple(sorted(self.formats, key=lambda f: (format_bits(f, head_dim), f)))

    def capacity(self, num_layers: int) -> Fraction:
        """The most the layers' bits may add up to."""
        return self.budget.value * num_layers

    def check_feasible(self, num_layers: int, head_dim: int) -> None:
        cheapest = format_bits(self.by_bits(head_dim)[0], head_dim)
        if cheapest > self.budget.value:
            raise KVTunerError(
                f"budget {self.budget.label} is below the cheapest format "
                f"{self.by_bits(head_dim)[0]} ({float(cheapest):g} bits) on every layer"
            )


@dataclass(frozen=True, kw_only=True)
class RecipeSettings:
    """study: n_trials (whole recipes measured after the one-layer scores), storage (default
    beside ``output``) and study_name (default: from the text, so searches of one model over
    other budgets or formats reuse its measurements)."""

    model: str
    goal: RecipeGoal
    output: Path | str = Path("recipe.json")
    study: StudySettings = field(default_factory=lambda: StudySettings(n_trials=24))
    dataset: str | None = None
    num_samples: int = 2
    seq_len: int = 256
    data_seed: int = 0
    confirm_samples: int = 4
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_engine_run(self, RecipeGoal)
