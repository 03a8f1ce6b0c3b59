"""Host time of one fused attention call: what an eager step pays before the GPU does anything.

HF ``generate()`` runs every layer's decode attention eagerly (SGLang's extend too: its decode
steps replay CUDA graphs, which hide this). On the H100 (docs/results/gpu.md) a 16-layer model
generated at 15 tok/s, host-bound, so each microsecond a layer's call spends in Python is the
step's. This measures that time on any machine: inside the shared ``sm90_report.py``'s
``compile_only`` every kernel is built once for sm_90a, then each launch goes through Triton's
argument binding to a launcher that does nothing. What is timed is everything but the GPU: the
checks, the plan, the allocations (CPU tensors here: a CUDA allocation costs about as much) and
Triton's binding; not the driver's launch (a few µs a kernel). Torch ops on these CPU tensors
compute on the CPU: small here, except Hadamard rows' rotations of q and the 64-token tails.

Cases (Llama-3-8B attention: 32 query heads, 8 KV heads, head_dim 128; fp16 q, so the CPU runs
the kernel build a GPU runs):
- ``HF decode <spec>``: :meth:`KVTunerLayer.attend` of one layer of the HF cache, batch 1,
  2048 packed tokens and a 64-token unpacked tail, the call ``generate()`` makes a layer a step;
- ``SGLang extend <spec>``: ``extend_attention`` over a paged pool, 4 requests × 2048 stored
  tokens, the last 128 new and in hand;
- ``write K+V <spec>``: a decode step's write of one layer (1 token, batch 1), K and V in one
  launch (what the pool and the static HF cache call) or a launch a side (as before).

    python benchmarks/host_cost.py [--calls 300] [--output FILE]

Prints µs a call (the best of 5 rounds), Triton launches a call and the µs spent inside them,
and writes JSON. Exit 2 with one line where the shared tool is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from kernel_resources import TOOL, load_tool, refuse_interpreter, specs

OUT = Path(__file__).parent / "results" / "host_cost.json"
HQ, HKV, D, PACKED, TAIL = 32, 8, 128, 2048, 64
SPECS = {  # label: (K spec kwargs, V spec kwargs)
    "KV4 g32": (dict(bits=4), dict(bits=4)),
    "KV8 g64": (dict(bits=8, group_size=64), dict(bits=8, group_size=64)),
    "K8V4 g64/g32": (dict(bits=8, group_size=64), dict(bits=4)),
    "KV4 g32 hadamard": (dict(bits=4, rotation="hadamard"), dict(bits=4, rotation="hadamard")),
}


@contextlib.contextmanager
def built_once(tool):
    """``compile_only``, each kernel loaded at its first launch only (the tool reloads it at
    every launch, to record it), and the packed-attention entry told that CPU tensors may go to
    the kernels (they are built here, never run) and that the merge stores q's dtype as on a
    GPU (on CPU it stores fp32 and a cast follows: 300 µs at extend's 512 × 32 × 128 on this
    2-core CPU, which a GPU call never pays). Yields a dict counting Triton launches and the
    seconds spent in them."""
    from triton.compiler import compiler as tc
    from triton.runtime.jit import JITFunction

    import kvtuner.attention.decode as entry
    import kvtuner.quant.triton_kernels as packs

    spent = {"launches": 0, "seconds": 0.0}
    run, guard, merges = JITFunction.run, entry.interpreted, entry._merges_in_q_dtype
    pack_guard = packs.interpreted

    def timed_run(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(self, *args, **kwargs)
        finally:
            spent["seconds"] += time.perf_counter() - start
            spent["launches"] += 1

    with tool.compile_only():
        build = tc.CompiledKernel._init_handles

        def load_once(self):
            if self.module is None:
                build(self)
                self.module, self._module_pid = "loaded", -1  # never unloaded: nothing loaded

        tc.CompiledKernel._init_handles = load_once
        JITFunction.run, entry.interpreted = timed_run, lambda: True
        entry._merges_in_q_dtype, packs.interpreted = (lambda q: True), (lambda: True)
        try:
            yield spent
        finally:
            JITFunction.run, entry.interpreted, entry._merges_in_q_dtype = run, guard, merges
            tc.CompiledKernel._init_handles, packs.interpreted = build, pack_guard


def hf_case(label: str):
    """One HF cache layer holding PACKED + TAIL tokens: its decode attention call."""
    import torch

    from kvtuner.profile import LayerSpec
    from kvtuner.runtime_loader.hf.layer import KVTunerLayer

    k_spec, v_spec = specs(label, SPECS)
    layer = KVTunerLayer(LayerSpec(0, k_spec, v_spec), D, residual_length=TAIL,
                         keep_dequantized=False)  # fmt: skip
    states = torch.randn(2, 1, HKV, PACKED + TAIL, D, dtype=torch.float16)
    layer.update(states[0], states[1])
    q = torch.randn(1, HQ, D, dtype=torch.float16)
    starts = torch.zeros(1, dtype=torch.int32)  # generate()'s mask: no left padding
    return lambda: layer.attend(q, starts=starts, sm_scale=None)


def extend_case(label: str, requests: int = 4, new: int = 128):
    """SGLang's extend over a paged pool: ``requests`` × PACKED stored tokens, the last ``new``
    of each just written and in hand."""
    import torch

    from kvtuner.attention import extend_attention

    k_spec, v_spec = specs(label, SPECS)
    slots = requests * PACKED
    rows = [torch.empty(slots, HKV, s.row_bytes(D), dtype=torch.uint8) for s in (k_spec, v_spec)]
    n_q = requests * new
    q = torch.randn(n_q, HQ, D, dtype=torch.float16)
    k_new, v_new = torch.randn(2, n_q, HKV, D, dtype=torch.float16)
    fields = dict(
        slot_table=torch.arange(slots, dtype=torch.int32).view(requests, PACKED),
        table_rows=torch.arange(requests, dtype=torch.int32),
        lengths=torch.full((requests,), PACKED, dtype=torch.int32),
        qo_indptr=torch.arange(0, n_q + 1, new, dtype=torch.int32), max_q_len=new,
        k_new=k_new, v_new=v_new,
    )  # fmt: skip
    return lambda: extend_attention(q, rows[0], rows[1], k_spec, v_spec, **fields)


def write_case(label: str, *, one_launch: bool, tokens: int = 1):
    """A decode step's write of one layer (``tokens`` new rows, batch 1 by default): K and V
    packed in one launch (``triton_scatter_kv``, what the pool and the static HF cache call), or
    a launch a side (``triton_scatter_quantized`` twice, as they did before)."""
    import torch

    from kvtuner.quant import triton_kernels as tk

    k_spec, v_spec = specs(label, SPECS)
    rows = [torch.empty(PACKED, HKV, s.row_bytes(D), dtype=torch.uint8) for s in (k_spec, v_spec)]
    k, v = torch.randn(2, tokens, HKV, D, dtype=torch.float16)
    loc = torch.arange(tokens, dtype=torch.int64)
    if one_launch:
        return lambda: tk.triton_scatter_kv(*rows, loc, k, v, k_spec, v_spec)

    def each_side():
        tk.triton_scatter_quantized(rows[0], loc, k, k_spec)
        tk.triton_scatter_quantized(rows[1], loc, v, v_spec)

    return each_side


def measure(call, spent: dict, calls: int, rounds: int = 5) -> dict:
    """Best of ``rounds`` rounds of ``calls`` calls: µs a call, and Triton's share of it."""
    call()  # builds the kernels
    best = None
    for _ in range(rounds):
        spent.update(launches=0, seconds=0.0)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        total = time.perf_counter() - start
        if best is None or total < best[0]:
            best = (total, spent["seconds"], spent["launches"])
    total, triton_s, launches = best
    return dict(us_per_call=total / calls * 1e6, triton_us_per_call=triton_s / calls * 1e6,
                launches_per_call=launches / calls)  # fmt: skip


def cases() -> dict:
    out = {f"HF decode {label}": (lambda label=label: hf_case(label)) for label in SPECS}
    out["SGLang extend KV4 g32"] = lambda: extend_case("KV4 g32")
    for label in ("KV4 g32", "K8V4 g64/g32"):
        out[f"write K+V {label}, one launch"] = lambda x=label: write_case(x, one_launch=True)
        out[f"write K+V {label}, a launch a side"] = lambda x=label: write_case(x, one_launch=False)
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| call | µs a call | Triton launches | µs in Triton | µs ours |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ours = r["us_per_call"] - r["triton_us_per_call"]
        lines.append(f"| {r['label']} | {r['us_per_call']:.1f} | {r['launches_per_call']:.0f} "
                     f"| {r['triton_us_per_call']:.1f} | {ours:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=300, help="calls a round (5 rounds, best kept)")
    p.add_argument("--tool", type=Path, default=TOOL, help="sm90_report.py (the shared tool)")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    refuse_interpreter()
    if args.calls < 1:
        print(f"error: --calls must be >= 1, got {args.calls}", file=sys.stderr)
        sys.exit(2)
    import torch

    tool = load_tool(args.tool)
    rows = []
    with built_once(tool) as spent:
        for label, make in cases().items():
            rows.append({"label": label, **measure(make(), spent, args.calls)})
    print(table(rows))
    from kvtuner.profile import write_json_atomic

    meta = dict(date=datetime.now(UTC).isoformat(), threads=torch.get_num_threads(),
                cpu=os.cpu_count(), calls=args.calls)  # fmt: skip
    shape = dict(q_heads=HQ, kv_heads=HKV, head_dim=D, packed=PACKED, tail=TAIL)
    write_json_atomic(args.output, {**meta, "shape": shape, "rows": rows})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
