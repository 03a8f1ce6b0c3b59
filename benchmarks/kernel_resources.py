"""What an H100 would run for kvtuner's hot kernels, read off an sm_90a build on any machine.

Every hot kernel is launched through its own launcher with CPU tensors at the benchmark shapes,
in the dtypes a GPU run uses (bf16 q and KV), inside ``../shared/tools/sm90_report.py``'s
``compile_only``: Triton's ptxas builds each kernel for sm_90a and cuobjdump reads its
registers, spills, shared memory and SASS mix; nothing runs. One row per (case, kernel):

- ``kernel``, ``label`` (phase and spec, e.g. ``decode KV4 g32``), ``reg`` (registers a thread),
  ``spill_bytes``, ``shared`` (bytes a program), ``programs_per_sm`` (register and shared-memory
  limit, as the driver gives them out: 256 registers to a warp),
  ``warps_per_sm`` (those programs' warps: what hides memory latency in the pool kernels,
  which wait on memory; on the H200 unpack ran twice as fast at 52-64 as at 13, issuing a quarter
  more instructions a row), ``ldg_widths`` (global loads by width: ``U8`` is a byte a load,
  ``128`` sixteen), ``ldgsts_widths`` (the same for async copies into shared memory, what Triton's
  pipelined loads become), ``stg_widths`` (global stores by width), ``sass`` (MMA, conversions,
  loads, spills...), ``row_sass`` (pack and unpack: instructions the warps issue for one
  token-head row, comparable across rows a program and warps), ``token_sass`` (attention: the
  loop's instructions the warps issue for one key of a tile), ``loop_sass`` (instructions a
  warp issues per trip of the kernel's main loop: one K/V tile for attention),
  ``loop_shared_bytes`` (bytes a thread moves through shared memory per trip, the async
  copies' writes aside: layout changes and staged operands), ``loop_local`` (spill loads and
  stores in that loop), ``loop_branches`` (branches in that loop: 1 is its back edge; more
  where a tile takes a path per lane, as Triton 3.6 built pre-RoPE keys' [BT, 1] scale loads,
  a branch around each 4-byte copy). Instructions a
  key do not set decode's time alone: on the H200 the one-warp tile's symmetric KV4 rows issued
  25 % more of them than KV4 g32 and ran as fast, while rows read in 4-byte async copies
  (``ldgsts`` ``32``: KV4 g128, KV3 g32) ran at half the speed their instructions implied
  (docs/results/gpu.md).

A clean row does not prove speed (a GPU run does); a row that spills, converts every element, loads
codes a byte at a time or holds few warps an SM while it waits on memory is slow there. Shapes:
Llama-3-8B attention (32 query heads, 8 KV heads, head_dim 128), decode at batch 16 × 8192 tokens;
pack/unpack 65536 tokens.

    python benchmarks/kernel_resources.py [--only decode] [--output FILE]
    python benchmarks/kernel_resources.py --only tiles --output /tmp/tiles.json  # plan sweep
    python benchmarks/kernel_resources.py --only pool-plans --output /tmp/pool.json  # pack/unpack
    python benchmarks/kernel_resources.py --only mixed --output /tmp/mixed.json  # profiles' rows

The build is the running Python's Triton's (the JSON names it). The GPU machines run Triton
3.6 (torch 2.11), whose builds differ from 3.9's (torch 2.13, CI): a venv with torch 2.13 and
Triton 3.6 builds as they do (docs/results/gpu.md, "Triton 3.6").

Exit 2 with one line where the shared tool is missing (``--tool`` names another copy).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from attention_decode import row_stride

OUT = Path(__file__).parent / "results" / "kernel_resources.json"
TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "sm90_report.py"
HQ, HKV, D, BATCH, CONTEXT, PACK_TOKENS = 32, 8, 128, 16, 8192, 65536
SMS = 132  # an H100 SXM's SMs: the splits a GPU launch would choose
SPECS = {  # label: (K spec kwargs, V spec kwargs)
    "KV4 g32": (dict(bits=4), dict(bits=4)),
    "KV8 g64": (dict(bits=8, group_size=64), dict(bits=8, group_size=64)),
    "KV8 g32": (dict(bits=8), dict(bits=8)),
    "KV4 g64": (dict(bits=4, group_size=64), dict(bits=4, group_size=64)),
    "K8V4 g64/g32": (dict(bits=8, group_size=64), dict(bits=4)),
    "KV2 g32": (dict(bits=2), dict(bits=2)),
    "KV4 g128": (dict(bits=4, group_size=128), dict(bits=4, group_size=128)),
    "KV4 g32 sym": (dict(bits=4, symmetric=True), dict(bits=4, symmetric=True)),
    "KV3 g32": (dict(bits=3), dict(bits=3)),
    "K5V3 g64/g32 (had keys)": (dict(bits=5, group_size=64, rotation="hadamard"), dict(bits=3)),
    "KV6 g32": (dict(bits=6), dict(bits=6)),
    "K16V4": (dict(bits=16), dict(bits=4)),
}


def load_tool(path: Path):
    """The shared tool's module (``compile_only``), or one line and exit 2."""
    if not path.is_file():
        print(
            f"error: {path} not found (the shared sm90_report tool; --tool PATH)", file=sys.stderr
        )
        sys.exit(2)
    spec = importlib.util.spec_from_file_location("sm90_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refuse_interpreter() -> None:
    """One line and exit 2 under ``TRITON_INTERPRET=1``: the kernels are built, not run."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET (kernels are compiled, not run)", file=sys.stderr)
        sys.exit(2)


def specs(label: str, table: dict | None = None):
    """(K spec, V spec) of ``label`` in ``table`` (default: :data:`SPECS`)."""
    from kvtuner.quant import QuantSpec

    return tuple(QuantSpec(**kw) for kw in (table or SPECS)[label])


def paged_batch(label: str, heads: tuple[int, int, int] = (HQ, HKV, D), layout: str = "rows",
                table: dict | None = None, **fields):  # fmt: skip
    """A decode batch over a paged pool at the benchmark shape (uninitialised: compile only);
    ``heads``: query heads, KV heads, head_dim; ``layout`` ``"padded"``: rows
    :func:`attention_decode.row_stride` bytes apart (a view of the padded rows); ``label`` a
    key of ``table`` (default :data:`SPECS`)."""
    import torch

    from kvtuner.attention import AttentionBatch

    k_spec, v_spec = specs(label, table)
    hq, hkv, dim = heads
    slots = BATCH * CONTEXT
    widths = [s.row_bytes(dim) for s in (k_spec, v_spec)]
    strides = [row_stride(w, layout) for w in widths]
    rows = [torch.empty(slots, hkv, st, dtype=torch.uint8)[..., :w]
            for w, st in zip(widths, strides, strict=True)]  # fmt: skip
    table = torch.arange(slots, dtype=torch.int32).view(BATCH, CONTEXT)
    return AttentionBatch(
        q=torch.empty(BATCH, 1, hq, dim, dtype=torch.bfloat16), k_rows=rows[0], v_rows=rows[1],
        k_spec=k_spec, v_spec=v_spec, slot_table=table,
        lengths=torch.full((BATCH,), CONTEXT, dtype=torch.int32), **fields,
    )  # fmt: skip


def hf_batch(label: str, tail: int = 64):
    """The HF cache's decode: contiguous rows [B, Hkv, T, R], a bf16 tail, left padding."""
    import torch

    from kvtuner.attention import AttentionBatch

    k_spec, v_spec = specs(label)
    rows = [torch.empty(1, HKV, 2048, s.row_bytes(D), dtype=torch.uint8) for s in (k_spec, v_spec)]
    tails = [torch.empty(1, HKV, tail, D, dtype=torch.bfloat16) for _ in range(2)]
    return AttentionBatch(
        q=torch.empty(1, 1, HQ, D, dtype=torch.bfloat16), k_rows=rows[0], v_rows=rows[1],
        k_spec=k_spec, v_spec=v_spec, k_tail=tails[0], v_tail=tails[1],
        starts=torch.zeros(1, dtype=torch.int32),
    )  # fmt: skip


def decode_cases() -> dict:
    """label -> a zero-argument launch: the decode kernel for every spec, the HF path,
    pre-RoPE keys and KIVI keys in a pool; the general kernel at the same decode points for
    comparison (it still serves KIVI pages with a window, pre-RoPE or not)."""
    from kvtuner.attention.decode_kernel import launch_decode, plan_decode
    from kvtuner.attention.kernel import launch

    def decode(batch):  # uncapped: what each build takes alone (the caps: fitted_cases)
        plan = dataclasses.replace(plan_decode(batch, sms=SMS), fit_registers=False)
        return lambda: launch_decode(batch, batch.q, batch.k_tail, batch.v_tail, plan)

    cases = {f"decode {label}": decode(paged_batch(label)) for label in SPECS}
    cases["decode KV4 g32 window+cap"] = decode(paged_batch("KV4 g32", window=4096, logit_cap=50.0))
    for label in ("KV4 g128", "KV8 g64", "KV4 g32 sym"):  # rows not a multiple of 16 bytes
        cases[f"decode {label} rows padded to 16 B"] = decode(paged_batch(label, layout="padded"))
        cases[f"decode {label} planes"] = decode(paged_batch(label, planes=True))
    cases["decode KV4 g32 HF (tail)"] = decode(hf_batch("KV4 g32"))
    cases["decode KV4 g32 d256 (Gemma 3: 4 heads, 1 KV head)"] = decode(
        paged_batch("KV4 g32", heads=(4, 1, 256))
    )
    for label, batch in rope_batches().items():
        cases[label] = decode(batch)
    general = paged_batch("KV4 g32")
    splits = plan_decode(general, sms=SMS).splits
    cases["decode KV4 g32 general kernel"] = lambda: launch(general, general.q, None, None,
                                                            splits, 64)  # fmt: skip
    cases["decode KIVI K4 g32 V4 g32"] = decode(kivi_batch())
    cases["decode KIVI K4 g32 V4 g32 pre-RoPE"] = decode(pre_rope(kivi_batch(), D))
    cases["decode KIVI K3 g32 V3 g32"] = decode(kivi_batch(3))
    cases["decode KIVI K3 g32 V3 g32 pre-RoPE"] = decode(pre_rope(kivi_batch(3), D))
    return cases


def general_cases() -> dict:
    """The general kernel where it still serves KIVI keys (with a window, pre-RoPE or not;
    the HF cache's blocks) and, for comparison, where the decode and extend kernels took over
    (their slowest builds: not in CI's run, whose one comparison row is the decode group's)."""
    from kvtuner.attention.decode_kernel import plan_decode
    from kvtuner.attention.kernel import launch
    from kvtuner.quant import QuantSpec

    kivi, kivi_rope = kivi_batch(), pre_rope(kivi_batch(), D)
    splits = plan_decode(kivi, sms=SMS).splits
    ragged = ragged_batch(QuantSpec(4), BATCH * 512)
    extend = dataclasses.replace(kivi, q=ragged.q, qo_indptr=ragged.qo_indptr, max_q_len=512)
    return {
        "decode KIVI K4 g32 V4 g32 (general kernel)": lambda: launch(
            kivi, kivi.q, None, None, splits, 64
        ),
        "decode KIVI K4 g32 V4 g32 pre-RoPE, the general kernel (windows)": lambda: launch(
            kivi_rope, kivi_rope.q, None, None, splits, 64
        ),
        "extend KV4 g32, the general kernel": lambda: launch(ragged, ragged.q, None, None, 1, 64),
        "extend KIVI K4 g32 V4 g32 (general kernel)": lambda: launch(
            extend, extend.q, None, None, 1, 64
        ),
    }


# one-warp rows whose register cap is fitted in CI (each tries 1-3 caps over the uncapped
# build); " planes": the pool's layout for rows no multiple of 16 bytes (KV8 g64's in SGLang)
FITTED = ["KV4 g32", "KV4 g32 sym", "KV4 g64", "KV8 g64", "K8V4 g64/g32", "KV8 g64 planes"]


def fitted_cases(labels=tuple(FITTED), table: dict | None = None) -> dict:
    """The decode kernel as a GPU launches it: its plan's cap on registers fitted at the first
    launch (:func:`kvtuner.attention.decode_kernel._fitted_cap`: the lowest cap that spills
    nothing and holds more programs an SM). Rows: each cap tried (``maxnreg``), the uncapped
    build where the decode group has not built it yet; ``fitted_cap`` the one launched.
    ``labels`` keys of ``table`` (default :data:`SPECS`)."""
    from kvtuner.attention.decode_kernel import launch_decode, plan_decode

    def fit(batch):
        def launch() -> dict:
            launch_decode(batch, batch.q, batch.k_tail, batch.v_tail, plan_decode(batch, sms=SMS))
            return {"fitted_cap": plan_decode(batch, sms=SMS).max_registers}

        return launch

    def batch(label):
        base = label.removesuffix(" planes")
        return paged_batch(base, table=table, planes=base != label)

    cases = {f"decode {label} fitted": fit(batch(label)) for label in labels}
    if table is None:  # the HF cache's pre-RoPE decode too: rows and a tail, 64 keys on 4 warps
        cases["decode KV4 g32 pre-RoPE HF (tail) fitted"] = fit(pre_rope(hf_batch("KV4 g32"), D))
    return cases


# the shipped profiles' common mixed rows (exported_configs/: K3 g32 and 2-bit values lead)
MIXED = {
    "K4 g32 / V2 g32": (dict(bits=4), dict(bits=2)),
    "K3 g32 / V2 g32": (dict(bits=3), dict(bits=2)),
    "K3 g32 / V3 g32": (dict(bits=3), dict(bits=3)),
    "K4 g32 / V4 g64": (dict(bits=4), dict(bits=4, group_size=64)),
    "K5 g64 / V4 g64": (dict(bits=5, group_size=64), dict(bits=4, group_size=64)),
}


def mixed_cases() -> dict:
    """One-warp decode of :data:`MIXED`, uncapped and at each cap the launcher tries, as
    :func:`fitted_cases` (``--only mixed``; not in the default run)."""
    return fitted_cases(tuple(MIXED), MIXED)


def kivi_batch(bits: int = 4):
    """SGLang's pool with KIVI keys: channel-axis blocks a page of 32 slots ([pages, Hkv,
    block]), each request's filling page staged in bf16; token-axis g32 values of as many
    bits (3: the shipped profiles' most frequent key and value specs)."""
    import torch

    from kvtuner.attention import AttentionBatch
    from kvtuner.quant import QuantSpec

    k_spec, v_spec = QuantSpec(bits, axis="channel"), QuantSpec(bits)
    slots, page = BATCH * CONTEXT, k_spec.group_size
    return AttentionBatch(
        q=torch.empty(BATCH, 1, HQ, D, dtype=torch.bfloat16),
        k_rows=torch.empty(slots // page, HKV, k_spec.block_bytes(D), dtype=torch.uint8),
        v_rows=torch.empty(slots, HKV, v_spec.row_bytes(D), dtype=torch.uint8),
        k_spec=k_spec, v_spec=v_spec,
        slot_table=torch.arange(slots, dtype=torch.int32).view(BATCH, CONTEXT),
        lengths=torch.full((BATCH,), CONTEXT, dtype=torch.int32),
        k_stage=torch.empty(BATCH, page, HKV, D, dtype=torch.bfloat16),
        k_stage_rows=torch.empty(slots // page, dtype=torch.int32),
    )  # fmt: skip


def pre_rope(batch, rotary: int):
    """``batch`` with its keys stored pre-RoPE, ``rotary`` channels of each head rotated."""
    import torch

    from kvtuner.quant import QuantSpec

    spec = QuantSpec(**{**dataclasses.asdict(batch.k_spec), "pre_rope": True})
    freq = torch.empty(rotary // 2, dtype=torch.float32)
    return dataclasses.replace(batch, k_spec=spec, rope_freq=freq)


def rope_batches() -> dict:
    """The decode kernel's pre-RoPE keys: full rotary (Llama), a half and a quarter
    (GPT-NeoX-style partial rotary: a pass-through span), KV8 g64 and g32, and codes in two
    planes (3 bits)."""
    return {
        "decode KV4 g32 pre-RoPE": pre_rope(paged_batch("KV4 g32"), D),
        "decode KV4 g32 pre-RoPE R=D/2": pre_rope(paged_batch("KV4 g32"), D // 2),
        "decode KV4 g32 pre-RoPE R=D/4": pre_rope(paged_batch("KV4 g32"), D // 4),
        "decode KV8 g32 pre-RoPE": pre_rope(paged_batch("KV8 g32"), D),
        "decode KV8 g64 pre-RoPE": pre_rope(paged_batch("KV8 g64"), D),
        "decode KV3 g32 pre-RoPE": pre_rope(paged_batch("KV3 g32"), D),
    }


def ragged_batch(spec, n_q: int):
    """SGLang's extend batch: BATCH requests of CONTEXT stored tokens, the last 512 new."""
    import torch

    from kvtuner.attention import AttentionBatch

    slots = BATCH * CONTEXT
    rows = torch.empty(slots, HKV, spec.row_bytes(D), dtype=torch.uint8)
    return AttentionBatch(
        q=torch.empty(n_q, HQ, D, dtype=torch.bfloat16), k_rows=rows, v_rows=rows, k_spec=spec,
        v_spec=spec, slot_table=torch.arange(slots, dtype=torch.int32).view(BATCH, CONTEXT),
        lengths=torch.full((BATCH,), CONTEXT, dtype=torch.int32),
        qo_indptr=torch.arange(0, n_q + 1, 512, dtype=torch.int32), max_q_len=512,
    )  # fmt: skip


def extend_cases() -> dict:
    """SGLang's extend: the extend kernel (token-axis keys, KIVI pages); the general kernel's
    rows are :func:`general_cases`'."""
    import torch

    from kvtuner.attention.extend_kernel import launch_extend, plan_extend
    from kvtuner.quant import QuantSpec

    n_q = BATCH * 512
    ragged, ragged8 = ragged_batch(QuantSpec(4), n_q), ragged_batch(QuantSpec(8, 64), n_q)
    mixed = dataclasses.replace(ragged8, v_spec=ragged.v_spec, v_rows=ragged.v_rows)
    new = tuple(torch.empty(n_q, HKV, D, dtype=torch.bfloat16) for _ in range(2))  # in hand
    kivi = dataclasses.replace(kivi_batch(), q=ragged.q, qo_indptr=ragged.qo_indptr,
                               max_q_len=512)  # fmt: skip
    return {
        "extend KV4 g32 (512 new tokens)": lambda: launch_extend(
            ragged, ragged.q, plan_extend(ragged, 1)
        ),
        "extend KV4 g32, new tokens in hand": lambda: launch_extend(
            ragged, ragged.q, plan_extend(ragged, 1), new
        ),
        "extend KV8 g64 (512 new tokens)": lambda: launch_extend(
            ragged8, ragged8.q, plan_extend(ragged8, 1)
        ),
        "extend KV8 g64, new tokens in hand": lambda: launch_extend(
            ragged8, ragged8.q, plan_extend(ragged8, 1), new
        ),
        "extend K8V4 g64/g32, new tokens in hand": lambda: launch_extend(
            mixed, mixed.q, plan_extend(mixed, 1), new
        ),
        "extend KIVI K4 g32 V4 g32, new tokens in hand": lambda: launch_extend(
            kivi, kivi.q, plan_extend(kivi, 1), new
        ),
    }


PACK_SPECS = {  # label: QuantSpec kwargs; every row length a pool holds at head_dim 128
    "KV4 g32": dict(bits=4),
    "KV4 g32 hadamard": dict(bits=4, rotation="hadamard"),
    "KV8 g64": dict(bits=8, group_size=64),  # 136-byte rows: offsets multiples of 8 bytes
    "KV4 g128": dict(bits=4, group_size=128),  # 68-byte rows: of 4 bytes
    "KV3 g32": dict(bits=3),
    "K16": dict(bits=16),
}


KV_PACKS = {"KV4 g32": ("KV4 g32", "KV4 g32"), "K8V4 g64/g32": ("KV8 g64", "KV4 g32")}


def pack_cases() -> dict:
    """Pack (scatter quantized into a slot pool) and unpack (gather dequantized to bf16), each
    with its launcher's grid and arguments (the launchers refuse CPU tensors outside the
    interpreter, so the kernels are called here as they call them)."""
    from kvtuner.quant import QuantSpec
    from kvtuner.quant import triton_kernels as tk

    cases = {}
    for label, kw in PACK_SPECS.items():
        spec = QuantSpec(**kw)
        cases[f"pack {label}"] = pool_launch(spec, tk.plan_pool(spec, pack=True), pack=True)
        cases[f"unpack {label}"] = pool_launch(spec, tk.plan_pool(spec, pack=False), pack=False)
    for label in ("KV4 g128", "KV8 g64"):  # rows no multiple of 16 bytes, as planes
        spec = QuantSpec(**PACK_SPECS[label])
        for verb, pack in (("pack", True), ("unpack", False)):
            plan = tk.plan_pool(spec, pack=pack)
            cases[f"{verb} {label} planes"] = pool_launch(spec, plan, pack=pack, planes=True)
    for label in ("KV4 g32", "KV8 g64"):  # decode sizes: the launcher's plan for 16 tokens
        spec = QuantSpec(**PACK_SPECS[label])
        plan = tk.plan_pool(spec, pack=True).filling(16, HKV, SMS)
        cases[f"pack {label} at decode (16 tokens)"] = pool_launch(spec, plan, pack=True)
    for label, (k, v) in KV_PACKS.items():  # a decode step's K and V in one launch
        cases[f"pack K+V {label} at decode (16 tokens)"] = kv_launch(
            QuantSpec(**PACK_SPECS[k]), QuantSpec(**PACK_SPECS[v]), tokens=16
        )
    cases["pack KIVI K4 g32 pages"] = kivi_pages(QuantSpec(4, axis="channel"))
    cases["pack KIVI K3 g32 pages"] = kivi_pages(QuantSpec(3, axis="channel"))
    return cases


def pool_launch(spec, plan, *, pack: bool, planes: bool = False):
    """Pack (``pack``) or unpack of PACK_TOKENS rows of ``spec`` at ``plan`` (``planes``: laid
    out as planes), called as the launchers call the kernels (they refuse CPU tensors outside
    the interpreter)."""
    import torch

    from kvtuner.quant import triton_kernels as tk

    buf = torch.empty(PACK_TOKENS, HKV, spec.row_bytes(D), dtype=torch.uint8)
    x = torch.empty(PACK_TOKENS, HKV, D, dtype=torch.bfloat16)  # pack's input, unpack's output
    loc = torch.arange(PACK_TOKENS, dtype=torch.int64)
    grid, args = tk._launch_args(buf, loc, spec, D, plan, planes)
    if pack:
        kernel = tk._scatter_kernel if spec.is_quantized else tk._scatter_fp16_kernel
        return lambda: kernel[grid](x, loc, buf, stride_xt=x.stride(0), stride_xh=x.stride(1),
                                    **args)  # fmt: skip
    kernel = tk._gather_kernel if spec.is_quantized else tk._gather_fp16_kernel
    return lambda: kernel[grid](buf, loc, x, OUT_BF16=False, **args)  # a GPU's bf16 cast


def kv_launch(k_spec, v_spec, *, tokens: int):
    """Pack of a write's K and V (``tokens`` rows each) in one launch, as
    :func:`~kvtuner.quant.triton_kernels.triton_scatter_kv` launches it on SMS SMs."""
    import torch

    from kvtuner.quant import triton_kernels as tk

    bufs = [torch.empty(tokens, HKV, s.row_bytes(D), dtype=torch.uint8) for s in (k_spec, v_spec)]
    xs = [torch.empty(tokens, HKV, D, dtype=torch.bfloat16) for _ in range(2)]
    loc = torch.arange(tokens, dtype=torch.int64)
    specs, planes = (k_spec, v_spec), (False, False)
    grid, args = tk._kv_launch_args(*bufs, loc, xs, specs, planes, SMS)
    return lambda: tk._scatter_kv_kernel[grid](*xs, loc, *bufs, **args)


def pool_plan_cases() -> dict:
    """Pack and unpack at each plan of ``quant_throughput.POOL_PLANS`` (the GPU sweep's), on
    its specs: label ``pack <spec> at <plan>``."""
    from quant_throughput import PLAN_SPECS, POOL_PLANS

    from kvtuner.quant.triton_kernels import PoolPlan

    return {
        f"{verb} {spec.short()} at {label}": pool_launch(
            spec, PoolPlan(*fields), pack=verb == "pack"
        )
        for spec in PLAN_SPECS
        for label, fields in POOL_PLANS.items()
        for verb in ("pack", "unpack")
    }


def kivi_pages(spec):
    """SGLang's KIVI keys: full pages of G tokens packed as channel-axis blocks, one program a
    (page, head)."""
    import torch

    from kvtuner.quant.triton_channel import launch_pack

    pages = PACK_TOKENS // spec.group_size
    blocks = torch.empty(pages, HKV, spec.block_bytes(D), dtype=torch.uint8)
    x = torch.empty(pages, spec.group_size, HKV, D, dtype=torch.bfloat16)
    index = torch.arange(pages, dtype=torch.int64)
    return lambda: launch_pack(blocks, index, x, spec)  # its launcher refuses CPU tensors


# tokens, warps, stages
TILES = [(32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (16, 8, 1), (16, 1, 2),
         (32, 1, 2), (32, 2, 2), (32, 2, 3)]  # fmt: skip


def tile_cases() -> dict:
    """The decode kernel of every spec at each tile of ``TILES`` (a sweep for the plan's rules;
    not in the default run): label ``decode <spec> at <tokens>x<warps>w<stages>s``."""
    from kvtuner.attention.decode_kernel import DecodePlan, launch_decode, plan_decode

    def decode(batch, tile):
        plan = DecodePlan(plan_decode(batch, sms=SMS).splits, *tile)
        return lambda: launch_decode(batch, batch.q, None, None, plan)

    batches = {label: paged_batch(label) for label in SPECS}
    batches.update(rope_batches())
    return {
        f"{label.removeprefix('decode ')} at {t}x{w}w{st}s": decode(batch, (t, w, st))
        for label, batch in batches.items()
        for t, w, st in TILES
    }


# query rows, tokens, warps, stages
EXTEND_TILES = [(16, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 2)]


def extend_tile_cases() -> dict:
    """The extend kernel (new tokens in hand) at each tile of ``EXTEND_TILES``, KV4 g32 and KV8
    g64: label ``extend <spec> at q<rows>x<tokens>x<warps>w<stages>s``."""
    import torch

    from kvtuner.attention.extend_kernel import ExtendPlan, launch_extend
    from kvtuner.quant import QuantSpec

    n_q = BATCH * 512
    new = tuple(torch.empty(n_q, HKV, D, dtype=torch.bfloat16) for _ in range(2))
    cases = {}
    for label, spec in (("KV4 g32", QuantSpec(4)), ("KV8 g64", QuantSpec(8, 64))):
        batch = ragged_batch(spec, n_q)
        for rows, t, w, st in EXTEND_TILES:
            plan = ExtendPlan(1, rows=rows, block_tokens=t, num_warps=w, num_stages=st)
            cases[f"extend {label} at q{rows}x{t}x{w}w{st}s"] = lambda batch=batch, plan=plan: (
                launch_extend(batch, batch.q, plan, new)
            )
    return cases


GROUPS = {"decode": decode_cases, "fitted": fitted_cases, "extend": extend_cases,
          "pack": pack_cases, "general": general_cases, "tiles": tile_cases,
          "extend-tiles": extend_tile_cases, "pool-plans": pool_plan_cases,
          "mixed": mixed_cases}  # fmt: skip
DEFAULT_GROUPS = ["decode", "fitted", "extend", "pack", "general"]


def store_widths(sass: str) -> dict[str, int]:
    """Global stores (``STG``) by width: ``128`` is sixteen bytes, ``32`` four, ``U8`` one."""
    found = re.findall(r"\bSTG\.E(?:\.EF)?(?:\.(128|64|U8|U16|S8|S16))?\b", sass)
    return dict(collections.Counter(w or "32" for w in found))


def async_copy_widths(sass: str) -> dict[str, int]:
    """Global-to-shared async copies (``LDGSTS``: what Triton's pipelined loads become) by
    width: ``128`` is sixteen bytes, ``32`` four (no suffix), ``U8`` one."""
    found = re.findall(r"\bLDGSTS\.E(?:\.BYPASS)?(?:\.LTC128B)?(?:\.(128|64|U8|U16))?\b", sass)
    return dict(collections.Counter(w or "32" for w in found))


def _instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every SASS instruction (predicates dropped)."""
    return [
        (int(addr, 16), op, rest)
        for addr, op, rest in re.findall(
            r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass
        )
    ]


def _branches(ops: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(address, target) of every branch with a target."""
    return [
        (addr, int(target, 16))
        for addr, op, rest in ops
        if op.startswith("BRA") and (target := _branch_target(rest))
    ]


def _loop(sass: str) -> list[tuple[int, str, str]]:
    """The instructions of the kernel's largest loop (the span from a backward branch's target
    to the branch); none where the kernel has no loop."""
    ops = _instructions(sass)
    spans = [(target, addr) for addr, target in _branches(ops) if target < addr]
    if not spans:
        return []
    lo, hi = max(spans, key=lambda span: sum(span[0] <= a <= span[1] for a, _, _ in ops))
    return [op for op in ops if lo <= op[0] <= hi]


def loop_instructions(sass: str) -> int:
    """SASS instructions in the kernel's largest loop: what every warp issues per K/V tile, so
    the cost of a tile; 0 where the kernel has no loop."""
    return len(_loop(sass))


SHARED_OPS = ("LDS", "STS", "LDSM", "STSM")  # 4 bytes a thread, unless a width suffix says
SHARED_WIDTHS = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


def loop_shared_bytes(sass: str) -> int:
    """Bytes a thread reads from and writes to shared memory per trip of the largest loop
    (``LDS``/``STS`` by width, ``LDSM``/``STSM`` by matrices; the async copies' writes not
    counted): on the H200 decode's warps waited on shared memory more than on anything else
    (Nsight Compute, docs/results/gpu.md)."""
    total = 0
    for _, op, operands in _loop(sass):
        base, *suffixes = op.split(".")
        if base not in SHARED_OPS or "[RZ]" in operands:  # `@!PT LDS RZ, [RZ]`: padding
            continue
        width = next((SHARED_WIDTHS[s] for s in suffixes if s in SHARED_WIDTHS), 4)
        matrices = 1  # LDSM/STSM: .2 or .4 matrices (none: one)
        if base in ("LDSM", "STSM") and suffixes[-1].isdigit():
            matrices = int(suffixes[-1])
        total += width * matrices
    return total


def loop_local(sass: str) -> int:
    """Local-memory loads and stores (``LDL``/``STL``: spills) in the largest loop: where a
    spill costs every tile. A value spilled across the loop (stored once before it, loaded once
    after) costs two instructions a program."""
    return sum(op.startswith(("LDL", "STL")) for _, op, _ in _loop(sass))


def loop_branches(sass: str) -> int:
    """Branches (``BRA``) in the largest loop: its back edge, plus any path taken per lane
    or per warp inside a tile."""
    return sum(op.startswith("BRA") for _, op, _ in _loop(sass))


def row_instructions(row: dict) -> float:
    """Pack and unpack (a program: ``BLOCK`` token-head rows; a KIVI page pack: its ``G``
    token rows): SASS instructions the warps issue for one row, which compares tiles of
    different rows and warps; 0 elsewhere."""
    consts = row["constexprs"]
    block = consts.get("BLOCK") or (consts.get("G") if row["kernel"] == "_pack_kernel" else 0)
    if not block:
        return 0.0
    return round(sum(row["sass"].values()) * row["num_warps"] / block, 1)


def token_instructions(row: dict, loop: int) -> float:
    """Attention (a tile: ``BT`` keys): loop instructions the warps issue for one key, which
    compares tiles of different tokens and warps (``--only tiles``); 0 elsewhere."""
    tokens = row["constexprs"].get("BT")
    if not tokens or not loop:
        return 0.0
    return round(loop * row["num_warps"] / tokens, 1)


def _branch_target(operands: str) -> str | None:
    found = re.search(r"0x([0-9a-f]+)", operands)
    return found.group(1) if found else None


def collect(tool, groups: list[str]) -> list[dict]:
    """Compile every case of ``groups`` for sm_90a -> one row per (case, kernel compiled)."""
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory() as sass_dir,
        tool.compile_only(sass_dir) as kernels,
        loaded_as_on_a_gpu(kernels),
    ):
        for group in groups:
            for label, launch in GROUPS[group]().items():
                seen = len(kernels.rows)
                found = launch()  # a dict: what a case learnt of its launch (a fitted cap)
                for i, row in enumerate(kernels.rows[seen:], seen):
                    row.update(found if isinstance(found, dict) else {})
                    row.update(held_by_an_sm(row))
                    sass = Path(sass_dir, f"{i:02d}_{row['kernel']}.sass").read_text()
                    widths = {"ldgsts_widths": async_copy_widths(sass),
                              "stg_widths": store_widths(sass)}  # fmt: skip
                    loop = loop_instructions(sass)
                    rows.append({"label": label, **row, **widths, "loop_sass": loop,
                                 "loop_shared_bytes": loop_shared_bytes(sass),
                                 "loop_local": loop_local(sass),
                                 "loop_branches": loop_branches(sass),
                                 "warps_per_sm": row["programs_per_sm"] * row["num_warps"],
                                 "row_sass": row_instructions(row),
                                 "token_sass": token_instructions(row, loop)})  # fmt: skip
    return rows


def held_by_an_sm(row: dict) -> dict:
    """Programs an SM and occupancy as the driver gives them out (registers 256 to a warp, 1 KiB
    of shared memory a program more: :func:`kvtuner.attention.layout.programs_an_sm`, what the
    decode launcher fits its cap and splits by); the tool divides the SM's registers by the
    build's, so a build of 157 registers a thread held 13 one-warp programs there, 12 here."""
    from kvtuner.attention.layout import programs_an_sm

    programs = programs_an_sm(row["reg"], row["shared"], row["num_warps"])
    return {"programs_per_sm": programs, "occupancy": programs * row["num_warps"] / 64}


@contextlib.contextmanager
def loaded_as_on_a_gpu(kernels):
    """Inside ``compile_only``: a compiled kernel is loaded once (its row recorded once, with
    its ``maxnreg``), as a GPU's driver keeps its module, and its local bytes (Triton's
    ``n_spills``) count its stack frame too, as the CUDA driver's do (a spill lives in the
    frame); the tool loads no module and reports cuobjdump's LOCAL alone."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import driver

    load_handles, utils = CompiledKernel._init_handles, driver.active.utils
    load_binary, loaded = utils.load_binary, set()

    def init_handles(compiled):
        if id(compiled) not in loaded:
            loaded.add(id(compiled))
            load_handles(compiled)
            kernels.rows[-1]["maxnreg"] = getattr(compiled.metadata, "maxnreg", None)

    def load_with_frame(*args):
        module, function, registers, _, threads = load_binary(*args)
        return module, function, registers, kernels.rows[-1]["spill_bytes"], threads

    CompiledKernel._init_handles, utils.load_binary = init_handles, load_with_frame
    try:
        yield
    finally:
        CompiledKernel._init_handles, utils.load_binary = load_handles, load_binary


def _label(row: dict) -> str:
    """A row's label, its cap on registers, and ``(launched)`` on a fitted case's launched build."""
    cap = f" at maxnreg {row['maxnreg']}" if row.get("maxnreg") else ""
    fitted = row["kernel"] == "_decode_kernel" and "fitted_cap" in row
    launched = fitted and row["fitted_cap"] == row.get("maxnreg")
    return row["label"] + cap + (" (launched)" if launched else "")


def table(rows: list[dict]) -> str:
    head = (
        "| label | kernel | warps | REG | spill B | shared B | programs/SM | warps/SM | loop "
        "| loop smem B | a row/key | cvt | int | mma | ldg | ldgsts | stg |"
    )
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        ldg, ldgsts, stg = (
            ",".join(f"{w}x{n}" for w, n in sorted(r[key].items()))
            for key in ("ldg_widths", "ldgsts_widths", "stg_widths")
        )
        lines.append(
            f"| {_label(r)} | {r['kernel']} | {r.get('num_warps')} | {r['reg']} | "
            f"{r['spill_bytes']} | {r.get('shared')} | {r['programs_per_sm']} | "
            f"{r['warps_per_sm']} | "
            f"{r['loop_sass']} | {r['loop_shared_bytes']} | "
            f"{r['row_sass'] or r['token_sass'] or ''} | "
            f"{r['sass']['cvt']} "
            f"| {r['sass']['int']} | {r['sass']['mma']} "
            f"| {ldg} | {ldgsts} | {stg} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only",
        nargs="+",
        choices=list(GROUPS),
        default=DEFAULT_GROUPS,
        help="groups to build (default: decode fitted extend pack general; CI's run leaves out "
        "general, the slow builds it replaced; tiles: a plan sweep)",
    )
    p.add_argument("--tool", type=Path, default=TOOL, help="sm90_report.py (the shared tool)")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    refuse_interpreter()
    tool = load_tool(args.tool)
    rows = collect(tool, args.only)
    print(table(rows))
    from kvtuner.profile import write_json_atomic

    shape = dict(q_heads=HQ, kv_heads=HKV, head_dim=D, batch=BATCH, context=CONTEXT,
                 pack_tokens=PACK_TOKENS, sms=SMS)  # fmt: skip
    import triton  # the build is this Triton's: 3.6 (the GPU image's) and 3.9 differ

    meta = {"target": "sm_90a, compiled on a CPU", "triton": triton.__version__,
            "date": datetime.now(UTC).isoformat()}  # fmt: skip
    write_json_atomic(args.output, {**meta, "shape": shape, "rows": rows})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
