"""What one `kvtuner search --target pool` asks for: the model, the budget, the space, the text,
the study and the outputs, in one frozen record validated on construction (bad input fails here,
before any model is loaded). The CLI fills it from its flags; :func:`kvtuner.search` from its
keywords (the pool target's ``settings`` stage)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import KVTunerError
from ...placement import Placement
from ...quant import QUANTIZED_BITS
from ...search_spaces import SearchPreset, load_preset
from ..budget import Budget
from ..checks import check_model, check_text, check_whole, default_storage
from ..confirmation import CONFIRM_METRICS
from ..study import StudySettings

__all__ = ["SearchSettings", "check_bits"]


def check_bits(bits: Sequence[int] | None) -> tuple[int, ...] | None:
    """The distinct quantized widths, sorted; None stays None (the default widths)."""
    if bits is None:
        return None
    widths = tuple(sorted(set(bits)))
    if not widths or any(isinstance(b, bool) or b not in QUANTIZED_BITS for b in widths):
        raise KVTunerError(f"bits must be among {QUANTIZED_BITS}, got {tuple(bits)}")
    return widths


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """budget: ``"4bit"``, ``"0.30x"`` or a :class:`Budget`. preset: a name or a JSON file (held
    loaded). sensitivity: a file from `kvtuner calibrate` (None: calibrate, cached beside
    ``output``). bits: the widths keys and values choose from (16 always is one). study: its
    storage defaults to :func:`default_storage` of ``output``. context_length: where window
    layers are capped in the budget (None: ``seq_len``). confirm_samples: held-back windows
    the finalists are re-measured on (0: off), of ``confirm_seq_len`` tokens (None:
    ``seq_len``), by ``confirm_metric`` (``kl`` or ``nll``, see :mod:`.confirmation`).
    baselines: also measure the uniform configurations over the budget. device, dtype,
    batch_size: see :mod:`kvtuner.placement`."""

    model: str
    budget: Budget | str
    output: Path | str = Path("profile.json")
    sensitivity: Path | str | None = None
    preset: SearchPreset | str = "per-token"
    bits: tuple[int, ...] | None = None
    study: StudySettings = field(default_factory=StudySettings)
    num_clusters: int | None = None
    dataset: str | None = None
    num_samples: int = 2
    seq_len: int = 256
    context_length: int | None = None
    data_seed: int = 0
    confirm_samples: int = 4
    confirm_seq_len: int | None = None
    confirm_metric: str = "kl"
    pareto_dir: Path | str | None = None
    plot: Path | str | None = None
    baselines: bool = False
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        check_model(self.model)
        budget = self.budget
        self._set("budget", budget if isinstance(budget, Budget) else Budget.parse(budget))
        preset = self.preset
        self._set("preset", preset if isinstance(preset, SearchPreset) else load_preset(preset))
        self._set("bits", check_bits(self.bits))
        if not isinstance(self.study, StudySettings):
            raise KVTunerError(f"study must be StudySettings, got {type(self.study).__name__}")
        Placement(self.device, self.dtype)  # one line for an unknown device or dtype
        self._check_counts()
        self._set_paths()
        if self.study.storage is None:  # the study lives beside the profile
            storage = default_storage(self.output)
            self._set("study", dataclasses.replace(self.study, storage=storage))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # frozen: normalised once, here

    def _check_counts(self) -> None:
        check_text(self.num_samples, self.seq_len, self.data_seed, self.confirm_samples)
        check_whole("--confirm-seq-len", self.confirm_seq_len, optional=True)
        if self.confirm_metric not in CONFIRM_METRICS:
            raise KVTunerError(
                f"--confirm-metric must be one of {', '.join(CONFIRM_METRICS)}, "
                f"got {self.confirm_metric!r}"
            )
        check_whole("--num-clusters", self.num_clusters, optional=True)
        check_whole("--context-length", self.context_length, optional=True)
        check_whole("--batch-size", self.batch_size, optional=True)

    def _set_paths(self) -> None:
        for name in ("output", "sensitivity", "pareto_dir", "plot"):
            value = getattr(self, name)
            self._set(name, Path(value) if value or name == "output" else None)
        if self.sensitivity is not None and not self.sensitivity.is_file():
            raise KVTunerError(f"sensitivity file not found: {self.sensitivity}")

    @property
    def context(self) -> int:
        """The context the budget is stated at (hybrid models): --context-length or --seq-len."""
        return self.seq_len if self.context_length is None else self.context_length
