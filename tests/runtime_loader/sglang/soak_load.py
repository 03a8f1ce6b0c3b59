"""Sustained mixed load on a running SGLang server, and what it did to the server.

Shared by ``benchmarks/sglang_soak.py`` and the short soak test. ``streams`` client threads send
OpenAI ``/v1/completions`` requests back to back until the deadline: prompt lengths 4..400 words,
``max_tokens`` 1..128, streamed or not, greedy or sampled (temperature 0.8), and a tenth of the
streamed ones cancelled (connection closed) after a few chunks. Meanwhile the server's RSS (its
whole process group, from /proc) is sampled. The pool's used tokens (``/metrics``,
``sglang:num_used_tokens``; the radix cache is off so an idle server holds none) are read once
the load is gone.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

TEXT = (
    "the river ran past the old mill where the miller kept his accounts in a ledger bound in "
    "green cloth and every spring the water rose to the second step of the stair"
)
WORDS = TEXT.split(" ")
CANCEL_SHARE = 0.1
PAGE = 4096  # /proc statm counts pages


@dataclass
class LoadResult:
    served: int = 0
    failed: int = 0
    cancelled: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # (seconds, MB)

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def group_rss_mb(pgid: int) -> float:
    """Resident MB of every live process in group ``pgid``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            total += int((stat.parent / "statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total / 2**20


def _request(rng: random.Random, max_tokens: int) -> dict:
    body = {
        "model": "default",
        "prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 400))),
        "max_tokens": rng.randint(1, max_tokens),
        "temperature": rng.choice((0.0, 0.8)),
        "stream": rng.random() < 0.5,
    }
    if body["temperature"]:
        body["top_p"] = 0.95
    return body


def _one(url: str, body: dict, cancel_after: int | None) -> bool:
    """Send one request; True when served, False when cancelled on purpose; raise on failure."""
    with requests.post(url, json=body, stream=body["stream"], timeout=600) as reply:
        reply.raise_for_status()
        if not body["stream"]:
            assert reply.json()["choices"][0]["finish_reason"] in ("length", "stop")
            return True
        chunks = 0
        for line in reply.iter_lines():
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            json.loads(line[5:])
            chunks += 1
            if cancel_after is not None and chunks >= cancel_after:
                return False  # leaving the with-block closes the connection mid-stream
        return True


def _client(url: str, seed: int, deadline: float, max_tokens: int, result: LoadResult, lock):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        body = _request(rng, max_tokens)
        cancel = rng.randint(1, 5) if body["stream"] and rng.random() < CANCEL_SHARE else None
        start = time.monotonic()
        try:
            served = _one(url, body, cancel)
        except Exception as exc:  # a failed request is the measurement, not a crash
            with lock:
                result.failed += 1
                result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            continue
        with lock:
            if served:
                result.served += 1
                result.latencies.append(time.monotonic() - start)
            else:
                result.cancelled += 1


def run_load(
    base_url: str,
    pgid: int,
    *,
    streams: int,
    seconds: float,
    max_tokens: int = 128,
    rss_every: float = 5.0,
    seed: int = 0,
) -> LoadResult:
    """``streams`` clients for ``seconds`` (requests in flight at the deadline finish), each
    request asking 1..``max_tokens`` tokens."""
    result, lock = LoadResult(), threading.Lock()
    start = time.monotonic()
    deadline = start + seconds
    url = base_url + "/v1/completions"
    threads = [
        threading.Thread(
            target=_client, args=(url, seed + i, deadline, max_tokens, result, lock), daemon=True
        )
        for i in range(streams)
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        result.rss_mb.append((round(time.monotonic() - start, 1), round(group_rss_mb(pgid), 1)))
        time.sleep(rss_every)
    result.rss_mb.append((round(time.monotonic() - start, 1), round(group_rss_mb(pgid), 1)))
    return result


def used_tokens(base_url: str) -> float:
    """``sglang:num_used_tokens`` from ``/metrics`` (needs ``--enable-metrics``)."""
    text = requests.get(base_url + "/metrics", timeout=30).text
    values = re.findall(r"^sglang:num_used_tokens\{[^}]*\} ([0-9.eE+-]+)$", text, re.M)
    if not values:
        raise RuntimeError("no sglang:num_used_tokens in /metrics")
    return sum(float(v) for v in values)


def idle_used_tokens(base_url: str, settle: float = 60.0) -> float:
    """Used tokens once idle: polled until 0 or ``settle`` seconds (metrics lag a step)."""
    deadline, used = time.monotonic() + settle, used_tokens(base_url)
    while used and time.monotonic() < deadline:
        time.sleep(2)
        used = used_tokens(base_url)
    return used


def rss_drift(samples: list[tuple[float, float]], warmup: float) -> float | None:
    """Largest relative distance of an RSS sample after ``warmup`` s from their mean."""
    after = [mb for t, mb in samples if t >= warmup]
    if len(after) < 2:
        return None
    mean = sum(after) / len(after)
    return max(abs(mb - mean) for mb in after) / mean
