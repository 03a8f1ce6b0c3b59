"""Which SGLang version the plugin runs on: the one it was run against, nothing wider.

Another version stops with one line, unless ``KVTUNER_SGLANG_UNTESTED=1``: then a warning, and
the start-up hook check (:mod:`.hook_check`) still proves every hook took before serving.
"""

from __future__ import annotations

import logging
import os
import re

from ....errors import KVTunerError

# The pool, the sizing hooks and every hooked call site were run against sglang 0.5.23 only
# (post releases of it share its code); the KV-pool internals kvtuner subclasses move often.
SUPPORTED_SGLANG = "==0.5.23"
_RELEASE = (0, 5, 23)
UNTESTED_ENV_VAR = "KVTUNER_SGLANG_UNTESTED"

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_SGLANG",
    "UNTESTED_ENV_VAR",
    "check_sglang_version",
    "installed_sglang_version",
]


def _is_supported(version: str) -> bool:
    """ "0.5.23" and "0.5.23.postN" only: no other release, no pre-release or dev build."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?(?:\+[\w.]+)?", version.strip())
    return bool(match) and tuple(int(x) for x in match.groups()) == _RELEASE


def installed_sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str:
    """Return the (installed, by default) SGLang version; raise one line if it is missing, or
    another version than the one run (a warning instead with ``KVTUNER_SGLANG_UNTESTED=1``)."""
    version = installed_sglang_version() if version is None else version
    if version is None:
        raise KVTunerError("sglang is not installed: pip install 'kvtuner[sglang]'")
    if _is_supported(version):
        return version
    message = (
        f"sglang {version} is not supported by the kvtuner SGLang runtime "
        f"(supported: sglang{SUPPORTED_SGLANG})"
    )
    if os.environ.get(UNTESTED_ENV_VAR, "").strip() != "1":
        raise KVTunerError(f"{message}; {UNTESTED_ENV_VAR}=1 tries it anyway")
    logger.warning(
        "kvtuner: %s; going on (%s=1), the hook check decides", message, UNTESTED_ENV_VAR
    )
    return version
