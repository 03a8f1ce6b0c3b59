"""Pack + unpack throughput of the torch reference quantizer on CPU, next to clone().

GB/s = bytes of the input tensor / wall time per call (torch.utils.benchmark). ``pack`` is
``quantize(x)``, ``unpack`` is ``dequantize(rows, dtype=x.dtype)`` (``unpack µs``: one call);
``ratio`` = pack+unpack GB/s over clone() GB/s of the same tensor, measured in alternating rounds
of the same run (CPU speed on a shared machine swings 2-7x). Columns: median over rounds, and
``best`` (fastest round). Specs: 2/4/8 bits (both grids), then 3 bits, channel-axis 4 bits
(x [T, H, D] read as [H, T, D]) and Hadamard-rotated 4 bits. ``--shape 544 3 64`` is one layer's
K (or V) history of the decode benchmark, what packed decode dequantizes per layer and step.

    python benchmarks/quant_throughput.py [--threads N] [--shape 4096 3 64]

Kernel mode (``--device cuda``, or ``--kernels`` on the CPU under Triton's interpreter): the
Triton pool kernels, pack = ``triton_scatter_quantized`` into a slot pool, unpack =
``triton_gather_dequantized`` to bf16, each beside ``clone()`` of the same bf16 tensor
(ratio = clone time / kernel time; CUDA times from ``triton.testing.do_bench``, median), at
[262144, 8, 128], [65536, 8, 128] and the decode size [64, 8, 128] (µs per call; at decode
sizes every call replayed in a CUDA graph, ``do_bench_cudagraph``, as a decode step replays
its write, and also a write's K and V: ``triton_scatter_kv``'s one launch against a launch a
side);
rows of one scale a token-head (68 bytes) and of 8-bit g64 (136) also as planes
(``kvtuner.quant.planes``: their codes stored and loaded 16 bytes at a time):

    python benchmarks/quant_throughput.py --device cuda
    python benchmarks/quant_throughput.py --kernels --shape 64 8 128   (CPU: proves it runs)

``--plans`` times each launch plan of ``POOL_PLANS`` (rows a block × warps, a whole row a
thread, row blocks a program × pipeline stages) on ``PLAN_SPECS`` instead, at the first shape
(262 144 tokens unless ``--shape``): the sweep behind ``plan_pool``'s choices.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch
from bench_device import prepare_device
from torch.utils.benchmark import Timer

from kvtuner.profile import write_json_atomic
from kvtuner.quant import QuantSpec, dequantize, quantize

OUT = Path(__file__).parent / "results" / "quant_throughput.json"
SPECS = (  # 2/4/8 bits both grids, then the search presets' other shapes
    *(QuantSpec(bits, 32, symmetric) for bits in (2, 4, 8) for symmetric in (False, True)),
    QuantSpec(3, 32),
    QuantSpec(4, 32, axis="channel"),
    QuantSpec(4, 32, rotation="hadamard"),
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def seconds(stmt, min_run_time: float) -> float:
    """Median seconds of one call of ``stmt`` (a zero-argument callable)."""
    return Timer("f()", globals={"f": stmt}).blocked_autorange(min_run_time=min_run_time).median


def interleaved(stmts: dict, rounds: int, min_run_time: float) -> dict[str, list[float]]:
    """Seconds per call of each statement, measured in alternating rounds so that the load
    from other processes on this shared machine hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in stmts}
    for _ in range(rounds):
        for name, stmt in stmts.items():
            times[name].append(seconds(stmt, min_run_time / rounds))
    return times


def measure(x: torch.Tensor, spec: QuantSpec, rounds: int, min_run_time: float) -> dict:
    gb = x.numel() * x.element_size() / 1e9
    rows = quantize(x, spec)
    head_dim = x.shape[-1]
    t = interleaved(
        {
            "clone": lambda: x.clone(),
            "pack": lambda: quantize(x, spec),
            "unpack": lambda: dequantize(rows, spec, head_dim, x.dtype),
        },
        rounds,
        min_run_time,
    )
    med = {k: statistics.median(v) for k, v in t.items()}
    best = {k: min(v) for k, v in t.items()}
    return {
        "dtype": str(x.dtype).replace("torch.", ""),
        "spec": spec.short(),
        "packed_bytes": rows.numel(),
        "pack_gbps": gb / med["pack"],
        "unpack_gbps": gb / med["unpack"],
        "unpack_us": 1e6 * med["unpack"],
        "pack_unpack_gbps": gb / (med["pack"] + med["unpack"]),
        "clone_gbps": gb / med["clone"],
        "ratio_to_clone": med["clone"] / (med["pack"] + med["unpack"]),
        "best_pack_unpack_gbps": gb / (best["pack"] + best["unpack"]),
        "best_clone_gbps": gb / best["clone"],
        "best_ratio_to_clone": best["clone"] / (best["pack"] + best["unpack"]),
    }


KERNEL_SPECS = (  # the table, then one scale a token-head; (spec, as planes)
    *((spec, False) for spec in (QuantSpec(4, 32), QuantSpec(4, 64), QuantSpec(2, 32))),
    (QuantSpec(8, 64), False),
    (QuantSpec(3, 32), False),
    (QuantSpec(4, 32, rotation="hadamard"), False),
    (QuantSpec(4, 128), False),
    (QuantSpec(4, 128), True),
    (QuantSpec(8, 64), True),
)
KERNEL_SHAPES = ((262144, 8, 128), (65536, 8, 128), (64, 8, 128))
# up to this many tokens (decode sizes) a row also times a write's K and V, and every call is
# timed replayed in a CUDA graph: eagerly, the host's launch was the call's time (the H200's
# 64-token rows, 2026-11-26: unpack 5-25 µs, pack 8-20, clone 4.3-4.8)
KV_TOKENS = 4096
PLAN_SPECS = (QuantSpec(4, 32), QuantSpec(8, 64), QuantSpec(4, 32, rotation="hadamard"))
# label: PoolPlan fields (block_rows, num_warps, whole_rows, blocks, stages), for pack and unpack;
# 32x1 / 32x4 / 16x4: the plans timed (pack, unpack, Hadamard pack before the loop); 16x1:
# pack at 21 programs an SM, not 12 (sm_90a, Triton 3.6, KV4 g32: 96 registers against 164,
# 60.8 instructions a row against 53.8; it took the place of 32x4 in a loop, whose KV8 g64
# pack spilled)
POOL_PLANS = {
    "32x1": (32, 1, False, 1, 1),
    "32x4": (32, 4, False, 1, 1),
    "16x4": (16, 4, False, 1, 1),
    "16x1": (16, 1, False, 1, 1),
    "32x1 whole": (32, 1, True, 1, 1),
    "32x1 loop 8x3": (32, 1, False, 8, 3),
    "32x1 whole loop 8x3": (32, 1, True, 8, 3),
}


def kernel_seconds(fn, device: torch.device, graph: bool = False) -> float:
    """Seconds a call of ``fn``: CUDA, median of ``do_bench`` (``graph``: of calls replayed in
    a CUDA graph, no host launch in the time, as a decode step replays its writes)."""
    if device.type == "cuda":
        from triton.testing import do_bench, do_bench_cudagraph

        if graph:
            return do_bench_cudagraph(fn, rep=100, return_mode="median") / 1e3
        return do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3
    return seconds(fn, 0.2)


def measure_kernels(
    shape: tuple[int, int, int],
    spec: QuantSpec,
    device: torch.device,
    plan: str | None = None,
    planes: bool = False,
) -> dict:
    """One row: clone, pack and unpack of ``shape`` at ``spec`` (``planes``: the pool laid out
    as planes), the kernels at :data:`POOL_PLANS` ``[plan]`` (None: the launchers' own)."""
    from kvtuner.quant.triton_kernels import (
        PoolPlan,
        triton_gather_dequantized,
        triton_scatter_kv,
        triton_scatter_quantized,
    )

    n, heads, d = shape
    x = torch.randn(*shape, device=device, dtype=torch.bfloat16)
    loc = torch.randperm(n, device=device)  # a pool's slots are scattered
    buf = torch.empty(n, heads, spec.row_bytes(d), dtype=torch.uint8, device=device)
    pool_plan = PoolPlan(*POOL_PLANS[plan]) if plan else None
    stmts = {
        "clone": x.clone,
        "pack": lambda: triton_scatter_quantized(buf, loc, x, spec, plan=pool_plan, planes=planes),
        "unpack": lambda: triton_gather_dequantized(
            buf, loc, spec, d, torch.bfloat16, plan=pool_plan, planes=planes
        ),
    }
    if plan is None and n <= KV_TOKENS:  # a write's K and V: one launch, or a launch a side
        v, v_buf = torch.randn_like(x), torch.empty_like(buf)
        stmts["pack_sides"] = lambda: (stmts["pack"](), triton_scatter_quantized(
            v_buf, loc, v, spec, planes=planes))  # fmt: skip
        stmts["pack_kv"] = lambda: triton_scatter_kv(
            buf, v_buf, loc, x, v, spec, spec, planes=(planes, planes)
        )
    stmts["pack"]()
    graph = n <= KV_TOKENS  # decode sizes: an eager launch's host time would be the call's
    t = {name: kernel_seconds(fn, device, graph) for name, fn in stmts.items()}
    kv = {}
    if "pack_kv" in t:
        kv = {"pack_kv_us": 1e6 * t["pack_kv"], "pack_sides_us": 1e6 * t["pack_sides"]}
    return {
        "shape": list(shape),
        "spec": spec.short() + (" planes" if planes else ""),
        "plan": plan or "default",
        "clone_us": 1e6 * t["clone"],
        "pack_us": 1e6 * t["pack"],
        "unpack_us": 1e6 * t["unpack"],
        "timing": "cuda graph" if graph and device.type == "cuda" else "eager",
        "clone_gbps": 2 * x.numel() * x.element_size() / t["clone"] / 1e9,  # read + write
        "pack_ratio": t["clone"] / t["pack"],
        "unpack_ratio": t["clone"] / t["unpack"],
        **kv,
    }


def kernel_table(results: list[dict]) -> str:
    lines = [
        "| shape | spec | plan | pack ratio | unpack ratio | pack µs | unpack µs | clone µs "
        "| clone GB/s | K+V µs: one launch / a launch a side |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        kv = f"{r['pack_kv_us']:.1f} / {r['pack_sides_us']:.1f}" if "pack_kv_us" in r else "-"
        lines.append(
            f"| {r['shape']} | {r['spec']} | {r['plan']} | {r['pack_ratio']:.2f} | "
            f"{r['unpack_ratio']:.2f} | "
            f"{r['pack_us']:.1f} | {r['unpack_us']:.1f} | {r['clone_us']:.1f} | "
            f"{r['clone_gbps']:.0f} | {kv} |"
        )
    return "\n".join(lines)


def run_kernels(args: argparse.Namespace) -> None:
    device = torch.device(args.device if args.device != "auto" else "cuda")
    prepare_device(device.type)  # CPU: the interpreter, before triton is first imported
    shapes = [tuple(args.shape)] if args.shape_given else KERNEL_SHAPES
    torch.manual_seed(0)
    if args.plans:  # every plan of POOL_PLANS on PLAN_SPECS, at the first shape
        cases = [(shapes[0], spec, plan, False) for spec in PLAN_SPECS for plan in POOL_PLANS]
    else:
        cases = [(shape, spec, None, planes) for shape in shapes for spec, planes in KERNEL_SPECS]
    results = [
        measure_kernels(shape, spec, device, plan, planes) for shape, spec, plan, planes in cases
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(f"{name}, torch {torch.__version__}; ratio = clone() time / kernel time (bf16); "
          f"rows of up to {KV_TOKENS} tokens timed as CUDA-graph replays on a GPU")  # fmt: skip
    print(kernel_table(results))
    write_json_atomic(
        args.output,
        {
            "device": name,
            "torch": torch.__version__,
            "created": datetime.now(UTC).isoformat(),
            "command": " ".join(["python", "benchmarks/quant_throughput.py", *sys.argv[1:]]),
            "results": results,
        },
    )
    print(f"wrote {args.output}")


def table(results: list[dict]) -> str:
    cols = [
        ("pack", "pack_gbps"),
        ("unpack", "unpack_gbps"),
        ("unpack µs", "unpack_us"),
        ("pack+unpack", "pack_unpack_gbps"),
        ("clone", "clone_gbps"),
        ("ratio", "ratio_to_clone"),
        ("best p+u", "best_pack_unpack_gbps"),
        ("best clone", "best_clone_gbps"),
        ("best ratio", "best_ratio_to_clone"),
    ]
    lines = [
        "| dtype | spec | " + " | ".join(c for c, _ in cols) + " |",
        "|---|---|" + "---:|" * len(cols),
    ]
    for r in results:
        cells = [f"{r[k]:.3f}" if "ratio" in k else f"{r[k]:.2f}" for _, k in cols]
        lines.append(f"| {r['dtype']} | {r['spec']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def refuse_shape(shape: list[int], specs) -> None:
    """One line and exit 2 where ``--shape`` has an empty axis or a head_dim that a token-axis
    spec's groups do not divide."""
    unfit = list(
        dict.fromkeys(s.short() for s in specs if s.axis == "token" and shape[2] % s.group_size)
    )
    if min(shape) < 1 or unfit:
        why = f"groups of {', '.join(unfit)} do not divide head_dim" if unfit else "empty axis"
        print(f"error: --shape {' '.join(map(str, shape))}: {why}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--shape", type=int, nargs=3, default=[4096, 3, 64], metavar=("T", "H", "D")
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating measurement rounds")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per statement")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--device", default="cpu", help="cpu (reference) or cuda (kernels)")
    parser.add_argument("--kernels", action="store_true", help="time the Triton kernels")
    parser.add_argument(
        "--plans",
        action="store_true",
        help="kernel mode: every plan of POOL_PLANS on PLAN_SPECS at the first shape",
    )
    args = parser.parse_args()
    args.shape_given = "--shape" in sys.argv
    kernels = args.device != "cpu" or args.kernels
    specs = (PLAN_SPECS if args.plans else [s for s, _ in KERNEL_SPECS]) if kernels else SPECS
    refuse_shape(args.shape, specs)
    if kernels:
        args.output = args.output or OUT.with_name("quant_throughput_kernels.json")
        run_kernels(args)
        return
    args.output = args.output or OUT
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(*args.shape).to(dtype)
        for spec in SPECS:
            # channel-axis groups run along tokens: [T, H, D] -> [H, T, D]
            xs = x.transpose(0, 1).contiguous() if spec.axis == "channel" else x
            results.append(measure(xs, spec, args.rounds, args.min_run_time))
    hardware = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_avg_1min_at_end": round(os.getloadavg()[0], 2),  # others share this machine
    }
    print(f"shape {args.shape}, {hardware}")
    print(table(results))
    print("GB/s of the input tensor; ratio = pack+unpack GB/s / clone GB/s")
    write_json_atomic(
        args.output,
        {
            "shape": args.shape,
            "hardware": hardware,
            "created": datetime.now(UTC).isoformat(),
            "command": " ".join(["python", "benchmarks/quant_throughput.py", *sys.argv[1:]]),
            "results": results,
        },
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
