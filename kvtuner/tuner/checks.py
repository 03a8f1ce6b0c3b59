"""The checks every target's settings share (the model, the text, whole counts, the engine
targets' run) and where a study lives by default: beside the profile it makes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import KVTunerError
from ..placement import Placement
from .study import StudySettings

__all__ = ["check_engine_run", "check_model", "check_text", "check_whole", "default_storage"]


def default_storage(output: Path) -> str:
    """``sqlite:///<output without .json>.optuna.db`` beside the profile."""
    return f"sqlite:///{output.resolve().with_suffix('.optuna.db')}"


def check_whole(name: str, value: object, *, zero: bool = False, optional: bool = False) -> None:
    """``value`` is a positive int (>= 0 with ``zero``; None allowed when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        kind = "a non-negative" if zero else "a positive"
        raise KVTunerError(f"{name} must be {kind} integer, got {value!r}")


def check_model(model: object) -> None:
    if not isinstance(model, str) or not model:
        raise KVTunerError(f"--model must name a model, got {model!r}")


def check_text(num_samples: int, seq_len: int, data_seed: int, confirm_samples: int) -> None:
    """The calibration windows asked for: positive counts, and held-back ones >= 0."""
    c = confirm_samples
    if isinstance(c, bool) or not isinstance(c, int):
        raise KVTunerError(f"confirm_samples must be an integer, got {c!r}")
    if c < 0:
        raise KVTunerError(f"confirm_samples must be >= 0, got {c}")
    check_whole("--num-samples", num_samples)
    check_whole("--seq-len", seq_len)
    check_whole("--data-seed", data_seed, zero=True)


def check_engine_run(settings: object, goal_type: type) -> None:
    """The checks an engine target's settings (vLLM skip sets, recipes) share: the model, the
    goal's type, the study, the placement and the text; ``output`` becomes a Path and the
    study's storage defaults to :func:`default_storage` beside it (frozen: set in place)."""
    s = settings
    check_model(s.model)
    if not isinstance(s.goal, goal_type):
        kind = type(s.goal).__name__
        raise KVTunerError(f"goal must be a {goal_type.__name__}, got {kind}")
    if not isinstance(s.study, StudySettings):
        raise KVTunerError(f"study must be StudySettings, got {type(s.study).__name__}")
    Placement(s.device, s.dtype)  # one line for an unknown device or dtype
    check_text(s.num_samples, s.seq_len, s.data_seed, s.confirm_samples)
    object.__setattr__(s, "output", Path(s.output))
    if s.study.storage is None:  # the study lives beside the profile
        storage = default_storage(s.output)
        object.__setattr__(s, "study", dataclasses.replace(s.study, storage=storage))
