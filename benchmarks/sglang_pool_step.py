"""One decode step of the SGLang pool on CPU, per layer: this checkout vs a baseline commit.

What a layer costs the kvtuner pool at each decode step under torch_native attention: the write
of the new tokens (``set_kv_buffer``: quantize, pack, store) and every request's K and V read
(``get_key_buffer(l)[req_to_token[r, :len]]``, through the lazy view and the decode cache).
Both pools are real ``KVTunerMHATokenToKVPool`` objects (sglang installed), the baseline's
imported from ``git archive <rev>`` as another package, measured in the same process in
alternating rounds (CPU speed on a shared machine swings 2-7x). ``ops`` = torch operators
dispatched per layer and step (``TorchDispatchMode``); numpy calls are not torch operators.
Stock ``MHATokenToKVPool`` (a plain index_put and index) is measured alongside.

    python benchmarks/sglang_pool_step.py --baseline 1cc962d [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvtuner.profile import write_json_atomic

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "sglang_pool_step.json"
CONFIGS = {  # name -> ((bits, group, rotate K), (bits, group)) per-token, asymmetric
    "KV4 g64": ((4, 64), (4, 64)),
    "KV8 g32": ((8, 32), (8, 32)),
    "KV4 g32": ((4, 32), (4, 32)),
    "K4V2 g32": ((4, 32), (2, 32)),
    "K5V3 g32": ((5, 32), (3, 32)),
    "K3V2 g64": ((3, 64), (2, 64)),
}
LAYERS, HEADS, HEAD_DIM, PROMPT = 4, 3, 64, 40  # SmolLM2-135M: 3 KV heads of 64


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


class _Layer:  # what set_kv_buffer reads from SGLang's RadixAttention
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def baseline_package(rev: str, root: Path) -> str:
    """Extract ``kvtuner/`` at ``rev`` under ``root`` as package ``kvtuner_baseline``."""
    tar = subprocess.run(["git", "archive", rev, "kvtuner"], cwd=REPO, capture_output=True)
    tar.check_returncode()
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(root, filter="data")
    (root / "kvtuner").rename(root / "kvtuner_baseline")
    sys.path.insert(0, str(root))
    return "kvtuner_baseline"


def make_pool(package: str | None, config, dtype: torch.dtype):
    """A lazy-read pool of ``package`` (kvtuner or the baseline); None: SGLang's stock pool."""
    kw = dict(page_size=1, dtype=dtype, head_num=HEADS, head_dim=HEAD_DIM, layer_num=LAYERS)
    kw.update(device="cpu", enable_memory_saver=False)
    if package is None:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        return MHATokenToKVPool(60000, **kw)
    pkg = importlib.import_module(package)
    profile = importlib.import_module(f"{package}.profile")
    spec = pkg.QuantSpec
    (kb, kg), (vb, vg) = config
    k, v = spec(kb, kg, rotation="hadamard"), spec(vb, vg)
    fp = profile.ModelFingerprint("LlamaForCausalLM", LAYERS, HEADS, HEAD_DIM)
    prof = profile.Profile("bench", fp, tuple(profile.LayerSpec(i, k, v) for i in range(LAYERS)))
    pool_cls = importlib.import_module(f"{package}.runtime_loader.sglang.pool.store")
    return pool_cls.KVTunerMHATokenToKVPool(60000, profile=prof, read_mode="lazy", **kw)


class Decode:
    """``streams`` requests decoding one token per step; slots from a req_to_token table."""

    def __init__(self, pool, dtype: torch.dtype, streams: int) -> None:
        self.pool, self.dtype, self.lens = pool, dtype, [PROMPT] * streams
        self.req = torch.arange(1, 1 + streams * 5000, dtype=torch.int32).view(streams, 5000)
        g = torch.Generator().manual_seed(0)
        self.kv = [(torch.randn(streams, HEADS, HEAD_DIM, generator=g) * 3).to(dtype)] * 2
        self.forward(PROMPT)

    def forward(self, new: int) -> None:
        pool, rows = self.pool, range(len(self.lens))
        with torch.inference_mode():
            if hasattr(pool, "prepare_reads"):  # the plugin announces the batch's slots
                pool.prepare_reads(torch.cat([self.req[r, : self.lens[r]] for r in rows]).long())
            loc = torch.cat([self.req[r, self.lens[r] - new : self.lens[r]] for r in rows]).long()
            k, v = self.kv
            if new > 1:
                k = v = torch.randn(loc.numel(), HEADS, HEAD_DIM).to(self.dtype)
            reads = [self.req[r, : self.lens[r]] for r in rows]
            for layer in range(LAYERS):
                pool.set_kv_buffer(_Layer(layer), loc, k, v)
                k_cache, v_cache = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
                for slots in reads:  # torch_native: per request, K then V
                    k_cache[slots], v_cache[slots]

    def step(self) -> None:
        self.lens = [n + 1 for n in self.lens]
        self.forward(1)


def measure(pools: dict, dtype: torch.dtype, streams: int, rounds: int, steps: int) -> dict:
    runs = {name: Decode(pool, dtype, streams) for name, pool in pools.items()}
    ops = {}
    for name, run in runs.items():
        with _Count() as count:
            run.step()
        ops[name] = count.n / LAYERS
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                run.step()
            times[name].append((time.perf_counter() - t0) / steps / LAYERS * 1e6)
    return {
        name: {"ops": ops[name], "us_median": statistics.median(t), "us_best": min(t)}
        for name, t in times.items()
    }


def measure_row(baseline: str, name: str, streams: int, dtype: torch.dtype, args) -> dict:
    config = CONFIGS[name]
    pools = {
        "stock": make_pool(None, config, dtype),
        "baseline": make_pool(baseline, config, dtype),
        "kvtuner": make_pool("kvtuner", config, dtype),
    }
    res = measure(pools, dtype, streams, args.rounds, args.steps)
    b, n, s = res["baseline"], res["kvtuner"], res["stock"]
    print(
        f"{name:9s} {str(dtype)[6:]:8s} streams={streams}  ops/layer {b['ops']:6.1f} -> "
        f"{n['ops']:5.1f} (stock {s['ops']:4.1f})  us/layer {b['us_median']:7.1f} -> "
        f"{n['us_median']:6.1f} (stock {s['us_median']:5.1f})",
        flush=True,
    )
    return {"config": name, "dtype": str(dtype)[6:], "streams": streams, **res}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="git revision to compare with")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40, help="decode steps per round")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = baseline_package(args.baseline, Path(tmp))
        rows = [
            measure_row(baseline, name, streams, dtype, args)
            for streams in (1, 8)
            for name in CONFIGS
            for dtype in (torch.float16, torch.bfloat16, torch.float32)
        ]
    doc = {
        "command": "python benchmarks/sglang_pool_step.py " + " ".join(argv or sys.argv[1:]),
        "baseline": args.baseline,
        "head": _git("rev-parse", "--short", "HEAD"),
        "torch_threads": args.threads,
        "load_average_after": os.getloadavg(),
        "layers": LAYERS,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "prompt_tokens": PROMPT,
        "rows": rows,
    }
    write_json_atomic(args.out, doc)


if __name__ == "__main__":
    main()
