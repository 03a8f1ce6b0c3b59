"""A multi-turn workload for HiCache on the real server: documents whose prefixes together exceed
the device pool, each asked about twice. The second turn finds its prefix evicted from the device
pool, so it is served from the host tier (L2) or storage (L3), or computed again.

Shared by ``tests/runtime_loader/sglang/test_hicache_server.py`` and ``benchmarks/hicache.py``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

WIKITEXT = Path(__file__).resolve().parents[3] / "../shared/data/wikitext-2/test.txt"
QUESTION = "\n\nQuestion: What is this text about? Answer in one sentence.\nAnswer:"


def documents(count: int, words: int) -> list[str]:
    """``count`` distinct WikiText-2 test passages of about ``words`` words each."""
    text = " ".join(WIKITEXT.resolve().read_text(encoding="utf-8").split())
    tokens = text.split(" ")
    return [" ".join(tokens[i * words : (i + 1) * words]) for i in range(count)]


@dataclass(frozen=True)
class Turn:
    """One request's result: greedy output ids, time to first token, prompt tokens, and how
    many of them came from each cache tier (SGLang's ``cached_tokens_details``)."""

    output_ids: tuple[int, ...]
    ttft_s: float
    prompt_tokens: int
    device_hit: int
    host_hit: int
    storage_hit: int


def generate(url: str, prompt: str, max_new_tokens: int) -> Turn:
    """Streamed greedy ``/generate``: TTFT is the arrival of the first chunk."""
    body = {
        "text": prompt,
        "stream": True,
        # ignore_eos: every answer is max_new_tokens long (the instruct model, asked without its
        # chat template, often stops at once), so equal outputs compare whole continuations
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    }
    request = urllib.request.Request(
        url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start, first, last = time.perf_counter(), None, None
    with urllib.request.urlopen(request, timeout=600) as reply:
        for line in reply:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            first = first or time.perf_counter()
            last = json.loads(line[5:])
    meta = last["meta_info"]
    tiers = meta.get("cached_tokens_details") or {}
    return Turn(
        output_ids=tuple(last["output_ids"]),
        ttft_s=first - start,
        prompt_tokens=meta["prompt_tokens"],
        device_hit=int(tiers.get("device", 0)),
        host_hit=int(tiers.get("host", 0)),
        storage_hit=int(tiers.get("storage", 0)),
    )


def two_turns(url: str, docs: list[str], max_new_tokens: int) -> tuple[list[Turn], list[Turn]]:
    """Every document once, then every document again, in the same order."""
    prompts = [doc + QUESTION for doc in docs]
    first = [generate(url, p, max_new_tokens) for p in prompts]
    second = [generate(url, p, max_new_tokens) for p in prompts]
    return first, second
