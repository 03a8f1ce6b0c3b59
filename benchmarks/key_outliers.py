"""Key outlier channels per layer: max|k| / median over channels, per model, beside the searched
profiles' key treatment of that layer.

A channel's magnitude is max|k| over the calibration tokens (keys as the cache stores them, post
RoPE), per KV head; a layer's outlier ratio is the largest channel magnitude over the median
channel magnitude, the worst head's. The key treatment columns read every profile of
``exported_configs/<model>/`` and print each layer's key spec (bits, axis, rotation, smoothing,
pre-RoPE), so the outlier layers can be matched to what the search gave them.

    OMP_NUM_THREADS=1 python benchmarks/key_outliers.py --models smollm2-135m qwen2.5-0.5b

Prints a table per model, writes benchmarks/results/key_outliers.json.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from kvtuner.calibration import load_model
from kvtuner.calibration.batches import load_calibration_data
from kvtuner.calibration.smoothing import key_magnitudes
from kvtuner.profile import (
    ModelFingerprint,
    is_vllm_profile,
    load_profile,
    read_json,
    write_json_atomic,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "key_outliers.json"


def layer_ratios(mags: list[torch.Tensor]) -> list[dict]:
    """Per layer: max channel, median channel and their ratio (the worst KV head's)."""
    rows = []
    for layer, m in enumerate(mags):  # m [kv_heads, head_dim]
        ratio = m.max(-1).values / m.median(-1).values.clamp_min(1e-6)
        head = int(ratio.argmax())
        rows.append(
            {
                "layer": layer,
                "max": float(m[head].max()),
                "median": float(m[head].median()),
                "ratio": float(ratio[head]),
                "top_channel": int(m[head].argmax()),
            }
        )
    return rows


def key_treatment(layer) -> str:
    """A short label of how a layer's keys are stored (e.g. ``4b ch had pre``)."""
    spec = layer.k
    if not spec.is_quantized:
        return "16"
    tags = [f"{spec.bits}b", "ch" if spec.axis == "channel" else "tok"]
    tags += ["had"] if spec.rotation != "none" else []
    tags += ["pre"] if spec.pre_rope else []
    tags += ["sm"] if layer.k_smooth is not None else []
    return " ".join(tags)


def profile_keys(folder: Path, model_config) -> dict[str, list[str]]:
    """Profile stem -> per-layer key treatment, for the profiles in ``folder``."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        if is_vllm_profile(read_json(path, "profile")):
            continue  # a vLLM skip set stores no kvtuner key spec
        profile = load_profile(str(path), model_config)
        out[path.stem] = [key_treatment(layer) for layer in profile.layers]
    return out


def measure(name: str, num_samples: int, seq_len: int) -> dict:
    model, tok = load_model(name, device="cpu", dtype="float32")
    tokens = load_calibration_data(tok, num_samples=num_samples, seq_len=seq_len).tokens
    mags = key_magnitudes(model, tokens, quantile=1.0)
    fingerprint = ModelFingerprint.from_config(model.config)
    keys = profile_keys(ROOT / "exported_configs" / name, model.config)
    return {
        "model": name,
        "fingerprint": fingerprint.hash,
        "layers": layer_ratios(mags),
        "keys": keys,
    }


def print_table(result: dict) -> None:
    print(f"\n{result['model']}: max|k| / median channel (worst KV head), key spec per profile")
    names = list(result["keys"])
    print(f"{'layer':>5} {'max':>8} {'median':>7} {'ratio':>7}  " + "  ".join(names))
    for row in result["layers"]:
        specs = "  ".join(f"{result['keys'][n][row['layer']]:<{len(n)}}" for n in names)
        print(
            f"{row['layer']:>5} {row['max']:8.1f} {row['median']:7.2f} {row['ratio']:7.1f}  {specs}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    p.add_argument("--num-samples", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    args = p.parse_args(argv)
    results = [measure(m, args.num_samples, args.seq_len) for m in args.models]
    for result in results:
        print_table(result)
    cli = shlex.join(sys.argv[1:] if argv is None else argv)
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/key_outliers.py {cli}"
    write_json_atomic(OUT, {"command": command, "results": results})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
