"""HF ``generate`` decode speed and memory: packed caches (fused decode) vs DynamicCache and
StaticCache, on a random-init model of a given shape (default: a 1B-shape Llama, bf16).

Per batch × prompt length × cache: decode tok/s = batch / the median time between consecutive
new tokens of a ``new``-token generate (a stopping criterion stamps each step after a device
sync, so prefill and a step's one-off recompile stay out; a 2-token warm-up first, which also
absorbs StaticCache's auto-compile); ``peak MiB`` = peak allocated during the ``new``-token
generate above what was allocated before it (weights excluded); ``held MiB`` = allocated after a
prefill beyond the weights (the cache and nothing else), beside the bytes the cache reports
(``nbytes()``; K+V tensors for HF's caches). Packed caches run ``attn_implementation="kvtuner"``
(decode reads packed rows with the fused kernel; KIVI's channel-axis keys still dequantize),
HF's caches run sdpa. ``... static`` caches are ``make_cache(..., max_cache_len=...)``: on CUDA
``generate`` compiles their decode step (CUDA graphs) as it compiles StaticCache's.
``× best HF`` = tok/s over the faster of DynamicCache and StaticCache.
``--pack-reserve N`` lets packed histories grow in place (held MiB then exceeds nbytes MiB).

    python benchmarks/hf_decode.py --device cuda
    python benchmarks/hf_decode.py --device cpu --layers 2 --heads 4 --kv-heads 2 --head-dim 64 \\
        --hidden 256 --intermediate 256 --vocab 256 --batch 1 --context 32 --new-tokens 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_device import prepare_device

from kvtuner.runtime_loader.hf import cache_kwargs

OUT = Path(__file__).parent / "results" / "hf_decode.json"
CACHES = {  # label: None for HF's own caches, else (K spec kwargs, V spec kwargs)
    "dynamic": None,
    "static": None,
    "KV4 g32": (dict(bits=4), dict(bits=4)),
    "KIVI K4 + V4": (dict(bits=4, axis="channel"), dict(bits=4)),
    "KV8 g64": (dict(bits=8, group_size=64), dict(bits=8, group_size=64)),
    "KV4 g32 static": (dict(bits=4), dict(bits=4)),
    "KV8 g64 static": (dict(bits=8, group_size=64), dict(bits=8, group_size=64)),
}
STATIC = " static"  # a label's suffix: make_cache(max_cache_len=...), compiled as StaticCache is
MIB = 2**20


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--context", type=int, nargs="+", default=[2048, 32768])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--caches", nargs="+", choices=list(CACHES), default=list(CACHES))
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--residual-length", type=int, default=0)
    p.add_argument("--pack-reserve", type=int, default=0,
                   help="spare packed rows to grow in place (0: exact size)")  # fmt: skip
    p.add_argument("--output", type=Path, default=OUT)
    return p.parse_args()


def build_model(args):
    import torch
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, hidden_size=args.hidden,
        intermediate_size=args.intermediate, vocab_size=args.vocab,
        max_position_embeddings=max(args.context) + args.new_tokens,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.to(args.device).eval()


def new_cache(model, args, label: str, total: int):
    from transformers import DynamicCache, StaticCache

    from kvtuner import ModelFingerprint, Profile, QuantSpec
    from kvtuner.runtime_loader.hf import make_cache, use_kvtuner_attention

    if CACHES[label] is None:
        model.set_attn_implementation("sdpa")
        if label == "static":
            return StaticCache(config=model.config, max_cache_len=total)
        return DynamicCache(config=model.config)
    use_kvtuner_attention(model)
    k, v = (QuantSpec(**kw) for kw in CACHES[label])
    profile = Profile.uniform("bench", ModelFingerprint.from_config(model.config), k, v)
    kernel = "auto" if args.device == "cuda" else "always"  # CPU: prove the kernel path
    if label.endswith(STATIC):
        return make_cache(model, profile, decode_kernel=kernel, max_cache_len=total)
    return make_cache(model, profile, residual_length=args.residual_length, decode_kernel=kernel,
                      pack_reserve=args.pack_reserve)  # fmt: skip


def cache_nbytes(cache) -> int:
    if hasattr(cache, "nbytes"):
        return cache.nbytes()
    return sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def step_clock(device: str):
    """A stopping criterion that never stops and stamps the time of every step (``.stamps``,
    perf_counter seconds) after a device sync."""
    import torch
    import transformers

    class StepClock(transformers.StoppingCriteria):
        def __init__(self):
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            sync(device)
            self.stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StepClock()


def timed_generate(model, args, label, ids, new: int) -> tuple[list[float], float | None]:
    """(seconds between consecutive new tokens, peak MiB above what was allocated before) of
    one greedy generate."""
    import torch
    import transformers

    cuda = args.device == "cuda"
    sync(args.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    cache = new_cache(model, args, label, ids.shape[1] + new)
    clock = step_clock(args.device)
    model.generate(ids, **cache_kwargs(cache), max_new_tokens=new, min_new_tokens=new,
                   do_sample=False, pad_token_id=0,
                   stopping_criteria=transformers.StoppingCriteriaList([clock]))  # fmt: skip
    peak = (torch.cuda.max_memory_allocated() - base) / MIB if cuda else None
    return [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)], peak


def held_after_prefill(model, args, label, ids) -> tuple[float | None, float]:
    """(MiB allocated after a prefill beyond what was before, MiB the cache reports)."""
    import torch

    cuda = args.device == "cuda"
    sync(args.device)
    base = torch.cuda.memory_allocated() if cuda else 0
    cache = new_cache(model, args, label, ids.shape[1] + args.new_tokens)
    with torch.inference_mode():
        out = model(ids, **cache_kwargs(cache), logits_to_keep=1)
    del out
    sync(args.device)
    held = (torch.cuda.memory_allocated() - base) / MIB if cuda else None
    return held, cache_nbytes(cache) / MIB


def measure(model, args, batch: int, context: int, label: str) -> dict:
    import torch

    ids = torch.randint(3, args.vocab, (batch, context), device=args.device)
    timed_generate(model, args, label, ids, 2)  # warm-up (and StaticCache's compile)
    steps, peak = timed_generate(model, args, label, ids, args.new_tokens)
    held, reported = held_after_prefill(model, args, label, ids)
    return {
        "batch": batch, "context": context, "cache": label,
        "tok_s": batch / statistics.median(steps), "steps_timed": len(steps),
        "peak_mib": peak, "held_mib": held, "nbytes_mib": reported,
    }  # fmt: skip


def add_ratios(rows: list[dict]) -> None:
    """``x_best_hf``: tok/s over the faster HF cache at the same point."""
    for r in rows:
        same = [o for o in rows if (o["batch"], o["context"]) == (r["batch"], r["context"])]
        hf = [o["tok_s"] for o in same if CACHES[o["cache"]] is None]
        r["x_best_hf"] = r["tok_s"] / max(hf) if hf else None


def table(rows: list[dict]) -> str:
    def num(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = [
        "| batch × context | cache | decode tok/s | × best HF | peak MiB | held MiB | nbytes MiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} × {r['context']} | {r['cache']} | {r['tok_s']:.1f} | "
            f"{num(r['x_best_hf'], '.2f')} | {num(r['peak_mib'], '.0f')} | "
            f"{num(r['held_mib'], '.0f')} | {r['nbytes_mib']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    prepare_device(args.device)
    import torch

    from kvtuner.profile import write_json_atomic

    model = build_model(args)
    grid = [(b, c, k) for b in args.batch for c in args.context for k in args.caches]
    rows = []
    for point in grid:  # each point printed as it lands: a time limit keeps what is done
        rows.append(measure(model, args, *point))
        print(rows[-1], flush=True)
    add_ratios(rows)
    info = {
        "device": args.device,
        "torch": torch.__version__,
        "model": vars(args) | {"output": None},
    }
    info["gpu" if args.device == "cuda" else "cores"] = (
        torch.cuda.get_device_name() if args.device == "cuda" else os.cpu_count()
    )
    print(info)
    print(table(rows))
    command = " ".join(["python", "benchmarks/hf_decode.py", *sys.argv[1:]])
    write_json_atomic(args.output, {"hardware": info, "created": datetime.now(UTC).isoformat(),
                                    "command": command, "results": rows})  # fmt: skip
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
