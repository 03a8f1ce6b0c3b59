"""The kvtuner SGLang attention backend's decode and extend steps, without the server.

What ``KVTunerAttnBackend.forward_decode`` / ``forward_extend`` launch per layer (the fused
kernels over one layer's packed rows, indexed by :class:`PackedMetadata` built from SGLang's
``req_to_token [rows, W]`` int32, ``req_pool_indices`` and ``seq_lens``), on a pool laid out as
``KVTunerMHATokenToKVPool`` lays it out on a GPU (``[slots + 1, Hkv, R]`` uint8, slot 0 the
padding slot, each request's slots scattered; a layer as planes where they align its codes,
``kvtuner.quant.planes.layer_planes``). With sglang importable the ``req_to_token`` tensor is
SGLang's own ``ReqToTokenPool``; the GPU machine has no sglang, so there it is the same layout
built with torch. Baselines over the same tokens, same run: bf16 SDPA over contiguous K/V, and
the retired CUDA read (``gather_dequantized`` of the batch's slots, then SDPA). Extend: each
request adds ``--new-tokens`` (odd requests half as many: a ragged batch), attended causally.
``host µs``: the host's time to issue one kvtuner step (metadata, checks, launches; nothing
synchronized), which bounds an eager step where the kernels are shorter. ``graphs``: decode
steps captured in CUDA graphs and replayed, kvtuner's and bf16 SDPA's, as SGLang serves decode
(CUDA only).

    python benchmarks/sglang_backend_step.py --device cuda
    python benchmarks/sglang_backend_step.py --device cpu --smoke   # proves the script only
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from datetime import UTC, datetime
from pathlib import Path

from attention_decode import (
    copy_gbps,
    graphed,
    hardware,
    host_seconds,
    random_rows,
    specs_for,
    timer,
)
from bench_device import prepare_device

OUT = Path(__file__).parent / "results" / "sglang_backend_step.json"
LAUNCH = ("query_rows", "block_tokens", "num_warps", "num_stages")  # None: the plans' own


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--new-tokens", type=int, default=128, help="extend: new tokens per request")
    p.add_argument("--specs", nargs="+", default=["KV4 g32", "KV8 g64", "K8V4 (mixed)"])
    p.add_argument("--modes", nargs="+", choices=["decode", "extend"], default=["decode", "extend"])
    for name in LAUNCH:  # several values each: every combination timed (a sweep; extend for rows)
        p.add_argument(f"--{name.replace('_', '-')}", type=int, nargs="+", default=[None])
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    args.heads, args.kv_heads, args.head_dim = (4, 2, 32) if args.smoke else (32, 8, 128)
    if args.smoke:
        args.batch, args.context, args.new_tokens, args.specs = [2], [48], 5, ["KV4 g32"]
    return args


def req_to_token(rows: int, width: int, device: str):
    """SGLang's ReqToTokenPool tensor when sglang is installed, else the same layout."""
    import torch

    try:
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    except ImportError:
        return torch.zeros(rows + 1, width, dtype=torch.int32, device=device), "torch"
    return ReqToTokenPool(rows, width, device, False).req_to_token, "sglang"


def paged_batch(args, batch: int, context: int, new: list[int]):
    """(req_to_token, req_pool_indices, seq_lens int64, its source): scattered slots 1.."""
    import torch

    totals = [context + n for n in new]
    table, source = req_to_token(batch + 1, max(totals), args.device)
    slots = torch.randperm(sum(totals), device=args.device) + 1
    rows = torch.randperm(batch, device=args.device) + 1  # not in order, as SGLang's are
    used = 0
    for b, n in enumerate(totals):
        table[rows[b], :n] = slots[used : used + n].int()
        used += n
    return table, rows, torch.tensor(totals, device=args.device), source


def measure(args, seconds, batch: int, context: int, label: str, mode: str) -> list[dict]:
    """One row a launch of the grid (``--query-rows`` ...: one, the plans', by default)."""
    import torch
    import torch.nn.functional as F
    from triton.runtime.errors import OutOfResources

    from kvtuner.attention import decode_attention, extend_attention
    from kvtuner.quant import gather_dequantized
    from kvtuner.quant.planes import layer_planes
    from kvtuner.runtime_loader.sglang.cuda.packed_metadata import PackedMetadata

    k_spec, v_spec = specs_for(label, args.head_dim)
    dev, d, hkv, hq = args.device, args.head_dim, args.kv_heads, args.heads
    new = (
        [1] * batch
        if mode == "decode"
        else [max(1, args.new_tokens >> (b % 2)) for b in range(batch)]
    )
    table, rows, seq_lens, source = paged_batch(args, batch, context - 1, new)
    n_slots = int(seq_lens.sum()) + 1
    sides = layer_planes(k_spec, v_spec, d, hkv)  # as the pool lays the layer out
    k_rows, v_rows = (random_rows(n_slots, hkv, s, d, dev, "planes" if p else "rows")
                      for s, p in zip((k_spec, v_spec), sides, strict=True))  # fmt: skip
    planes = any(sides)
    q = torch.randn(sum(new), hq, d, device=dev, dtype=torch.bfloat16)
    new_t = torch.tensor(new, device=dev)
    specs = (k_rows, v_rows, k_spec, v_spec)
    k_new, v_new = (torch.randn(sum(new), hkv, d, device=dev, dtype=torch.bfloat16) for _ in "kv")

    def kvtuner_step(launch: dict):  # extend: the new tokens in hand, as the backend passes them
        if mode == "decode":
            md = PackedMetadata.decode(seq_lens, rows, table)
            return decode_attention(q, *specs, **md.kernel_args(), planes=planes, **launch)
        md = PackedMetadata.extend(seq_lens, rows, table, hkv, new_t, max(new))
        return extend_attention(q, *specs, k_new=k_new, v_new=v_new, **md.kernel_args(),
                                planes=planes, **launch)  # fmt: skip

    total = int(seq_lens.max())
    k, v = (torch.randn(batch, hkv, total, d, device=dev, dtype=torch.bfloat16) for _ in "kv")
    q4 = torch.randn(batch, hq, max(new), d, device=dev, dtype=torch.bfloat16)
    mask = (
        torch.arange(total, device=dev)[None, :]
        <= (total - max(new) + torch.arange(max(new), device=dev))[:, None]
    )

    def sdpa(kk, vv):  # bf16 over each request's tokens, padded to the longest
        return F.scaled_dot_product_attention(q4, kk, vv, attn_mask=mask, enable_gqa=True)

    every = table[rows.long()][:, :total].reshape(-1)

    def retired_step():  # the scratch read SGLang used on CUDA before the backend
        kk = gather_dequantized(k_rows, every, k_spec, d, torch.bfloat16, planes=sides[0])
        vv = gather_dequantized(v_rows, every, v_spec, d, torch.bfloat16, planes=sides[1])
        shape = (batch, total, hkv, d)
        return sdpa(kk.view(shape).transpose(1, 2), vv.view(shape).transpose(1, 2))

    tokens = int(seq_lens.sum())
    packed_bytes = tokens * hkv * (k_spec.row_bytes(d) + v_spec.row_bytes(d))
    bf16, retired = seconds(lambda: sdpa(k, v)), seconds(retired_step)
    in_graphs = mode == "decode" and dev == "cuda"  # SGLang captures its decode steps
    bf16_graph = seconds(graphed(lambda: sdpa(k, v))) if in_graphs else None
    calls = 20 if dev == "cuda" else 1  # issuing a step: metadata, checks, launches
    out = []
    for values in itertools.product(*(getattr(args, name) for name in LAUNCH)):
        launch = {k: v for k, v in zip(LAUNCH, values, strict=True) if v is not None}
        if mode == "decode":
            launch.pop("query_rows", None)  # the decode kernel's rows are the query heads
        step = functools.partial(kvtuner_step, launch)
        try:
            t = seconds(step)
        except OutOfResources as exc:  # a sweep's tile too big for the device: the rest go on
            print(f"skipped {mode} {label} {launch}: {exc}", flush=True)
            continue
        host = host_seconds(step, calls=calls)
        graph = seconds(graphed(step)) if in_graphs else None
        out.append({
            "mode": mode, "batch": batch, "context": context, "new_tokens": new, "spec": label,
            "req_to_token": source, "launch": launch, "planes": planes,
            "packed_bytes": packed_bytes,
            "bf16_bytes": tokens * hkv * d * 4, "kvtuner_us": t * 1e6,
            "kvtuner_host_us": host * 1e6, "bf16_sdpa_us": bf16 * 1e6,
            "dequant_sdpa_us": retired * 1e6, "kvtuner_gbps": packed_bytes / t / 1e9,
            "x_bf16": bf16 / t, "x_dequant_sdpa": retired / t,
            "kvtuner_graph_us": graph and graph * 1e6,
            "bf16_sdpa_graph_us": bf16_graph and bf16_graph * 1e6,
            "x_bf16_graph": graph and bf16_graph / graph,
        })  # fmt: skip
        print(table_md(out[-1:]), flush=True)  # a time limit keeps what is done
    return out


def table_md(rows: list[dict]) -> str:
    lines = [
        "| step | batch × context | spec | launch | kvtuner µs (GB/s) | host µs | bf16 SDPA µs | "
        "× bf16 | graphs: kvtuner µs | bf16 µs | × bf16 | dequant+SDPA µs | × dequant+SDPA |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        graphs = [_cell(r[key], digits) for key, digits in GRAPH_CELLS]
        lines.append(
            f"| {r['mode']} | {r['batch']} × {r['context']} | {r['spec']} | "
            f"{'/'.join(f'{k[0]}{v}' for k, v in r['launch'].items()) or '-'} | "
            f"{r['kvtuner_us']:.1f} ({r['kvtuner_gbps']:.1f}) | {r['kvtuner_host_us']:.1f} | "
            f"{r['bf16_sdpa_us']:.1f} | {r['x_bf16']:.2f} | {' | '.join(graphs)} | "
            f"{r['dequant_sdpa_us']:.1f} | {r['x_dequant_sdpa']:.2f} |"
        )
    return "\n".join(lines)


GRAPH_CELLS = (("kvtuner_graph_us", 1), ("bf16_sdpa_graph_us", 1), ("x_bf16_graph", 2))


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    args = parse_args()
    prepare_device(args.device)

    from kvtuner.profile import write_json_atomic

    seconds = timer(args.device)
    bandwidth = copy_gbps(args.device, seconds)
    grid = [(b, c, s, m) for m in args.modes for b in args.batch
            for c in args.context for s in args.specs]  # fmt: skip
    try:
        rows = [row for point in grid for row in measure(args, seconds, *point)]
    except (ValueError, KeyError) as exc:  # shapes or specs refused: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    info = {**hardware(args.device, bandwidth), "smoke": args.smoke}
    print(info)
    print(table_md(rows))
    command = " ".join(["python", "benchmarks/sglang_backend_step.py", *sys.argv[1:]])
    write_json_atomic(args.output, {"hardware": info, "created": datetime.now(UTC).isoformat(),
                                    "command": command, "rows": rows})  # fmt: skip
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
