"""`kvtuner serve` without SGLang installed: one line, exit code 2 (the core venv)."""

from __future__ import annotations

import importlib.util

import pytest

from kvtuner.cli.main import main


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed")
def test_serve_without_sglang_is_one_line_exit_2(capsys):
    assert main(["serve", "--model-path", "some/model", "--kvtuner-profile", "p.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kvtuner serve: error: sglang is not installed: pip install 'kvtuner[sglang]'"
