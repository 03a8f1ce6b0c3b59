"""Exact-match scoring of a greedy reply: every answer must occur as a whole token of it.

Numbers are whole digit runs (``1234567`` does not match inside ``12345678`` nor match
``123456``); names are whole words, case-sensitive (``ABCDE`` does not match ``ABCDEF`` or
``abcde``). Surrounding text is ignored: "The pass key is 123456." matches ``123456``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["is_correct", "reply_tokens"]

_TOKEN = re.compile(r"\d+|[A-Za-z]+")


def reply_tokens(reply: str) -> set[str]:
    """The whole digit runs and whole words of ``reply`` (digits split off letters)."""
    return set(_TOKEN.findall(reply))


def is_correct(reply: str, answers: Sequence[str]) -> bool:
    """All of ``answers`` occur in ``reply`` as whole digit runs / words."""
    found = reply_tokens(reply)
    return bool(answers) and all(a in found for a in answers)
