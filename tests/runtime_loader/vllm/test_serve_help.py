"""`kvtuner serve --engine vllm --help` in the vLLM venv: kvtuner's usage, then `vllm serve`'s
own flags from vLLM's parser (a group of them with vLLM's `--help=GROUP`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def test_help_lists_kvtuner_usage_then_vllm_serve_flags():
    cmd = [sys.executable, "-m", "kvtuner.cli.main", "serve", "--engine", "vllm"]
    run = subprocess.run([*cmd, "--help=CacheConfig"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    usage, _, engine = run.stdout.partition("vLLM's own flags:")
    assert "kvtuner serve --engine vllm --profile P.json --model MODEL" in usage
    assert "--kv-cache-dtype-skip-layers" in engine and "--block-size" in engine
    assert "sglang" not in engine.lower()  # --engine vllm: vLLM's flags only
