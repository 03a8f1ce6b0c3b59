"""Fused decode attention over packed KV vs torch SDPA over the bf16 cache of the same shape.

One decode query per request (q [B, Hq, D], bf16) against a paged pool [B*T slots, Hkv, R]
with each request's slots in a table (what a serving pool holds), for every batch × context ×
spec. ``µs`` per call (CUDA: ``triton.testing.do_bench``; CPU: wall clock, Triton's interpreter,
for proving the script on tiny shapes only), ``GB/s`` = K+V bytes read / time (packed bytes for
the kernel, bf16 bytes for SDPA), ``× bf16`` = SDPA µs / kernel µs, ``% bw`` = kernel GB/s over
the device's copy bandwidth (a 1 GiB ``clone()``, read + write, measured in the same run).
Each kernel variant (``--variants``, default ``decode-kernel,baseline``: ``decode-kernel`` is
what a decode call runs, :mod:`kvtuner.attention.decode_kernel` where it serves the spec;
``baseline`` forces the general kernel, which dequantizes every element before ``tl.dot``;
``scale-after-dot`` the general kernel dotting raw codes, scales and zeros per group after it)
is timed at every point of the same run; ``× base`` = baseline µs / variant µs.
``--block-tokens``, ``--num-splits``, ``--num-warps``, ``--num-stages`` and ``--max-registers``
(the decode kernel's register cap; ``none``: the plan's, fitted at a build's first launch;
``255``: ptxas' own limit, no cap; decode-kernel variant only) take several values: every
combination is timed at every point (a tile sweep; the ``tile`` column, ``-`` = default).
``--dtype float16`` runs q (and SDPA's K/V, same bytes as bf16: the ``*_bf16_*`` keys keep
their names) in fp16. ``--specs "KV4 g32 pre-RoPE"`` (and ``"KV8 g64 pre-RoPE"``; not in the
default list) time keys stored pre-RoPE: every K tile rotated forward in the kernel,
element-wise in both variants;
``"KV3 g32"``, ``"KV4 g32 sym"`` and ``"K5V3 had"`` (not in it either) the rows the plans
still tile by the sm_90a build alone (the last: 5-bit Hadamard keys in g64, 84-byte rows, and
3-bit g32 values, a combination the shipped profiles use).
``--layouts rows padded planes`` times each spec's pool in each layout, in one run: ``rows``
(R bytes apart, the default), ``padded`` (each row padded to a multiple of 16 bytes: the same
bytes read, a bigger pool) and ``planes`` (a slot's codes of every head, then their scales and
zeros: :mod:`kvtuner.quant.planes`, not a byte more). Padded rows and planes let 16-byte
copies read the codes of rows whose width is no multiple of 16 (KV4 g128's 68-byte rows load
in 4-byte copies as rows, KV8 g64's 136-byte rows in 8-byte ones): whether copy width, not
bytes, sets those rows' speed.
``--graphs`` times CUDA-graph replays of the kernel's call and of SDPA (what SGLang's
captured decode steps run): at 16 × 8k the kernels may take less time than an eager call's
host work (the SGLang step issued 250-480 µs of it on the H200's host). Before timing, each
spec's kernel output (every variant) is checked against the torch reference (dequantize, then
SDPA) at the smallest shape.

    python benchmarks/attention_decode.py --device cuda --variants decode-kernel,baseline
    python benchmarks/attention_decode.py --device cpu --batch 2 --context 64 --heads 4 \\
        --kv-heads 2 --head-dim 32   # interpreter: proves the script, times nothing useful
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_device import prepare_device

OUT = Path(__file__).parent / "results" / "attention_decode.json"
SPECS = {  # label: (K spec kwargs, V spec kwargs)
    "KV2 g32": (dict(bits=2), dict(bits=2)),
    "KV4 g32": (dict(bits=4), dict(bits=4)),
    "KV8 g64": (dict(bits=8, group_size=64), dict(bits=8, group_size=64)),
    "KV4 g128": (dict(bits=4, group_size=128), dict(bits=4, group_size=128)),  # per token-head
    "KV4 g64": (dict(bits=4, group_size=64), dict(bits=4, group_size=64)),  # two groups a row
    "K8V4 (mixed)": (dict(bits=8, group_size=64), dict(bits=4)),
    "KV4 g32 pre-RoPE": (dict(bits=4, pre_rope=True), dict(bits=4)),  # opt-in from here on
    "KV8 g64 pre-RoPE": (dict(bits=8, group_size=64, pre_rope=True), dict(bits=8, group_size=64)),
    "KV3 g32": (dict(bits=3), dict(bits=3)),  # the plans' other rows: 3/5/6-bit chunks,
    "KV4 g32 sym": (dict(bits=4, symmetric=True), dict(bits=4, symmetric=True)),  # symmetric
    "K5V3 had": (dict(bits=5, group_size=64, rotation="hadamard"), dict(bits=3)),
}
DEFAULT_SPECS = ["KV2 g32", "KV4 g32", "KV8 g64", "KV4 g128", "K8V4 (mixed)"]
VARIANTS = {  # label: the launcher's keywords
    "decode-kernel": dict(),  # the decode kernel (kvtuner.attention.decode_kernel) where it serves
    "baseline": dict(specialized=False, scale_after_dot=False),  # the general kernel
    "scale-after-dot": dict(specialized=False, scale_after_dot=True),
}
DEFAULT_VARIANTS = ["decode-kernel", "baseline"]
LAYOUTS = ("rows", "padded", "planes")  # the pool's, --layouts


def variant_list(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"variants are {','.join(VARIANTS)}, got {text!r}")
    return list(dict.fromkeys(names))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--specs", nargs="+", choices=list(SPECS), default=DEFAULT_SPECS)
    p.add_argument(
        "--variants",
        type=variant_list,
        default=DEFAULT_VARIANTS,
        help="kernel variants timed in one run, comma-separated (default: decode-kernel,baseline)",
    )
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16"],
        default="bfloat16",
        help="q, and SDPA's K/V (float16: codes by the 0x6400 exponent trick)",
    )
    p.add_argument("--heads", type=int, default=32, help="query heads")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    # launch options; several values each: every combination is timed (a tile sweep)
    p.add_argument(
        "--num-splits", type=int, nargs="+", default=[None], help="default: the launcher's choice"
    )
    p.add_argument(
        "--block-tokens", type=int, nargs="+", default=[None], help="default: the launcher's"
    )
    p.add_argument("--num-warps", type=int, nargs="+", default=[None], help="default: Triton's")
    p.add_argument("--num-stages", type=int, nargs="+", default=[None], help="default: Triton's")
    p.add_argument(
        "--max-registers",
        type=lambda s: None if s == "none" else int(s),
        nargs="+",
        default=[None],
        help="the decode kernel's cap on registers a thread (ptxas' maxnreg); none: the "
        "plan's, fitted at a build's first launch; 255: no cap",
    )
    p.add_argument(
        "--layouts",
        nargs="+",
        choices=LAYOUTS,
        default=["rows"],
        help="pool layouts timed in one run: rows (R bytes apart), padded (to 16), planes",
    )
    p.add_argument(
        "--graphs",
        action="store_true",
        help="time CUDA-graph replays of both (what SGLang's decode graphs run: no host work)",
    )
    p.add_argument("--output", type=Path, default=OUT)
    return p.parse_args()


def specs_for(label: str, head_dim: int):
    """(K spec, V spec) of a label; groups capped at head_dim (tiny CPU shapes)."""
    from kvtuner.quant import QuantSpec

    def spec(kw: dict) -> QuantSpec:
        return QuantSpec(**{**kw, "group_size": min(kw.get("group_size", 32), head_dim)})

    return tuple(spec(kw) for kw in SPECS[label])


def random_rows(n: int, kv_heads: int, spec, head_dim: int, device, layout: str = "rows"):
    """Valid packed rows [n, Hkv, R]: random codes, fp16 scales in [0.01, 0.1], zeros in [-1, 0];
    in ``layout`` (:data:`LAYOUTS`: padded, a view of rows :func:`row_stride` bytes apart)."""
    import torch

    from kvtuner.quant.planes import plannable, to_planes

    width = spec.row_bytes(head_dim)
    shape = (n, kv_heads, row_stride(width, layout))  # made on the device: GBs at 64 × 32k
    rows = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)[..., :width]
    if not spec.is_quantized:
        rows.view(torch.float16).normal_()
        return rows
    groups = head_dim // spec.group_size
    meta = torch.rand(n, kv_heads, groups * (1 if spec.symmetric else 2), device=device)
    meta[..., :groups] = meta[..., :groups] * 0.09 + 0.01
    meta[..., groups:] -= 1.0
    rows[..., spec.code_bytes(head_dim) :] = meta.half().view(torch.uint8)
    if layout == "planes" and plannable(spec, head_dim):
        rows = to_planes(rows, spec, head_dim)
    return rows


def row_stride(width: int, layout: str) -> int:
    """Bytes from one row to the next: ``width``, rounded up to a multiple of 16 if padded."""
    return -(-width // 16) * 16 if layout == "padded" else width


def rope_kw(k_spec, head_dim: int, device) -> dict:
    """Pre-RoPE keys: the kernel rotates every K tile (RoPE base 10000 over the full head_dim,
    keys at positions 1000 + t); nothing otherwise."""
    import torch

    if not k_spec.pre_rope:
        return {}
    half = head_dim // 2
    freq = 10000.0 ** -(torch.arange(half, device=device) / half)
    return dict(rope_freq=freq, rope_offset=1000)


def timer(device: str):
    """Seconds per call of a zero-argument function."""
    if device == "cuda":
        import triton.testing

        return lambda f: triton.testing.do_bench(f, warmup=25, rep=100) / 1e3
    return host_seconds


def host_seconds(f, calls: int = 3) -> float:
    """Wall seconds per call, nothing synchronized inside: on a GPU, the host's cost of issuing
    the call (what the device waits for where its own work is shorter); on CPU, the call."""
    f()
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls


def graphed(f):
    """A zero-argument CUDA function captured in a CUDA graph -> its replay (what a server that
    captures its decode step runs: the kernels, no host work)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture: compiles, allocator pools
        for _ in range(3):
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        f()
    return graph.replay


def copy_gbps(device: str, seconds) -> float:
    import torch

    x = torch.empty(1 << 30 if device == "cuda" else 1 << 24, dtype=torch.uint8, device=device)
    return 2 * x.numel() / seconds(lambda: x.clone()) / 1e9


def check(args, k_spec, v_spec, variant: str, layout: str = "rows") -> float:
    """Max |fused - reference| at batch 2 × 100 tokens (ragged), q in ``--dtype``, the pool in
    ``layout``."""
    import torch

    from kvtuner.attention import decode_attention, decode_attention_reference

    torch.manual_seed(0)
    dev, d = args.device, args.head_dim
    k_rows = random_rows(200, args.kv_heads, k_spec, d, dev, layout)
    v_rows = random_rows(200, args.kv_heads, v_spec, d, dev, layout)
    table = torch.randperm(200, device=dev).view(2, 100).to(torch.int32)
    lengths = torch.tensor([100, 37], dtype=torch.int32, device=dev)
    q = torch.randn(2, args.heads, d, device=dev, dtype=getattr(torch, args.dtype))
    kw = dict(
        lengths=lengths, slot_table=table, planes=layout == "planes", **rope_kw(k_spec, d, dev)
    )
    got = decode_attention(q, k_rows, v_rows, k_spec, v_spec, **kw, **VARIANTS[variant]).float()
    ref = decode_attention_reference(q, k_rows, v_rows, k_spec, v_spec, **kw).float()
    return (got - ref).abs().max().item()


def after_dot_operands(k_spec, v_spec) -> str:
    """Which of K and V the scale-after-dot variant reads that way (the rest element-wise)."""
    from kvtuner.attention.after_dot import takes_after_dot

    pairs = (("K", k_spec), ("V", v_spec))  # pre-RoPE keys: element-wise (rotated per tile)
    names = [n for n, s in pairs if takes_after_dot(s, True) and not (n == "K" and s.pre_rope)]
    return "+".join(names) or "none"


def measure(args, seconds, batch: int, context: int, label: str) -> list[dict]:
    """One row per layout and variant: the kernel's time at this point, and bf16 SDPA's
    (shared)."""
    import torch
    import torch.nn.functional as F

    k_spec, v_spec = specs_for(label, args.head_dim)
    dev, d, hkv = args.device, args.head_dim, args.kv_heads
    n = batch * context
    table = torch.arange(n, dtype=torch.int32, device=dev).view(batch, context)
    lengths = torch.full((batch,), context, dtype=torch.int32, device=dev)
    dtype = getattr(torch, args.dtype)
    q = torch.randn(batch, args.heads, d, device=dev, dtype=dtype)
    kw = dict(lengths=lengths, slot_table=table, **rope_kw(k_spec, d, dev))
    fused = {}
    for layout in args.layouts:
        rows = [random_rows(n, hkv, s, d, dev, layout) for s in (k_spec, v_spec)]
        planes = dict(kw, planes=layout == "planes")
        fused.update(time_variants(args, seconds, label, q, rows, (k_spec, v_spec), planes,
                                   layout))  # fmt: skip
        del rows  # GBs at 64 × 32k: gone before the next layout's
    k, v = (torch.randn(batch, hkv, context, d, device=dev, dtype=dtype) for _ in "kv")
    q4 = q.unsqueeze(2)
    sdpa = seconds(lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True))
    packed_bytes = n * hkv * (k_spec.row_bytes(d) + v_spec.row_bytes(d))
    bf16_bytes = n * hkv * d * 2 * 2
    return [
        {
            "batch": batch,
            "context": context,
            "spec": label,
            "variant": name,
            **dict(zip(LAUNCH, launch, strict=True)),
            "layout": layout,
            "row_strides": [row_stride(s.row_bytes(d), layout) for s in (k_spec, v_spec)],
            "after_dot": after_dot_operands(k_spec, v_spec)
            if VARIANTS[name].get("scale_after_dot")
            else "none",
            "fused_us": t * 1e6,
            "fused_gbps": packed_bytes / t / 1e9,
            "sdpa_bf16_us": sdpa * 1e6,
            "sdpa_bf16_gbps": bf16_bytes / sdpa / 1e9,
            "speedup_vs_bf16": sdpa / t,
            "speedup_vs_baseline": _over(fused.get((layout, "baseline", *launch)), t),
            "packed_bytes": packed_bytes,
            "bf16_bytes": bf16_bytes,
        }
        for (layout, name, *launch), t in fused.items()
    ]


def time_variants(args, seconds, label, q, rows, specs, kw, layout) -> dict:
    """(layout, variant, *launch) -> seconds a call, over every launch of the grid."""
    from triton.runtime.errors import OutOfResources

    from kvtuner.attention import decode_attention

    out = {}
    for launch, name in itertools.product(launch_grid(args), args.variants):
        if launch[LAUNCH.index("max_registers")] and name != "decode-kernel":
            continue  # a register cap is the decode kernel's alone
        call = lambda variant=VARIANTS[name], launch=launch: decode_attention(  # noqa: E731
            q, *rows, *specs, **kw, **dict(zip(LAUNCH, launch, strict=True)), **variant
        )
        try:
            out[(layout, name, *launch)] = seconds(call)
        except OutOfResources as exc:  # a sweep's tile too big for the device: the rest go on
            print(f"skipped {label} {name} {launch}: {exc}", flush=True)
    return out


LAUNCH = ("block_tokens", "num_splits", "num_warps", "num_stages", "max_registers")


def _over(base: float | None, t: float) -> float | None:
    """baseline µs / variant µs at the same launch; None where the baseline was not timed."""
    return None if base is None else base / t


def launch_grid(args) -> list[tuple]:
    """Every combination of the launch options given (one, by default)."""
    return list(itertools.product(*(getattr(args, name) for name in LAUNCH)))


def table(rows: list[dict], bandwidth: float) -> str:
    lines = [
        "| batch × context | spec | variant | tile | fused µs (GB/s) | % bw | SDPA µs (GB/s) "
        "| × bf16 | × base |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        base = r["speedup_vs_baseline"]
        tile = "/".join("-" if r[k] is None else str(r[k]) for k in LAUNCH)
        lines.append(
            f"| {r['batch']} × {r['context']} | {_spec_cell(r)} | {r['variant']} | {tile} | "
            f"{r['fused_us']:.1f} ({r['fused_gbps']:.0f}) | {100 * r['fused_gbps'] / bandwidth:.0f}"
            f" | {r['sdpa_bf16_us']:.1f} ({r['sdpa_bf16_gbps']:.0f}) | "
            f"{r['speedup_vs_bf16']:.2f} | {'-' if base is None else f'{base:.2f}'} |"
        )
    return "\n".join(lines)


def _spec_cell(row: dict) -> str:
    """The spec, and its pool's layout where not rows (``KV4 g128 (padded: 80/80 B rows)``)."""
    if row["layout"] == "padded":
        return f"{row['spec']} (padded: {'/'.join(map(str, row['row_strides']))} B rows)"
    return row["spec"] if row["layout"] == "rows" else f"{row['spec']} ({row['layout']})"


def hardware(device: str, bandwidth: float) -> dict:
    import torch

    info = {"device": device, "torch": torch.__version__, "copy_gbps": round(bandwidth, 1)}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    else:
        info.update(cores=os.cpu_count(), torch_threads=torch.get_num_threads(), interpreter=True)
    return info


def main() -> None:
    args = parse_args()
    prepare_device(args.device)

    from kvtuner.profile import write_json_atomic

    if args.graphs and args.device != "cuda":
        print("error: --graphs times CUDA-graph replays: it needs --device cuda", file=sys.stderr)
        sys.exit(2)
    eager = timer(args.device)
    bandwidth = copy_gbps(args.device, eager)
    seconds = (lambda f: eager(graphed(f))) if args.graphs else eager
    try:
        errors = {
            s: {
                f"{v} {lay}" if lay != "rows" else v: check(
                    args, *specs_for(s, args.head_dim), v, lay
                )
                for v in args.variants
                for lay in args.layouts
            }
            for s in args.specs
        }
        print(f"max |fused - reference| ({args.dtype} q):",
              {s: {v: f"{e:.2e}" for v, e in by.items()} for s, by in errors.items()})  # fmt: skip
        grid = [(b, c, s) for b in args.batch for c in args.context for s in args.specs]
        rows = []
        for point in grid:  # each point printed as it lands: a time limit keeps what is done
            new_rows = measure(args, seconds, *point)
            rows += new_rows
            print(table(new_rows, bandwidth), flush=True)
    except ValueError as exc:  # shapes the kernel refuses: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    info = {**hardware(args.device, bandwidth), "variants": args.variants, "dtype": args.dtype,
            "graphs": args.graphs}  # fmt: skip
    print(info)
    print(table(rows, bandwidth))
    command = " ".join(["python", "benchmarks/attention_decode.py", *sys.argv[1:]])
    write_json_atomic(args.output, {"hardware": info, "created": datetime.now(UTC).isoformat(),
                                    "command": command, "check_max_abs_err": errors,
                                    "results": rows})  # fmt: skip
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
