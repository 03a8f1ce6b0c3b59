"""The model and the text every target measures on: the model loaded where the settings ask (or
one already loaded), the study's calibration windows and, for the confirmation, disjoint ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..placement import Placement, placement, placement_of, reset_peak_memory
from .confirmation import held_back

if TYPE_CHECKING:
    from ..calibration import CalibrationData

__all__ = ["TextSettings", "load_placed", "load_text"]


class TextSettings(Protocol):
    """The text a target's settings ask for (every target's settings record has these)."""

    dataset: str | None
    num_samples: int
    seq_len: int
    data_seed: int


def load_placed(
    model: str, device: str, dtype: str, loaded: tuple[Any, Any] | None = None
) -> tuple[Any, Any, Placement]:
    """(model, tokenizer, placement): ``loaded`` as is, else ``model`` loaded where asked. The
    peak GPU memory count starts here."""
    from ..calibration import load_model

    where = placement(device, dtype) if loaded is None else placement_of(loaded[0])
    reset_peak_memory(where.torch_device)
    lm, tokenizer = loaded or load_model(model, device=where.device, dtype=where.dtype)
    return lm, tokenizer, where


def load_text(
    tokenizer: Any,
    settings: TextSettings,
    confirm_samples: int,
    confirm_seq_len: int | None = None,
) -> tuple[CalibrationData, CalibrationData | None]:
    """The study's windows (``settings``' dataset, num_samples, seq_len, data_seed) and, with
    ``confirm_samples``, as many more disjoint ones of ``confirm_seq_len`` tokens (None: the
    study's length; no windows without ``confirm_samples``)."""
    from ..calibration import load_calibration_data

    s = settings
    data = load_calibration_data(
        tokenizer, dataset=s.dataset, num_samples=s.num_samples, seq_len=s.seq_len, seed=s.data_seed
    )
    if not confirm_samples:
        return data, None
    return data, held_back(tokenizer, s.dataset, data, confirm_samples, confirm_seq_len)
