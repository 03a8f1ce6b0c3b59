"""Which SGLang versions the plugin supports; anything else fails with one clear line."""

from __future__ import annotations

import re

from ...errors import KVTunerError

# The pool, the sizing hook and the hooked call sites were verified against sglang 0.5.23; the
# plugin system exists from 0.5.11, but the KV-pool internals we subclass moved until 0.5.23.
SUPPORTED_SGLANG = ">=0.5.23,<0.6"
_MIN = (0, 5, 23)
_BELOW = (0, 6)

__all__ = ["SUPPORTED_SGLANG", "check_sglang_version", "installed_sglang_version"]


def _release(version: str) -> tuple[int, ...]:
    """Leading numeric release parts: "0.5.23.post1" -> (0, 5, 23); "" when unparsable."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(x) for x in match.groups(default="0")) if match else ()


def installed_sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str:
    """Return the (installed, by default) SGLang version; raise if it is missing or unsupported."""
    version = installed_sglang_version() if version is None else version
    if version is None:
        raise KVTunerError("sglang is not installed: pip install 'kvtuner[sglang]'")
    release = _release(version)
    if not release or not _MIN <= release < _BELOW:
        raise KVTunerError(
            f"sglang {version} is not supported by the kvtuner SGLang runtime "
            f"(supported: sglang{SUPPORTED_SGLANG})"
        )
    return version
