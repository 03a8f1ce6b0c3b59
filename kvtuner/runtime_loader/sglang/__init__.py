"""SGLang runtime: a per-layer quantized KV pool served with ``--kvtuner-profile PATH``.

Installed as an SGLang plugin (entry point group ``sglang.srt.plugins`` -> :func:`register`);
``python -m kvtuner.runtime_loader.sglang.launch_server`` is the fallback launcher for
environments where plugins are disabled. Supported SGLang versions: ``SUPPORTED_SGLANG``.
Importing this package does not import sglang; :class:`KVTunerMHATokenToKVPool` does.

Layout (imports point one way: ``plugin -> hooks -> {cuda, swa, hicache} -> pool -> quant``):

- ``hooks/``: everything that touches SGLang's private API (the hook table, the start-up proof
  that every hook took, the version guard, capacity hooks, server-level refusals): an SGLang
  upgrade is checked in this one folder;
- ``pool/``: the packed KV pool (``store.py``: the methods SGLang calls, delegating to parts
  that own their state, built in ``parts.py``: buffers and channel pages, key smoothing, slot
  RoPE, reads, writes; cell size, refusals); ``lazy_reads/`` and ``cpu_writes/`` its CPU paths;
- ``cuda/``: the kvtuner attention backend; ``swa/``: the sliding-window sub-pools;
  ``hicache/``: the HiCache host pool.
"""

from __future__ import annotations

from typing import Any

from .hooks.version import SUPPORTED_SGLANG, check_sglang_version

__all__ = ["SUPPORTED_SGLANG", "KVTunerMHATokenToKVPool", "check_sglang_version", "register"]


def register() -> None:
    """The plugin entry point (see :mod:`.plugin`)."""
    from .plugin import register as _register

    _register()


def __getattr__(name: str) -> Any:
    if name == "KVTunerMHATokenToKVPool":
        from .pool.store import KVTunerMHATokenToKVPool

        return KVTunerMHATokenToKVPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
