"""`kvtuner serve <sglang flags>`: alias of the fallback SGLang launcher.

`kvtuner serve --engine vllm --profile p.json --model M [vllm serve flags]`: checks the vLLM
profile was made for M, then execs ``vllm serve M`` with the profile's flags (see docs/engines.md).

Same flags as ``python -m sglang.launch_server`` plus ``--kvtuner-profile PATH``; runs
``python -m kvtuner.runtime_loader.sglang.launch_server`` in this process (exec), so that the
server's spawned schedulers re-import the launcher and carry the kvtuner hooks.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

LAUNCHER = "kvtuner.runtime_loader.sglang.launch_server"
VLLM_CLI = "vllm.entrypoints.cli.main"  # what the `vllm` console script runs


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every argument goes to SGLang untouched (including --help): no option parsing here
    p = sub.add_parser(
        "serve",
        add_help=False,
        prefix_chars="\0",
        help="serve a model with SGLang and --kvtuner-profile (needs kvtuner[sglang]), or "
        "--engine vllm --profile P --model M: vllm serve with a vLLM profile's flags",
    )
    p.add_argument("sglang_args", nargs="*", help="python -m sglang.launch_server flags")
    p.set_defaults(func=run)


def _vllm(argv: list[str]) -> int:
    from ..errors import KVTunerError
    from ..runtime_loader.vllm.engine import serve_argv

    p = argparse.ArgumentParser(prog="kvtuner serve --engine vllm", add_help=False)
    p.add_argument("--profile", required=False)
    p.add_argument("--model", required=False)
    known, extra = p.parse_known_args(argv)
    if not known.profile or not known.model:
        raise KVTunerError("--engine vllm needs --profile PROFILE.json and --model MODEL")
    if importlib.util.find_spec("vllm") is None:
        raise KVTunerError("vllm is not installed here (pip install vllm; see docs/engines.md)")
    argv = serve_argv(known.profile, known.model, extra)
    cmd = [sys.executable, "-m", VLLM_CLI, *argv[1:]]  # "vllm serve ..." in this interpreter
    print(" ".join(argv), flush=True)
    os.execv(sys.executable, cmd)
    return 0  # not reached


def run(args: argparse.Namespace) -> int:
    argv = list(args.sglang_args)
    if argv[:2] == ["--engine", "vllm"]:
        return _vllm(argv[2:])
    if argv[:2] == ["--engine", "sglang"]:
        argv = argv[2:]
    from ..runtime_loader.sglang.hooks.version import check_sglang_version

    check_sglang_version()  # one line and exit 2 when sglang is missing or unsupported
    argv = [sys.executable, "-m", LAUNCHER, *argv]
    sys.stdout.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached
