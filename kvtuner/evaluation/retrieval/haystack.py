"""Haystacks: the filler text a needle hides in, as an endless seeded stream of sentences.

- ``noise``: RULER's / the passkey test's repeated noise sentences (no digits, no capitals that
  could pass for a variable name);
- ``wikitext``: real text, WikiText-2 test paragraphs (the embedded split), cut into sentences,
  read in order from a paragraph chosen per sample.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache

from ...errors import KVTunerError

HAYSTACKS = ("noise", "wikitext")
NOISE_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

__all__ = ["HAYSTACKS", "NOISE_SENTENCES", "sentences"]


@lru_cache(maxsize=1)
def _wikitext_sentences() -> tuple[str, ...]:
    """Sentences of the WikiText-2 test paragraphs (headings `` = Title = `` left out)."""
    from ..data import embedded_test_text

    out: list[str] = []
    for line in embedded_test_text().splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        out += [s.strip() + " ." for s in line.split(" . ") if s.strip(" .")]
    return tuple(out)


def sentences(kind: str, rng: random.Random) -> Iterator[str]:
    """Endless sentences of haystack ``kind``; ``wikitext`` starts at a place drawn from rng."""
    if kind == "noise":
        pool, start = NOISE_SENTENCES, 0
    elif kind == "wikitext":
        pool = _wikitext_sentences()
        start = rng.randrange(len(pool))
    else:
        raise KVTunerError(f"unknown haystack {kind!r} (use {', '.join(HAYSTACKS)})")
    i = start
    while True:
        yield pool[i % len(pool)]
        i += 1
