"""What one `kvtuner eval` asks for: the model, the rows (profiles, uniform baselines, HF quanto),
the task and its text, decode timing, placement and the outputs, in one frozen record validated
on construction (bad input fails here, before any model is loaded). The CLI fills it from its
flags; :func:`kvtuner.evaluation.run.evaluate` from its keywords. Messages name the CLI's flags,
which the keywords mirror (``--num-windows`` is ``num_windows``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KVTunerError
from ..placement import Placement
from .configs import check_uniform_name
from .data import DEFAULT_NUM_WINDOWS, DEFAULT_SEQ_LEN
from .retrieval.run import DEFAULT_DEPTHS, RetrievalSettings
from .retrieval.tasks import TASKS as RETRIEVAL_TASKS
from .speed import (
    DEFAULT_DECODE_STEPS,
    DEFAULT_PACK_CHUNK,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_REPEATS,
    DEFAULT_RESIDUAL,
    DecodeSettings,
)

TASK_CHOICES = ("perplexity", *RETRIEVAL_TASKS)
QUANTO_MODES = ("auto", "on", "off")
DEFAULT_SCORE_TOKENS = 1024

__all__ = ["QUANTO_MODES", "TASK_CHOICES", "EvalSettings"]


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"kv8,kv4"`` or ``["kv8", "k4v2,kivi4"]`` -> ``("kv8", "kv4", ...)`` (order kept), each
    a uniform baseline name."""
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(item, str) for item in items):
        raise KVTunerError(f"--uniform takes names such as 'kv8,kv4', got {value!r}")
    names = tuple(n.strip() for item in items for n in item.split(",") if n.strip())
    for name in names:
        check_uniform_name(name)
    return names


def _paths(value: str | Path | Sequence[str | Path]) -> tuple[str, ...]:
    """Profile paths as given (a report's ``source`` names the file the way the user did)."""
    items = [value] if isinstance(value, (str, Path)) else list(value)
    return tuple(os.fspath(p) for p in items)


def _whole(name: str, value: object, *, zero: bool = False) -> None:
    """``value`` is a positive int (>= 0 with ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        kind = "a non-negative" if zero else "a positive"
        raise KVTunerError(f"{name} must be {kind} integer, got {value!r}")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise KVTunerError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """profiles: profile files, one row each. uniform: baseline names (``"kv8,kv4"`` or a list;
    see :mod:`.configs`). hf_quanto: transformers' QuantizedCache as a peer (``auto``: where it
    runs). task: ``perplexity`` or a retrieval task. context_lengths: retrieval prompt lengths
    (required there) / long-context perplexity windows, each scoring its last ``score_tokens``.
    depths, samples, haystack, seed, chat: the retrieval samples; results: their JSON-lines file
    (resume). kl: KL vs fp and top-1 agreement (whole-window perplexity only). decode_speed: time
    decoding with ``decode_*`` (residual_length and pack_chunk also shape retrieval's decode).
    device, dtype: see :mod:`kvtuner.placement`; threads: torch's CPU threads. output: the report
    as JSON; plot: PNG(s). ``decode`` and ``retrieval`` are derived, validated settings."""

    model: str
    profiles: tuple[str, ...] | Sequence[str | Path] = ()
    uniform: tuple[str, ...] | str | Sequence[str] = ()
    hf_quanto: str = "auto"
    task: str = "perplexity"
    dataset: str | None = None
    num_windows: int = DEFAULT_NUM_WINDOWS
    seq_len: int = DEFAULT_SEQ_LEN
    context_lengths: tuple[int, ...] | Sequence[int] | None = None
    score_tokens: int = DEFAULT_SCORE_TOKENS
    depths: tuple[float, ...] | Sequence[float] = DEFAULT_DEPTHS
    samples: int = 5
    haystack: str = "noise"
    seed: int = 0
    results: Path | str | None = None
    chat: bool = True
    kl: bool = False
    decode_speed: bool = True
    decode_prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    decode_steps: int = DEFAULT_DECODE_STEPS
    decode_repeats: int = DEFAULT_REPEATS
    residual_length: int = DEFAULT_RESIDUAL
    pack_chunk: int = DEFAULT_PACK_CHUNK
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    output: Path | str | None = None
    plot: Path | str | None = None
    decode: DecodeSettings | None = field(init=False, default=None)
    retrieval: RetrievalSettings | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise KVTunerError(f"--model must name a model, got {self.model!r}")
        self._normalise()
        _choice("--task", self.task, TASK_CHOICES)
        _choice("--hf-quanto", self.hf_quanto, QUANTO_MODES)
        if not self.profiles and not self.uniform and self.is_perplexity:
            raise KVTunerError("nothing to evaluate: give --profile PATH and/or --uniform NAMES")
        self._check_long_context()
        if self.kl and (not self.is_perplexity or self.context_lengths):
            raise KVTunerError(
                "--kl scores whole windows: use it with --task perplexity and no --context-length"
            )
        self._check_counts()
        if self.decode_speed:
            self._set("decode", self._decode_settings())
        Placement(self.device, self.dtype)  # one line for an unknown device or dtype

    @property
    def is_perplexity(self) -> bool:
        return self.task == "perplexity"

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # frozen: normalised once, here

    def _normalise(self) -> None:
        self._set("profiles", _paths(self.profiles))
        self._set("uniform", _names(self.uniform))
        lengths = self.context_lengths
        if isinstance(lengths, int):
            lengths = (lengths,)
        self._set("context_lengths", tuple(lengths) if lengths else None)
        self._set("depths", tuple(self.depths))
        for name in ("results", "output", "plot"):
            value = getattr(self, name)
            self._set(name, Path(value) if value else None)

    def _check_long_context(self) -> None:
        """Retrieval needs lengths (and valid samples); long-context perplexity windows must be
        longer than the tokens they score."""
        if not self.is_perplexity and not self.context_lengths:
            raise KVTunerError(f"--task {self.task} needs --context-length N [N ...]")
        lengths = self.context_lengths or ()
        if any(isinstance(n, bool) or not isinstance(n, int) for n in lengths):
            raise KVTunerError(f"--context-length takes token counts, got {lengths!r}")
        short = self.context_lengths and min(self.context_lengths) <= self.score_tokens
        if self.is_perplexity and short:
            raise KVTunerError("--context-length must exceed --score-tokens")
        if not self.is_perplexity:
            self._set("retrieval", self._retrieval_settings())

    def _retrieval_settings(self) -> RetrievalSettings:
        return RetrievalSettings(
            task=self.task,
            lengths=self.context_lengths,
            depths=self.depths,
            samples=self.samples,
            haystack=self.haystack,
            seed=self.seed,
            residual_length=self.residual_length,
            pack_chunk=self.pack_chunk,
            chat=self.chat,
        )

    def _decode_settings(self) -> DecodeSettings:
        return DecodeSettings(
            self.decode_prompt_tokens,
            self.decode_steps,
            self.decode_repeats,
            self.residual_length,
            self.pack_chunk,
        )

    def _check_counts(self) -> None:
        _whole("--num-windows", self.num_windows)
        _whole("--seq-len", self.seq_len)
        _whole("--score-tokens", self.score_tokens)
        if self.threads is not None:
            _whole("--threads", self.threads, zero=True)
