"""Triton kernel tests need TRITON_INTERPRET=1 set before triton is first imported. When another
test module imported triton earlier in this process, a kernel module's tests rerun themselves in a
fresh interpreter through :func:`pass_in_fresh_process`."""

from __future__ import annotations

import os
import subprocess
import sys


def pass_in_fresh_process(path: str) -> None:
    """Run the pytest module at ``path`` in a new interpreter (TRITON_INTERPRET=1); it passes."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", path, "-q", "-p", "no:cacheprovider"],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-4000:]
