"""Fused decode attention over packed KV vs torch SDPA over the bf16 cache of the same shape.

One decode query per request (q [B, Hq, D], bf16) against a paged pool [B*T slots, Hkv, R]
with each request's slots in a table (what a serving pool holds), for every batch × context ×
spec. ``µs`` per call (CUDA: ``triton.testing.do_bench``; CPU: wall clock, Triton's interpreter,
for proving the script on tiny shapes only), ``GB/s`` = K+V bytes read / time (packed bytes for
the kernel, bf16 bytes for SDPA), ``× bf16`` = SDPA µs / kernel µs, ``% bw`` = kernel GB/s over
the device's copy bandwidth (a 1 GiB ``clone()``, read + write, measured in the same run).
Before timing, each spec's kernel output is checked against the torch reference (dequantize,
then SDPA) at the smallest shape.

    python benchmarks/attention_decode.py --device cuda
    python benchmarks/attention_decode.py --device cpu --batch 2 --context 64 --heads 4 \\
        --kv-heads 2 --head-dim 32   # interpreter: proves the script, times nothing useful
"""

from __future__ import annotations

import argparse
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
    "K8V4 (mixed)": (dict(bits=8, group_size=64), dict(bits=4)),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--specs", nargs="+", choices=list(SPECS), default=list(SPECS))
    p.add_argument("--heads", type=int, default=32, help="query heads")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--num-splits", type=int, default=None, help="default: the launcher's choice")
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--output", type=Path, default=OUT)
    return p.parse_args()


def specs_for(label: str, head_dim: int):
    """(K spec, V spec) of a label; groups capped at head_dim (tiny CPU shapes)."""
    from kvtuner.quant import QuantSpec

    def spec(kw: dict) -> QuantSpec:
        return QuantSpec(**{**kw, "group_size": min(kw.get("group_size", 32), head_dim)})

    return tuple(spec(kw) for kw in SPECS[label])


def random_rows(n: int, kv_heads: int, spec, head_dim: int, device):
    """Valid packed rows [n, Hkv, R]: random codes, fp16 scales in [0.01, 0.1], zeros in [-1, 0]."""
    import torch

    rows = torch.randint(0, 256, (n, kv_heads, spec.row_bytes(head_dim)), dtype=torch.uint8)
    rows = rows.to(device)
    if not spec.is_quantized:
        rows.view(torch.float16).normal_()
        return rows
    groups = head_dim // spec.group_size
    meta = torch.rand(n, kv_heads, groups * (1 if spec.symmetric else 2), device=device)
    meta[..., :groups] = meta[..., :groups] * 0.09 + 0.01
    meta[..., groups:] -= 1.0
    rows[..., spec.code_bytes(head_dim) :] = meta.half().view(torch.uint8)
    return rows


def timer(device: str):
    """Seconds per call of a zero-argument function."""
    if device == "cuda":
        import triton.testing

        return lambda f: triton.testing.do_bench(f, warmup=25, rep=100) / 1e3

    def wall(f, calls: int = 3) -> float:
        f()
        start = time.perf_counter()
        for _ in range(calls):
            f()
        return (time.perf_counter() - start) / calls

    return wall


def copy_gbps(device: str, seconds) -> float:
    import torch

    x = torch.empty(1 << 30 if device == "cuda" else 1 << 24, dtype=torch.uint8, device=device)
    return 2 * x.numel() / seconds(lambda: x.clone()) / 1e9


def check(args, k_spec, v_spec) -> float:
    """Max |fused - reference| at batch 2 × 100 tokens (ragged), bf16 q."""
    import torch

    from kvtuner.attention import decode_attention, decode_attention_reference

    torch.manual_seed(0)
    dev, d = args.device, args.head_dim
    k_rows = random_rows(200, args.kv_heads, k_spec, d, dev)
    v_rows = random_rows(200, args.kv_heads, v_spec, d, dev)
    table = torch.randperm(200, device=dev).view(2, 100).to(torch.int32)
    lengths = torch.tensor([100, 37], dtype=torch.int32, device=dev)
    q = torch.randn(2, args.heads, d, device=dev, dtype=torch.bfloat16)
    kw = dict(lengths=lengths, slot_table=table)
    got = decode_attention(q, k_rows, v_rows, k_spec, v_spec, **kw).float()
    ref = decode_attention_reference(q, k_rows, v_rows, k_spec, v_spec, **kw).float()
    return (got - ref).abs().max().item()


def measure(args, seconds, batch: int, context: int, label: str) -> dict:
    import torch
    import torch.nn.functional as F

    from kvtuner.attention import decode_attention

    k_spec, v_spec = specs_for(label, args.head_dim)
    dev, d, hkv = args.device, args.head_dim, args.kv_heads
    n = batch * context
    k_rows, v_rows = (random_rows(n, hkv, s, d, dev) for s in (k_spec, v_spec))
    table = torch.arange(n, dtype=torch.int32, device=dev).view(batch, context)
    lengths = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, args.heads, d, device=dev, dtype=torch.bfloat16)
    kw = dict(lengths=lengths, slot_table=table, num_splits=args.num_splits,
              block_tokens=args.block_tokens)  # fmt: skip
    fused = seconds(lambda: decode_attention(q, k_rows, v_rows, k_spec, v_spec, **kw))
    k, v = (torch.randn(batch, hkv, context, d, device=dev, dtype=torch.bfloat16) for _ in "kv")
    q4 = q.unsqueeze(2)
    sdpa = seconds(lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True))
    packed_bytes = n * hkv * (k_spec.row_bytes(d) + v_spec.row_bytes(d))
    bf16_bytes = n * hkv * d * 2 * 2
    return {
        "batch": batch,
        "context": context,
        "spec": label,
        "fused_us": fused * 1e6,
        "fused_gbps": packed_bytes / fused / 1e9,
        "sdpa_bf16_us": sdpa * 1e6,
        "sdpa_bf16_gbps": bf16_bytes / sdpa / 1e9,
        "speedup_vs_bf16": sdpa / fused,
        "packed_bytes": packed_bytes,
        "bf16_bytes": bf16_bytes,
    }


def table(rows: list[dict], bandwidth: float) -> str:
    lines = [
        "| batch × context | spec | fused µs (GB/s) | % bw | bf16 SDPA µs (GB/s) | × bf16 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} × {r['context']} | {r['spec']} | {r['fused_us']:.1f} "
            f"({r['fused_gbps']:.0f}) | {100 * r['fused_gbps'] / bandwidth:.0f} | "
            f"{r['sdpa_bf16_us']:.1f} ({r['sdpa_bf16_gbps']:.0f}) | {r['speedup_vs_bf16']:.2f} |"
        )
    return "\n".join(lines)


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

    seconds = timer(args.device)
    bandwidth = copy_gbps(args.device, seconds)
    try:
        errors = {s: check(args, *specs_for(s, args.head_dim)) for s in args.specs}
        print("max |fused - reference| (bf16 q):", {s: f"{e:.2e}" for s, e in errors.items()})
        grid = [(b, c, s) for b in args.batch for c in args.context for s in args.specs]
        rows = [measure(args, seconds, *point) for point in grid]
    except ValueError as exc:  # shapes the kernel refuses: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    info = hardware(args.device, bandwidth)
    print(info)
    print(table(rows, bandwidth))
    command = " ".join(["python", "benchmarks/attention_decode.py", *sys.argv[1:]])
    write_json_atomic(args.output, {"hardware": info, "created": datetime.now(UTC).isoformat(),
                                    "command": command, "check_max_abs_err": errors,
                                    "results": rows})  # fmt: skip
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
