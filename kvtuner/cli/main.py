"""`kvtuner` command line: a thin argparse layer over the Python API.

Each subcommand is a module of this package exposing ``add_parser(subparsers)``, which sets
``func`` (args -> exit code). User errors (:class:`KVTunerError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import KVTunerError

# Subcommand modules, in the order `kvtuner --help` lists them (the pipeline's order).
COMMANDS = (
    "show",
    "validate",
    "calibrate",
    "search",
    "import_kvtuner",
    "eval",
    "export_hf",
    "serve",
    "vllm_args",
    "recipe_args",
    "generate",
)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage + message
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = _OneLineParser(prog="kvtuner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvtuner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KVTunerError as exc:
        print(f"kvtuner {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvtuner {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
