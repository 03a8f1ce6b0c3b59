"""Is the model/dataset hub reachable? Probed once per process with a short timeout, so an
offline machine fails in one line instead of retrying for half a minute."""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse

PROBE_TIMEOUT_S = 5.0

__all__ = ["hub_unreachable_reason"]


@functools.cache
def _probe(host: str) -> str | None:
    try:
        socket.create_connection((host, 443), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return f"{host} is unreachable ({exc})"
    return None


def hub_unreachable_reason() -> str | None:
    """None when the hub answers; otherwise why not (offline env var, DNS, timeout)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    from huggingface_hub import constants

    return _probe(urllib.parse.urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT)
