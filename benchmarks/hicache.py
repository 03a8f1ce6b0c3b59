"""HiCache with packed KV: host tokens per GiB, and a multi-turn workload on the real server.

1. Host capacity, from the real classes' buffers: for each SmolLM2 profile a kvtuner device pool
   (``KVTunerMHATokenToKVPool``) and the host pool SGLang builds for it with ``--kvtuner-profile``
   (``KVTunerMHATokenToKVPoolHost``); stock: SGLang's ``MHATokenToKVPool`` and its
   ``MHATokenToKVPoolHost`` allocation (bf16, the served dtype on a GPU). Tokens per GiB =
   host tokens * 2^30 / host buffer bytes. Channel-axis (KIVI-style) profiles are refused with
   HiCache and are listed as such.
2. ``--server``: the real SGLang server on this CPU (recipe: docs/serving.md, "On a CPU") with
   ``--enable-hierarchical-cache``, a small device pool (``--device-tokens``) and the same host
   memory for every configuration (stock: ``--host-ratio`` x the device pool; kvtuner: the ratio
   that gives the same bytes). Workload: ``--docs`` WikiText-2 passages, each asked twice (see
   ``tests/runtime_loader/sglang/hicache_workload.py``). Per configuration: host-hit rate of the
   second turn, TTFT of both turns, outputs of turn 2 equal to turn 1, outputs equal to stock's.

    python benchmarks/hicache.py [--server] [--out benchmarks/results/hicache.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime_loader" / "sglang"))

from hicache_workload import documents, two_turns  # noqa: E402
from sglang_server import SGLangServer, smollm2_hf_dir  # noqa: E402

from kvtuner.profile import load_profile, write_json_atomic  # noqa: E402
from kvtuner.runtime_loader.sglang.pool.cell_size import cell_size  # noqa: E402

PROFILES = ["benchmarks/results/sglang_profiles/*.json", "exported_configs/smollm2-135m/*.json"]
SERVED = [
    "benchmarks/results/sglang_profiles/smollm2-135m-uniform-8bit.json",
    "exported_configs/smollm2-135m/per-token-4bit.json",
]
LAYERS, HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M
SERVER_DTYPE_BYTES = 4  # the CPU server runs fp32


def _pools(profile, dtype, tokens: int):
    """The device pool and the host pool SGLang builds for it (ratio 4, layout page_first)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from kvtuner.runtime_loader.sglang.hicache.host_pool import KVTunerMHATokenToKVPoolHost
    from kvtuner.runtime_loader.sglang.hicache.host_transfers import CpuMHATokenToKVPoolHost
    from kvtuner.runtime_loader.sglang.pool.store import KVTunerMHATokenToKVPool

    args = (tokens, 1, dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    if profile is None:
        device, host_cls = MHATokenToKVPool(*args), CpuMHATokenToKVPoolHost
    else:
        device = KVTunerMHATokenToKVPool(*args, profile=profile, read_mode="lazy")
        host_cls = KVTunerMHATokenToKVPoolHost.bound(profile.hash)
    host = host_cls(
        device.get_device_pool_infos()[0].buffer_info,
        4.0,
        0,
        1,
        "page_first",
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=LAYERS - 1,
    )
    return device, host


def capacity_row(path: Path | None) -> dict:
    import torch

    name = "stock (SGLang MHATokenToKVPoolHost, bf16)" if path is None else str(path)
    profile = None if path is None else load_profile(REPO / path)
    if profile is not None and any(q.axis != "token" for s in profile.layers for q in (s.k, s.v)):
        return {"config": name, "hash": profile.hash, "servable": False}
    _, host = _pools(profile, torch.bfloat16, 256)
    buffer_bytes = host.kv_buffer.numel() * host.kv_buffer.element_size()
    return {
        "config": name,
        "hash": None if profile is None else profile.hash,
        "servable": True,
        "nominal_bits": 16.0 if profile is None else profile.nominal_bits,
        "host_bytes_per_token": host.size_per_token,
        "host_tokens": host.size,
        "host_buffer_bytes": buffer_bytes,
        "host_tokens_per_gib": host.size * 2**30 / buffer_bytes,
    }


def packed_cell(path: Path) -> int:
    profile = load_profile(REPO / path)
    return cell_size(
        profile,
        heads=HEADS,
        start_layer=0,
        num_layers=LAYERS,
        dtype_bytes=SERVER_DTYPE_BYTES,
        read_mode="lazy",
    ).packed


def serve_workload(args, path: Path | None, docs: list[str]) -> dict:
    stock_cell = 2 * LAYERS * HEADS * HEAD_DIM * SERVER_DTYPE_BYTES
    ratio = args.host_ratio * (1 if path is None else stock_cell / packed_cell(path))
    flags = [
        "--enable-hierarchical-cache",
        "--hicache-ratio",
        f"{ratio:.4f}",
        "--max-total-tokens",
        str(args.device_tokens),
        "--context-length",
        str(args.device_tokens),
    ]
    if path is not None:
        flags += ["--kvtuner-profile", str(REPO / path)]
    with SGLangServer(smollm2_hf_dir(), *flags) as server:
        first, second = two_turns(server.url, docs, args.max_new_tokens)
        log = server.log_text()
    prompt = sum(t.prompt_tokens for t in second)
    return {
        "config": "stock" if path is None else str(path),
        "hicache_ratio": round(ratio, 4),
        "host_pool_line": next(
            (ln for ln in log.splitlines() if "hierarchical KV host pool" in ln), ""
        ),
        "turn2_host_hit_rate": sum(t.host_hit for t in second) / prompt,
        "turn2_device_hit_rate": sum(t.device_hit for t in second) / prompt,
        "ttft_turn1_s": statistics.median(t.ttft_s for t in first),
        "ttft_turn2_s": statistics.median(t.ttft_s for t in second),
        "same_output_turn2": sum(
            a.output_ids == b.output_ids for a, b in zip(first, second, strict=True)
        )
        / len(docs),
        "outputs": [list(t.output_ids) for t in second],
    }


def print_tables(capacity: list[dict], served: list[dict]) -> None:
    stock = capacity[0]["host_tokens_per_gib"]
    print(f"{'config':<66} {'bits':>5} {'B/token':>8} {'tokens/GiB':>11} {'x stock':>7}")
    for r in capacity:
        if not r["servable"]:
            print(f"{r['config']:<66} {'refused with HiCache (channel-axis keys)':>41}")
            continue
        print(
            f"{r['config']:<66} {r['nominal_bits']:>5.2f} {r['host_bytes_per_token']:>8} "
            f"{r['host_tokens_per_gib']:>11.0f} {r['host_tokens_per_gib'] / stock:>7.2f}"
        )
    if not served:
        return
    print(
        f"\n{'server config':<54} {'ratio':>6} {'host hit':>8} {'TTFT 1':>7} {'TTFT 2':>7} "
        f"{'t2=t1':>6} {'=stock':>6}"
    )
    for r in served:
        print(
            f"{r['config']:<54} {r['hicache_ratio']:>6.2f} {r['turn2_host_hit_rate']:>8.2f} "
            f"{r['ttft_turn1_s']:>7.3f} {r['ttft_turn2_s']:>7.3f} "
            f"{r['same_output_turn2']:>6.2f} {r['same_output_as_stock']:>6.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="store_true", help="also run the server workload")
    ap.add_argument("--server-profiles", nargs="*", default=SERVED)
    ap.add_argument("--device-tokens", type=int, default=1024)
    ap.add_argument("--host-ratio", type=float, default=2.0, help="stock host/device tokens")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--words", type=int, default=300)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/hicache.json")
    args = ap.parse_args(argv)
    started = time.time()
    paths = [None, *sorted({p.relative_to(REPO) for g in PROFILES for p in REPO.glob(g)})]
    capacity = [capacity_row(p) for p in paths]
    served = []
    if args.server:
        docs = documents(args.docs, args.words)
        served = [serve_workload(args, p and Path(p), docs) for p in [None, *args.server_profiles]]
        for r in served:
            same = [a == b for a, b in zip(r["outputs"], served[0]["outputs"], strict=True)]
            r["same_output_as_stock"] = sum(same) / len(same)
    print_tables(capacity, served)
    write_json_atomic(
        args.out,
        {
            "command": "python benchmarks/hicache.py " + " ".join(argv or sys.argv[1:]),
            "hardware": "2-core CPU, server torch threads 1 (OMP_NUM_THREADS=1)",
            "args": {k: str(v) for k, v in vars(args).items()},
            "wall_s": round(time.time() - started, 1),
            "capacity": capacity,
            "server": served,
        },
    )
    print(json.dumps({"wrote": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
