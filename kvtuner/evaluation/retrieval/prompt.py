"""Prompt assembly at an exact length in tokens, needles at asked depths.

A prompt is token ids ``head + context + tail``:
- ``head``: the chat template's opening (the tokenizer's special prefix when it has no
  template) + the task's instruction;
- ``context``: haystack sentences, each tokenized on its own (a leading space), needles inserted
  whole at the sentence boundary nearest their depth, cut to the exact token budget (the last
  haystack sentence may be cut short);
- ``tail``: the question, the template's closing with the assistant's turn opened, and the
  answer prefix ("The pass key is"), so the greedy reply starts with the answer.
Ids are concatenated, never re-tokenized, so the prompt is exactly ``length`` tokens; its decoded
text is what the tests count answers in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ...errors import KVTunerError
from .haystack import sentences
from .tasks import TaskDraw

MARK = "\u0000CONTEXT\u0000"  # stands for the context while the chat template renders

__all__ = ["Prompt", "build_prompt"]


@dataclass(frozen=True)
class Prompt:
    """``ids``: the whole prompt; ``context_start``/``context_len``: where the context lies;
    ``needle_starts``: token offset of each needle inside the context (the task's order)."""

    ids: tuple[int, ...]
    context_start: int
    context_len: int
    needle_starts: tuple[int, ...]
    needle_lens: tuple[int, ...]

    def depth_of(self, i: int) -> float:
        """Realized depth of needle i: haystack tokens before it / all haystack tokens."""
        hay = self.context_len - sum(self.needle_lens)
        before = self.needle_starts[i] - sum(
            n for s, n in zip(self.needle_starts, self.needle_lens, strict=True)
            if s < self.needle_starts[i]
        )  # fmt: skip
        return before / hay if hay else 0.0


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _frame(tokenizer: Any, draw: TaskDraw, chat: bool) -> tuple[list[int], list[int]]:
    """(head ids, tail ids) around the context."""
    from ...calibration.batches import special_prefix

    body = f"{draw.instruction}\n\n{MARK}\n\n{draw.question}"
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": body}], add_generation_prompt=True, tokenize=False
        )
        head, tail = text.split(MARK)
        return _ids(tokenizer, head), _ids(tokenizer, tail + draw.answer_prefix)
    head, tail = body.split(MARK)
    return list(special_prefix(tokenizer)) + _ids(tokenizer, head), _ids(
        tokenizer, tail + " " + draw.answer_prefix
    )


def _haystack(tokenizer: Any, kind: str, rng: random.Random, budget: int):
    """Sentence ids until ``budget`` tokens: (ids, sentence start offsets), the last cut."""
    ids: list[int] = []
    starts: list[int] = []
    for sentence in sentences(kind, rng):
        if len(ids) >= budget:
            break
        starts.append(len(ids))
        ids += _ids(tokenizer, " " + sentence)
    return ids[:budget], [s for s in starts if s < budget] + [budget]


def build_prompt(
    tokenizer: Any,
    draw: TaskDraw,
    *,
    length: int,
    haystack: str,
    rng: random.Random,
    chat: bool = True,
) -> Prompt:
    """``draw`` hidden in haystack ``haystack``, exactly ``length`` tokens in all."""
    head, tail = _frame(tokenizer, draw, chat)
    needles = [_ids(tokenizer, " " + text) for text, _ in draw.needles]
    budget = length - len(head) - len(tail) - sum(map(len, needles))
    if budget < 1:
        raise KVTunerError(
            f"context length {length} is too short for this task: the instruction, question "
            f"and needles alone take {length - budget} tokens"
        )
    hay, bounds = _haystack(tokenizer, haystack, rng, budget)
    at = [min(bounds, key=lambda b, d=d: abs(b - d * budget)) for _, d in draw.needles]
    order = sorted(range(len(needles)), key=lambda i: (at[i], i))
    context, starts, prev = [], [0] * len(needles), 0
    for i in order:
        context += hay[prev : at[i]]
        starts[i] = len(context)
        context += needles[i]
        prev = at[i]
    context += hay[prev:]
    ids = head + context + tail
    return Prompt(tuple(ids), len(head), len(context), tuple(starts), tuple(map(len, needles)))
