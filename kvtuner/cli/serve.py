"""`kvtuner serve <sglang flags>`: alias of the fallback SGLang launcher.

Same flags as ``python -m sglang.launch_server`` plus ``--kvtuner-profile PATH``; runs
``python -m kvtuner.runtime_loader.sglang.launch_server`` in this process (exec), so that the
server's spawned schedulers re-import the launcher and carry the kvtuner hooks.
"""

from __future__ import annotations

import argparse
import os
import sys

LAUNCHER = "kvtuner.runtime_loader.sglang.launch_server"


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every argument goes to SGLang untouched (including --help): no option parsing here
    p = sub.add_parser(
        "serve",
        add_help=False,
        prefix_chars="\0",
        help="serve a model with SGLang and --kvtuner-profile (needs kvtuner[sglang])",
    )
    p.add_argument("sglang_args", nargs="*", help="python -m sglang.launch_server flags")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..runtime_loader.sglang.hooks.version import check_sglang_version

    check_sglang_version()  # one line and exit 2 when sglang is missing or unsupported
    argv = [sys.executable, "-m", LAUNCHER, *args.sglang_args]
    sys.stdout.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached
