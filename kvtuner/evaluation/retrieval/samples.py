"""Samples: one seeded prompt per (task, haystack, length, depth, index), answers checked.

The seed of a sample is derived from all of its coordinates (and the run's seed), so any sample
can be rebuilt alone, in any order: a resumed run meets exactly the prompts it skipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ...errors import KVTunerError
from .prompt import Prompt, build_prompt
from .tasks import TaskDraw, draw_task

MAX_REDRAWS = 20  # a drawn answer that the haystack already holds is drawn again

__all__ = ["Sample", "SampleKey", "make_sample"]


@dataclass(frozen=True)
class SampleKey:
    task: str
    haystack: str
    length: int
    depth: float
    index: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.length < 1 or self.index < 0:
            raise KVTunerError("a sample needs a positive length and an index >= 0")
        if not 0.0 <= self.depth <= 1.0:
            raise KVTunerError(f"depth must be in [0, 1], got {self.depth}")

    def rng(self, attempt: int) -> random.Random:
        f = f"{self.seed}:{self.task}:{self.haystack}:{self.length}:{self.depth:g}:{self.index}"
        return random.Random(f"{f}:{attempt}")


@dataclass(frozen=True)
class Sample:
    key: SampleKey
    draw: TaskDraw
    prompt: Prompt
    text: str  # the decoded prompt

    @property
    def ids(self) -> tuple[int, ...]:
        return self.prompt.ids


def answer_counts(text: str, answers: tuple[str, ...]) -> tuple[int, ...]:
    """How often each answer occurs in ``text`` as a whole digit run / word."""
    import re

    return tuple(len(re.findall(rf"(?<![A-Za-z0-9]){re.escape(a)}(?![A-Za-z0-9])", text))
                 for a in answers)  # fmt: skip


def make_sample(tokenizer: Any, key: SampleKey, *, chat: bool = True) -> Sample:
    """The sample at ``key``; answers are redrawn until each occurs as often as the task says."""
    for attempt in range(MAX_REDRAWS):
        rng = key.rng(attempt)
        draw = draw_task(key.task, rng, key.depth)
        prompt = build_prompt(
            tokenizer, draw, length=key.length, haystack=key.haystack, rng=rng, chat=chat
        )
        text = tokenizer.decode(list(prompt.ids))
        if answer_counts(text, draw.answers) == draw.answer_counts:
            return Sample(key, draw, prompt, text)
    raise KVTunerError(f"could not place the answers of {key} exactly; try another --seed")
