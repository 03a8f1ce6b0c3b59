"""`kvtuner serve` in the core venv (no SGLang, no vLLM): without SGLang a serve is one line and
exit code 2; `--help` answers with kvtuner's usage for both engines and exit code 0."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from kvtuner.cli.main import main

SGLANG_FORM = "kvtuner serve [--engine sglang] --model-path MODEL --kvtuner-profile P.json"
VLLM_FORM = "kvtuner serve --engine vllm --profile P.json --model MODEL [vllm serve flags]"
NO_ENGINE = pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("sglang", "vllm")), reason="an engine is installed"
)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed")
def test_serve_without_sglang_is_one_line_exit_2(capsys):
    assert main(["serve", "--model-path", "some/model", "--kvtuner-profile", "p.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kvtuner serve: error: sglang is not installed: pip install 'kvtuner[sglang]'"


def _serve(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvtuner.cli.main", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@NO_ENGINE
def test_help_shows_both_engines_forms_without_either_installed():
    run = _serve("--help")
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert SGLANG_FORM in run.stdout and VLLM_FORM in run.stdout
    assert "sglang is not installed here" in run.stdout
    assert "vllm is not installed here" in run.stdout


@NO_ENGINE
def test_engine_help_answers_for_that_engine_only(capsys):
    assert main(["serve", "--engine", "vllm", "--model", "m", "-h"]) == 0
    out = capsys.readouterr().out
    assert VLLM_FORM in out and "--kvtuner-profile" in out  # the usage names both engines
    assert "vllm is not installed here" in out and "sglang is not installed" not in out
