"""`--no-progress` and `--quiet`, shared by every command that shows progress.

Streams: results (tables, `wrote ...`) go to stdout; progress bars, informational messages and
warnings go to stderr. `--no-progress` removes the bars; `--quiet` also the informational
messages, so stderr holds only warnings and errors.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass


def add_verbosity_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (model loading and GGUF conversion included)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="--no-progress, and no informational messages: stderr keeps warnings and errors, "
        "stdout the results",
    )


@dataclass(frozen=True)
class Verbosity:
    progress: bool = True
    info_messages: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Verbosity:
        return cls(progress=not (args.no_progress or args.quiet), info_messages=not args.quiet)

    def apply(self) -> None:
        """Silence the third-party bars too (before any model or dataset loads)."""
        if not self.progress:
            silence_library_progress_bars()

    def info(self, message: str) -> None:
        if self.info_messages:
            print(message, file=sys.stderr, flush=True)


def silence_library_progress_bars() -> None:
    """transformers' weight-loading and datasets' bars have switches. transformers' GGUF
    conversion bar is a plain ``tqdm.auto.tqdm`` deaf to its switch (and tqdm reads TQDM_DISABLE
    only when first imported, long before flags are parsed), so that loader's ``tqdm`` becomes
    transformers' own switchable one."""
    import datasets
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_loader

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    if hasattr(gguf_loader, "tqdm"):
        gguf_loader.tqdm = transformers.utils.logging.tqdm
