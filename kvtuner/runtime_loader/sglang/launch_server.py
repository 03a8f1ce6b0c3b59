"""Fallback launcher: ``python -m kvtuner.runtime_loader.sglang.launch_server <sglang flags>``.

Same flags as ``python -m sglang.launch_server`` (plus ``--kvtuner-profile``), for environments
where SGLang plugins are disabled (e.g. ``SGLANG_PLUGINS`` lists others only, or kvtuner is not
installed as a distribution). It registers the kvtuner hooks itself. SGLang spawns its scheduler
processes, and a spawned child re-imports the parent's ``__main__`` module as ``__mp_main__``:
the module-level :func:`register` below therefore runs in every scheduler too, before its
``load_plugins()`` applies the registered hooks.
"""

from __future__ import annotations

import os
import sys

from ...errors import KVTunerError
from .hooks.version import check_sglang_version
from .plugin import register

__all__ = ["main"]

if __name__ in ("__main__", "__mp_main__"):
    register()  # idempotent; the entry-point plugin (if enabled) calls the same function


def main(argv: list[str] | None = None) -> int:
    """Run the SGLang HTTP server with the kvtuner hooks registered; returns the exit code."""
    try:
        check_sglang_version()
    except KVTunerError as exc:
        print(f"kvtuner: error: {exc}", file=sys.stderr)
        return 2
    register()
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()  # other plugins, then apply every registered hook (ours included)
    server_args = prepare_server_args(sys.argv[1:] if argv is None else list(argv))
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
