#!/usr/bin/env bash
# The GPU measurements in three stages, each one device call (under its 10-minute limit).
#
# On a development machine, once (the GPU machine has no optuna, gguf, or network):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl optuna alembic colorlog mako sqlalchemy greenlet \
#     gguf datasets dill multiprocess
#   cp ../shared/tools/sm90_report.py .whl/   # kernel_resources.py's tool, for the cross-check
# On the GPU machine, from the repo root, with .whl carried:
#   bash scripts/gpu_session.sh first     # the first call: pytest -m cuda, the sm_90 build's
#                                         # resources, decode kernel vs general vs bf16 SDPA at
#                                         # 16/64 x 8k/32k, pack/unpack, the SGLang step
#   bash scripts/gpu_session.sh check     # a 15-minute lease in one call: pack/unpack at each
#                                         # plan, the decode plans at 16/64 x 8k/32k, an A/B
#                                         # against .ab/, pool layouts, HF static at 1 x 16k, pytest
# An A/B (the check stage, where .ab/ is carried: carry [".whl", ".ab"]), on the development
# machine first, REV the commit to compare this checkout against:
#   echo /.ab/ >> .git/info/exclude; rm -rf .ab; mkdir .ab
#   git archive REV kvtuner benchmarks | tar -x -C .ab; echo REV > .ab/REV
# A REV before 4ecf802 needs its chained comparison, which Triton 3.6 (the GPU's) rejects, fixed:
#   sed -i 's/NG == RG == 2/NG == 2 and RG == 2/' .ab/kvtuner/attention/packed_rows.py
#   bash scripts/gpu_session.sh tune      # tiles of the rows the plans have not timed yet
#   bash scripts/gpu_session.sh profile   # the GPU-only tests again, the decode tile sweep of
#                                         # KV8 g64 / KV4 g32 / K8V4, ncu on the decode kernel
#   bash scripts/gpu_session.sh plans     # the decode plans against bf16, pre-RoPE decode tiles,
#                                         # extend rows and tiles, the step's host time
#   bash scripts/gpu_session.sh kernels   # pytest -m cuda, pack/unpack, fused decode, SGLang step
#   bash scripts/gpu_session.sh attention # fused decode: baseline vs scale-after-dot, bf16 + fp16
#   bash scripts/gpu_session.sh hf        # HF generate with the packed cache vs Dynamic/Static
#   bash scripts/gpu_session.sh search    # kvtuner search --budget 4bit, Llama-3.1-8B's shape
# Results (JSON) and one log per stage go to $OUT (the device tool brings them back); every step
# has its own time limit, so a slow step leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."

stage=${1:-}
case "$stage" in
  first | check | tune | profile | plans | kernels | attention | hf | search) ;;
  *) echo "usage: scripts/gpu_session.sh {first|check|tune|profile|plans|kernels|attention|hf|search}" >&2 && exit 2 ;;
esac
out=${OUT:-/tmp/kvtuner-gpu}
mkdir -p "$out"
log="$out/$stage.log"

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

step() {  # step SECONDS COMMAND...: run it under a time limit, log it, never stop the stage
  local limit=$1
  shift
  echo "== $(date -u +%T) $*" | tee -a "$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "== exit $?" | tee -a "$log"
}

cuda_tests=$(grep -rl "mark\.cuda" tests)  # only these: other test files need sglang/vllm

case "$stage" in
  first)  # issue 43's first stage, under 10 minutes, the speed targets first (a device lease
    # can end early): the decode kernel against the general one and bf16 SDPA, pack and unpack,
    # the SGLang backend step; then correctness, then the CPU proxy cross-checked on the GPU's
    # own build (HF generate waits for `hf`)
    nvidia-smi -L >>"$log" 2>&1
    # (limits: twice what each step took on the H200 of 2026-11-26, whose stage took 303 s)
    step 100 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 \
      --context 8192 32768 --specs "KV4 g32" "KV8 g64" "K8V4 (mixed)" "KV4 g128" \
      --variants decode-kernel,baseline --output "$out/attention_decode.json"
    step 50 python3 benchmarks/quant_throughput.py --device cuda --rounds 3 \
      --output "$out/quant_throughput_kernels.json"
    step 140 python3 benchmarks/sglang_backend_step.py --device cuda \
      --output "$out/sglang_backend_step.json"
    step 170 python3 -m pytest -m cuda -q -n 8 -p no:cacheprovider $cuda_tests
    tool=$(ls .whl/sm90_report.py ../shared/tools/sm90_report.py 2>/dev/null | head -1)
    if [ -n "$tool" ]; then
      step 90 python3 benchmarks/kernel_resources.py --tool "$tool" \
        --output "$out/kernel_resources_gpu_machine.json"
    else
      echo "== kernel_resources: no sm90_report.py beside the checkout, skipped" | tee -a "$log"
    fi
    ;;
  check)  # one call of a 15-minute lease (the start takes 1-2 of them): pack and unpack at
    # each launch plan (the timed ones, row blocks in a pipelined loop, Hadamard pack's new
    # plan), the decode plans against bf16 SDPA, the same decode from the tree in .ab/
    # (another commit, where carried) interleaved with this one, rows padded and as planes,
    # pack and unpack as planes, HF generate at batch 1 x 16k with the static packed cache,
    # Nsight Compute on KV4 g32's one-warp decode, then the GPU-only tests (step limits:
    # 594 s; pytest -m cuda took 147-175 s on the H200 with 219 tests, 228 now)
    nvidia-smi -L >>"$log" 2>&1
    step 85 python3 benchmarks/quant_throughput.py --device cuda --plans \
      --output "$out/quant_throughput_plans.json"
    # (pre-RoPE keys take a row's scales and zeros in one copy since 7146468: Triton 3.6 KV4
    # g32 pre-RoPE 1740 -> 1206 loop instructions; the third lease ran it at 0.41-0.43x)
    step 65 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 \
      --context 8192 32768 --specs "KV4 g32" "KV8 g64" "K8V4 (mixed)" "KV4 g128" "KV3 g32" \
      "KV4 g32 sym" "KV4 g32 pre-RoPE" "KV8 g64 pre-RoPE" --variants decode-kernel \
      --output "$out/attention_decode_plans.json"
    step 12 python3 benchmarks/attention_decode.py --device cuda --batch 16 --context 8192 \
      --specs "KV4 g32" "KV8 g64" --variants decode-kernel --graphs \
      --output "$out/attention_decode_graphs.json"  # 16 x 8k without the host's eager work
    # the register cap fitted at a build's first launch (since 2026-11-28: the lowest of
    # 128, 144, 152, 168, 184 and 200 where the build spills nothing and holds more programs
    # an SM; sm_90a, Triton 3.6: KV4 g32 and its symmetric rows 128, 16 programs against
    # 12-14; KV4 g64 and K8V4 144) against none (255, ptxas' own limit); KV8 g64 in rows fits
    # none (128-152 spill, 168 holds no more): the control; KV8 g64 in planes (SGLang's
    # layout for it) fits 152, 13 programs against 12 (3.9: against 9)
    # one warp on 64-key tiles against the plan's 32: the per-tile work (the softmax's
    # reductions, the rescale, the table's offsets) spread over twice the keys; sm_90a, Triton
    # 3.6, loop instructions a key: KV4 g32 24.6 -> 22.7 at 168 registers, KV8 g64 25.2 -> 23.5
    # at 197 (the second lease timed older builds: 64 won at 16 x 8k, 32 at 32 x 8k)
    step 25 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 \
      --context 8192 32768 --specs "KV4 g32" "KV8 g64" --variants decode-kernel \
      --block-tokens 32 64 --num-warps 1 --num-stages 2 \
      --output "$out/attention_decode_bt64.json"
    step 18 python3 benchmarks/attention_decode.py --device cuda --batch 64 --context 32768 \
      --specs "KV4 g32" "KV4 g32 sym" "KV4 g64" "K8V4 (mixed)" "KV8 g64" \
      --variants decode-kernel --max-registers none 255 \
      --output "$out/attention_decode_fitted_cap.json"
    step 10 python3 benchmarks/attention_decode.py --device cuda --batch 64 --context 32768 \
      --specs "KV8 g64" --variants decode-kernel --layouts planes --max-registers none 255 \
      --output "$out/attention_decode_fitted_cap_planes.json"
    if [ -d .ab/kvtuner ]; then  # A/B at one shape, the two trees in turn, one round (two
      # rounds agreed within 0.5 % in the third lease); .ab/REV names the other commit
      # (2026-11-27: b4edb09, q's rows padded to 16 as the MMA's, against keys dotted first
      # with the heads its 8 columns: KV4 g32 182 -> 167 registers, KV4 g128 211 -> 134, KV3
      # g32 241 -> 141, 12-15 programs an SM, 7-20 % fewer instructions a tile there, sm_90a;
      # then 4-bit value codes at the top of fp16's mantissa: KV4 g32 1025 -> 967; then
      # format v3's 3/5/6-bit planes: KV3 g32 60.5 -> 41.7 instructions a key, 16-byte copies;
      # then one scale a token-head's keys in the MMA's lane order, codes at the top of the
      # mantissa: KV4 g128 975 -> 854 loop instructions, padded 848 -> 746 (the layouts step);
      # 2026-11-28, against e1f448a: a row's two groups of 64 dotted apart, 8-bit codes read
      # as 1024 + c: KV8 g64 1138 -> 850, Triton 3.6 1264 -> 1058; since c384bca, unpack a
      # chunk of 8 codes a thread, nothing through shared memory: the unpack A/B is the
      # .ab tree's pack and unpack against this tree's, the layouts step below; since b9b4890,
      # element-wise codes masked and offset in two PTX instructions a word: Triton 3.6 KV4
      # g32 945 -> 886 loop instructions, KV3 g32 1359 -> 1300; since 2026-11-28 (session 26)
      # pack and unpack launch heads first, a token block's heads side by side, so the sectors
      # two heads' rows share are filled in L2: the quant_throughput A/B is that, at random
      # slots; and a decode write's K and V are one launch: quant_throughput's K+V column)
      cat .ab/REV >>"$log" 2>/dev/null
      for tree in .ab .; do
        name=$([ "$tree" = . ] && echo this || echo ab)
        step 25 env PYTHONPATH="/tmp/site:$PWD/$tree" python3 "$tree/benchmarks/attention_decode.py" \
          --device cuda --batch 64 --context 32768 --specs "KV4 g32" "KV8 g64" "KV4 g128" \
          "KV3 g32" --variants decode-kernel --output "$out/ab_${name}.json"
      done
      step 12 env PYTHONPATH="/tmp/site:$PWD/.ab" python3 .ab/benchmarks/quant_throughput.py \
        --device cuda --rounds 2 --shape 262144 8 128 --output "$out/ab_quant_throughput.json"
    fi
    # copy width or bytes? rows that are no multiple of 16 bytes (KV4 g128 68, KV8 g64 136,
    # KV4 g32 sym 72) as rows, padded to 16 and as planes (16-byte code copies in the sm_90a
    # build for both, planes at the rows' bytes)
    step 25 python3 benchmarks/attention_decode.py --device cuda --batch 64 --context 32768 \
      --specs "KV4 g128" "KV8 g64" "KV4 g32 sym" --variants decode-kernel \
      --layouts rows padded planes --output "$out/attention_decode_layouts.json"
    # pack and unpack at the launchers' plans, KV4 g128 and KV8 g64 also as planes
    step 22 python3 benchmarks/quant_throughput.py --device cuda --shape 262144 8 128 \
      --output "$out/quant_throughput_layouts.json"
    # HF generate at batch 1 x 16k: the static packed cache (decode compiled into CUDA graphs,
    # as StaticCache's) against StaticCache, DynamicCache and the eager packed cache (rows print
    # as they land: the two compiled caches first)
    step 65 python3 benchmarks/hf_decode.py --device cuda --batch 1 --context 16384 \
      --new-tokens 64 --caches "KV4 g32 static" static dynamic "KV4 g32" \
      --output "$out/hf_decode_static.json"
    # where the one-warp decode tile waits, instruction by instruction: its time has followed
    # its instructions a key at 0.34 issues a cycle a scheduler (docs/results/gpu.md), and
    # only the 4-warp tile's stall reasons were ever read; the source page pairs each SASS
    # line of the loop with its stall samples (the CPU's build of the same kernel names them)
    step 35 ncu --target-processes all -k regex:_decode_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis \
      --import-source no -f -o "$out/ncu_decode_KV4g32" \
      python3 benchmarks/attention_decode.py --device cuda --batch 16 --context 8192 \
      --specs "KV4 g32" --variants decode-kernel --output /tmp/ncu_unused.json
    step 10 ncu --import "$out/ncu_decode_KV4g32.ncu-rep" --print-details all \
      --log-file "$out/ncu_decode_KV4g32.txt"
    step 10 sh -c "ncu --import '$out/ncu_decode_KV4g32.ncu-rep' --page source --csv \
      --print-source sass > '$out/ncu_decode_KV4g32_sass.csv'"
    step 175 python3 -m pytest -m cuda -q -n 16 -p no:cacheprovider -rf $cuda_tests
    ;;
  tune)  # what the plans still take from the sm_90a build alone, timed: decode tiles of
    # 3-bit, symmetric and 5-bit/3-bit rows (since 2c966f7 a chunk at a time, 32 tokens on 4
    # warps; on 1-2 warps the build issues fewer instructions a key: symmetric 72 -> 52 at
    # 16 x 1, KV3 89 -> 65 at 32 x 1, at 8-12 warps an SM), extend rows and tiles of K8V4
    # (mixed widths) and symmetric rows; and decode splits around the waves of the one-warp
    # tile (11 programs an SM in the sm_90a build since value lanes: at 16 x 8 KV heads 11
    # splits are 0.97 of a wave on 132 SMs, 16 1.41, 22 1.94; at 64 x 8, 4 are 1.41, 5 1.76)
    # at 2 and 3 stages (the build has 176 registers at 3)
    nvidia-smi -L >>"$log" 2>&1
    step 150 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 \
      --context 8192 32768 --specs "KV4 g32" "KV8 g64" --variants decode-kernel \
      --num-splits 4 5 8 11 16 22 32 --num-stages 2 3 \
      --output "$out/attention_decode_splits.json"
    step 240 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 --context 8192 \
      --specs "KV3 g32" "KV4 g32 sym" "K5V3 had" --variants decode-kernel --block-tokens 16 32 64 \
      --num-warps 1 2 4 --num-stages 2 3 --output "$out/attention_decode_tune.json"
    step 170 python3 benchmarks/sglang_backend_step.py --device cuda --modes extend --batch 16 \
      --context 8192 --specs "K8V4 (mixed)" "KV4 g32 sym" --query-rows 16 32 64 128 \
      --block-tokens 32 64 --num-warps 4 8 --output "$out/sglang_extend_tune.json"
    ;;
  profile)  # after `first`: where the decode kernel's time goes, under 8 minutes; the tiles
    # on 1 and 2 warps too (no cross-warp softmax: at sm_90a KV4 g32 takes 37-45 instructions
    # a token at 16-32 tokens on one warp, 48 at the plan's 64 x 4 warps; 4 and 8 warps at
    # 1-3 stages were timed on the H200 in session 6)
    nvidia-smi -L >>"$log" 2>&1
    step 60 python3 -m pytest -m cuda -q -n 4 -p no:cacheprovider \
      tests/attention/test_decode_cuda.py -k "new_tokens_in_hand"
    step 220 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 --context 8192 \
      --specs "KV8 g64" "KV4 g32" "K8V4 (mixed)" --variants decode-kernel \
      --block-tokens 16 32 64 --num-warps 1 2 4 --num-stages 2 3 \
      --output "$out/attention_decode_sweep.json"
    for spec in "KV8 g64" "KV4 g32"; do  # one launch at 16 x 8192, after the check's and a warm one
      name=$(echo "$spec" | tr -cd 'A-Za-z0-9')
      step 70 ncu --target-processes all -k regex:_decode_kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
        --log-file "$out/ncu_decode_$name.txt" \
        python3 benchmarks/attention_decode.py --device cuda --batch 16 --context 8192 \
        --specs "$spec" --variants decode-kernel --output /tmp/ncu_unused.json
    done
    ;;
  plans)  # the plans the sweeps chose, checked and timed; the tiles still unmeasured, swept
    nvidia-smi -L >>"$log" 2>&1
    step 60 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 \
      --context 8192 32768 --specs "KV4 g32" "KV8 g64" "K8V4 (mixed)" "KV4 g128" \
      --variants decode-kernel --output "$out/attention_decode_plans.json"
    step 45 python3 benchmarks/attention_decode.py --device cuda --batch 16 64 --context 8192 \
      --specs "KV4 g32 pre-RoPE" --variants decode-kernel --block-tokens 16 32 64 \
      --num-warps 4 8 --num-stages 2 --output "$out/attention_decode_prerope.json"
    step 80 python3 benchmarks/sglang_backend_step.py --device cuda --modes extend --batch 16 \
      --context 8192 --specs "KV4 g32" "KV8 g64" --query-rows 16 64 128 --block-tokens 32 64 \
      --num-warps 4 8 --output "$out/sglang_extend_sweep.json"
    step 40 python3 benchmarks/sglang_backend_step.py --device cuda --modes decode \
      --batch 1 16 64 --context 1024 8192 --output "$out/sglang_decode_host.json"
    ;;
  kernels)
    nvidia-smi -L >>"$log" 2>&1
    step 180 python3 -m pytest -m cuda -q -p no:cacheprovider $cuda_tests
    step 120 python3 benchmarks/quant_throughput.py --device cuda \
      --output "$out/quant_throughput_kernels.json"
    step 180 python3 benchmarks/attention_decode.py --device cuda \
      --variants decode-kernel,baseline --output "$out/attention_decode.json"
    step 120 python3 benchmarks/sglang_backend_step.py --device cuda \
      --output "$out/sglang_backend_step.json"
    ;;
  attention)  # the general kernel's two variants checked on the GPU, then timed in one run
    nvidia-smi -L >>"$log" 2>&1
    step 150 python3 -m pytest -m cuda -q -p no:cacheprovider tests/attention/*cuda*.py
    step 220 python3 benchmarks/attention_decode.py --device cuda \
      --variants baseline,scale-after-dot --output "$out/attention_decode_variants.json"
    step 220 python3 benchmarks/attention_decode.py --device cuda --dtype float16 \
      --variants baseline,scale-after-dot --output "$out/attention_decode_variants_fp16.json"
    ;;
  hf)
    step 270 python3 benchmarks/hf_decode.py --device cuda --batch 1 --context 2048 16384 \
      --caches "KV4 g32 static" "KV8 g64 static" static dynamic "KV4 g32" \
      --output "$out/hf_decode_static.json"
    step 270 python3 benchmarks/hf_decode.py --device cuda --output "$out/hf_decode.json"
    ;;
  search)
    step 570 python3 benchmarks/calibration_time.py --what search --device cuda \
      --model llama-3.1-8b-shape --json "$out/search_time_llama-3.1-8b-shape.json"
    ;;
esac
tail -n 60 "$log"
