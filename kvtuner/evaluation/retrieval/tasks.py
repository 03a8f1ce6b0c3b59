"""Retrieval tasks (RULER / passkey style): what is hidden, what is asked, what must come back.

Each task draws, from a seeded ``random.Random``, the needles to hide (text, placed at depths)
and the answers a correct greedy reply must contain (all of them). ``answer_counts`` says how
often each answer occurs in the finished prompt, by construction (tests check it).

- ``passkey``: "The pass key is K. Remember it. K is the pass key." (K: 5-7 digits, twice);
- ``niah``: "One of the special magic numbers for {key} is: {value}." (RULER's needle), one
  needle; ``niah-multikey``: plus 3 distractor needles with other keys; ``niah-multivalue``: 4
  needles with the same key, all 4 values asked;
- ``vt``: variable tracking, ``VAR A = 12345`` then ``VAR B = VAR A`` ... in 4 hops; every name
  that holds the value is asked.
The asked needle (the first statement for ``vt``) sits at the asked depth; distractors and the
other values at depths drawn per sample; ``vt``'s later hops spread evenly after the first.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from ...errors import KVTunerError

TASKS = ("passkey", "niah", "niah-multikey", "niah-multivalue", "vt")
VT_HOPS = 4
MULTIKEY_DISTRACTORS = 3
MULTIVALUE_VALUES = 4
_WORDS = (
    "amber", "brisk", "cobalt", "dusty", "eager", "fuzzy", "gentle", "hollow", "ivory", "jolly",
    "keen", "lunar", "misty", "noble", "olive", "proud", "quiet", "rapid", "silver", "tidy",
)  # fmt: skip
_NOUNS = (
    "anchor", "badger", "candle", "dragon", "engine", "falcon", "garden", "harbor", "island",
    "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "river",
)  # fmt: skip

__all__ = ["TASKS", "TaskDraw", "draw_task"]


@dataclass(frozen=True)
class TaskDraw:
    """One sample's task content. ``needles``: (text, depth in [0, 1]) in any order; the first is
    the asked one. ``answers``: all must be in the reply; ``answer_counts``: how often each
    occurs in the prompt. ``instruction`` leads the context, ``question`` + ``answer_prefix``
    follow it."""

    instruction: str
    needles: tuple[tuple[str, float], ...]
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    answer_counts: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self) -> None:
        if len(self.answers) != len(self.answer_counts) or not self.answers:
            raise KVTunerError("a task needs answers, each with its count in the prompt")
        if any(not 0.0 <= d <= 1.0 for _, d in self.needles):
            raise KVTunerError("needle depths must be in [0, 1]")


def _number(rng: random.Random) -> str:
    digits = rng.randint(5, 7)
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def _distinct(rng: random.Random, draw, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        x = draw(rng)
        if x not in out and not any(x in o or o in x for o in out):  # no value inside another
            out.append(x)
    return out


def _key(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}-{rng.choice(_NOUNS)}"


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def _passkey(rng: random.Random, depth: float) -> TaskDraw:
    k = _number(rng)
    return TaskDraw(
        "There is an important info hidden inside a lot of irrelevant text. Find it and "
        "memorize it. I will quiz you about the important information there.",
        ((f"The pass key is {k}. Remember it. {k} is the pass key.", depth),),
        "What is the pass key?",
        "The pass key is",
        (k,),
        (2,),
        12,
    )


_NIAH_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize "
    "it. I will quiz you about the numbers afterwards."
)


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _niah(rng: random.Random, depth: float, variant: str) -> TaskDraw:
    keys = _distinct(rng, _key, 1 + (MULTIKEY_DISTRACTORS if variant == "multikey" else 0))
    n_values = MULTIVALUE_VALUES if variant == "multivalue" else len(keys)
    values = _distinct(rng, _number, n_values)
    if variant == "multivalue":
        needles = [(_needle(keys[0], v), depth if i == 0 else rng.random()) for i, v in
                   enumerate(values)]  # fmt: skip
        asked, q, p = tuple(values), "What are all the special magic numbers", "numbers"
    else:
        needles = [(_needle(k, v), depth if i == 0 else rng.random()) for i, (k, v) in
                   enumerate(zip(keys, values, strict=True))]  # fmt: skip
        asked, q, p = (values[0],), "What is the special magic number", "number"
    verb = "are" if variant == "multivalue" else "is"
    return TaskDraw(
        _NIAH_INTRO,
        tuple(needles),
        f"{q} for {keys[0]} mentioned in the provided text?",
        f"The special magic {p} for {keys[0]} mentioned in the provided text {verb}",
        asked,
        (1,) * len(asked),
        12 * len(asked),
    )


def _vt(rng: random.Random, depth: float) -> TaskDraw:
    value = str(rng.randint(10000, 99999))
    names = _distinct(rng, _name, VT_HOPS + 1)
    lines = [f"VAR {names[0]} = {value}."]
    lines += [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:], strict=False)]
    step = (1.0 - depth) / (VT_HOPS + 1)
    return TaskDraw(
        "Memorize and track the chain(s) of variable assignment hidden in the following text.",
        tuple((line, depth + i * step) for i, line in enumerate(lines)),
        f"Question: Find all variables that are assigned the value {value} in the text above.",
        "Answer: According to the chain(s) of variable assignment in the text above, "
        f"{VT_HOPS + 1} variables are assigned the value {value}, they are:",
        tuple(names),
        (2,) * VT_HOPS + (1,),
        8 * (VT_HOPS + 1),
    )


def draw_task(task: str, rng: random.Random, depth: float) -> TaskDraw:
    """The content of one ``task`` sample with its asked needle at ``depth``."""
    if task == "passkey":
        return _passkey(rng, depth)
    if task.startswith("niah"):
        variant = {"niah": "single", "niah-multikey": "multikey", "niah-multivalue": "multivalue"}
        if task in variant:
            return _niah(rng, depth, variant[task])
    if task == "vt":
        return _vt(rng, depth)
    raise KVTunerError(f"unknown retrieval task {task!r} (use {', '.join(TASKS)})")
