"""KV bytes per token at a long context: each profile's prediction next to what the HF cache
really stores (``nbytes()``), and both next to an fp16 cache that keeps every layer in full.

For a hybrid model (Gemma 3: 5 sliding-window layers per global one) a window layer stores at
most ``window - 1`` tokens, so at 8k context most of the bytes sit in the global layers. The
cache is filled through its own ``update`` with K/V of the model's shapes (prefill in chunks,
then decode steps), exactly as attention fills it; bytes do not depend on the values.

    python benchmarks/kv_bytes.py --model gemma3-270m [--context-length 8192]

Prints a table, writes benchmarks/results/kv_bytes_<model>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from kvtuner.calibration import model_fingerprint
from kvtuner.evaluation import parse_uniform
from kvtuner.evaluation.configs import EvalConfig
from kvtuner.profile import ModelFingerprint, Profile, load_profile, write_json_atomic
from kvtuner.runtime_loader.hf import make_cache

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
UNIFORM = "kv16,kv8,kv4,kv3"
CHUNK, DECODE_STEPS = 1024, 8


def fill(cache, fp: ModelFingerprint, tokens: int) -> None:
    """Prefill ``tokens - DECODE_STEPS`` in chunks, then decode the rest one token at a time."""
    g = torch.Generator().manual_seed(0)
    steps = [CHUNK] * ((tokens - DECODE_STEPS) // CHUNK)
    steps += [tokens - DECODE_STEPS - sum(steps)] + [1] * DECODE_STEPS
    for n in (s for s in steps if s):
        shape = (1, fp.num_kv_heads, n, fp.head_dim)
        for layer in range(fp.num_layers):
            k, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
            cache.update(k, v, layer)


def row(name: str, config, specs, tokens: int) -> dict:
    fp = ModelFingerprint.from_config(config)
    profile = Profile(name, fp, specs, budget={"context_length": tokens})
    cache = make_cache(config, specs)
    fill(cache, fp, tokens)
    stored, predicted = cache.nbytes(), profile.kv_bytes(tokens)
    full = fp.fp16_bytes(tokens, capped=False)
    return {
        "config": name,
        "predicted_bytes": predicted,
        "nbytes": stored,
        "equal": stored == predicted,
        "bytes_per_token": stored / tokens,
        "vs_fp16_every_layer_full": stored / full,
        "vs_fp16_default_cache": stored / fp.fp16_bytes(tokens),
    }


def configs(fp: ModelFingerprint, folder: Path) -> list[EvalConfig]:
    rows = parse_uniform(UNIFORM, fp)
    for path in sorted(folder.glob("*.json")):
        rows.append(EvalConfig(path.stem, "profile", load_profile(path, fp).layers))
    return rows


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoConfig

    from kvtuner.calibration.models import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--context-length", type=int, default=8192)
    p.add_argument("--profiles", default=None, help="default: exported_configs/<model>")
    args = p.parse_args(argv)
    fp = model_fingerprint(args.model)
    source = resolve_model(args.model)
    config = AutoConfig.from_pretrained(source.path, **source.kwargs())
    folder = Path(args.profiles or ROOT / "exported_configs" / args.model)
    n = args.context_length
    rows = [row(c.name, config, c.specs, n) for c in configs(fp, folder)]
    full = fp.fp16_bytes(n, capped=False)
    print(f"{args.model}: {fp.layout}; {n} tokens; fp16, every layer in full: {full} B")
    print(
        f"{'config':<22} {'predicted B':>12} {'nbytes() B':>12} {'equal':>5} {'B/token':>9} "
        f"{'x fp16 full':>11} {'x fp16 dflt':>11}"
    )
    for r in rows:
        print(
            f"{r['config']:<22} {r['predicted_bytes']:>12.0f} {r['nbytes']:>12} "
            f"{'yes' if r['equal'] else 'NO':>5} {r['bytes_per_token']:>9.1f} "
            f"{r['vs_fp16_every_layer_full']:>11.4f} {r['vs_fp16_default_cache']:>11.4f}"
        )
    out = RESULTS / f"kv_bytes_{args.model}.json"
    command = "python benchmarks/kv_bytes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_json_atomic(
        out,
        {
            "command": command,
            "model": args.model,
            "fingerprint": fp.to_dict(),
            "context_length": n,
            "fp16_every_layer_full_bytes": full,
            "fp16_default_cache_bytes": fp.fp16_bytes(n),
            "rows": rows,
        },
    )
    print(f"wrote {out}")
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
