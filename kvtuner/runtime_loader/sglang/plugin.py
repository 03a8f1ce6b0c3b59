"""The SGLang plugin's entry point (group ``sglang.srt.plugins``, ``kvtuner =
kvtuner.runtime_loader.sglang.plugin:register``): SGLang's ``load_plugins()`` calls
:func:`register` in the launcher and in every scheduler process, then applies the hooks.

What is hooked and why: :mod:`.hooks.table`. The proof that every hook took: :mod:`.hooks.check`.
"""

from __future__ import annotations

import logging

from ...errors import KVTunerError
from .hooks.backend_choice import register_backend
from .hooks.check import register_hooks
from .hooks.server_flag import die, flag_requested
from .hooks.table import HOOKS
from .hooks.version import check_sglang_version

logger = logging.getLogger(__name__)

__all__ = ["register"]

_registered = False


def register() -> None:
    """Entry point of the plugin (idempotent: the fallback launcher calls it too)."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        check_sglang_version()
    except KVTunerError as exc:
        if flag_requested():
            die(exc)
        logger.warning("kvtuner: %s; the kvtuner plugin stays inactive", exc)
        return
    register_hooks(HOOKS)
    register_backend()
