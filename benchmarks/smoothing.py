"""Key smoothing A/B on SmolLM2: λ = statistic(|k|)^α calibrated on the search's calibration
tokens, KL(fp || quantized) of uniform per-token configs on held-out WikiText-2 *test*
windows (4 x 256, as benchmarks/search.py), through the packed HF cache; and the uniform
smoothed profiles for benchmarks/quality.py.

    OMP_NUM_THREADS=1 python benchmarks/smoothing.py [--configs k4v4,k3v3] \
        [--profiles benchmarks/results/smooth_profiles]

Prints a table, writes benchmarks/results/smoothing.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from kvtuner.calibration import (
    fingerprint_of,
    fp_reference,
    load_calibration_data,
    load_model,
    measure_kl,
)
from kvtuner.calibration.smoothing import calibrate_key_smoothing, key_magnitudes
from kvtuner.profile import LayerSpec, Profile, save_profile, write_json_atomic
from kvtuner.quant import KeySmoothing, QuantSpec

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "smoothing.json"
HELDOUT = ROOT.parent / "shared" / "data" / "wikitext-2" / "test.txt"
ALPHAS = (0.25, 0.5, 0.75, 1.0)


def magnitudes(model, tokens) -> dict[str, list[torch.Tensor]]:
    """Per statistic, per layer |k| magnitude [heads, head_dim]."""
    return {
        "q0.99": key_magnitudes(model, tokens),
        "max": key_magnitudes(model, tokens, quantile=1.0),
    }


def specs(num_layers: int, kb: int, vb: int, lams=None, rotation="none") -> list[LayerSpec]:
    k, v = QuantSpec(kb, 32, rotation=rotation), QuantSpec(vb, 32)
    return [LayerSpec(i, k, v, None if lams is None else lams[i]) for i in range(num_layers)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="k4v4,k3v3")
    ap.add_argument("--profiles", help="write uniform smoothed profiles (alpha 0.5) here")
    ap.add_argument("--json", default=str(OUT))
    args = ap.parse_args()
    start = time.monotonic()
    model, tok = load_model("smollm2-135m")
    cal = load_calibration_data(tok)  # the search's default calibration draw
    held = load_calibration_data(tok, dataset=str(HELDOUT), num_samples=4, seq_len=256)
    ref = fp_reference(model, held.tokens)
    layers = model.config.num_hidden_layers
    if args.profiles:  # first: quality.py can start on them while the A/B runs
        lams = calibrate_key_smoothing(model, cal.tokens, alpha=0.5)
        for cfg in args.configs.split(","):
            kb, vb = (int(x) for x in cfg[1:].split("v"))
            provenance = {**cal.describe(), "key_smoothing": {"alpha": 0.5}}
            layer_specs = specs(layers, kb, vb, lams)
            p = Profile("smollm2-135m", fingerprint_of(model), layer_specs, calibration=provenance)
            path = save_profile(p.with_accounting(), Path(args.profiles) / f"smooth-{cfg}.json")
            print("wrote", path, flush=True)
    mags = magnitudes(model, cal.tokens)
    rows = []
    for cfg in args.configs.split(","):
        kb, vb = (int(x) for x in cfg[1:].split("v"))
        variants = [("none", "-", None, "none"), ("hadamard", "-", None, "hadamard")]
        for stat, alpha in [(s, a) for s in mags for a in ALPHAS]:
            lams = [KeySmoothing.from_magnitudes(m, alpha) for m in mags[stat]]
            variants += [("smooth", f"{stat} a={alpha}", lams, "none")]
        half = [KeySmoothing.from_magnitudes(m, 0.5) for m in mags["q0.99"]]
        variants += [("smooth+hadamard", "q0.99 a=0.5", half, "hadamard")]
        for name, detail, lams, rot in variants:
            kl = measure_kl(model, held.tokens, specs(layers, kb, vb, lams, rot), ref)
            rows.append({"config": cfg, "keys": name, "lambda": detail, "heldout_kl": kl})
            print(f"{cfg:6} {name:16} {detail:14} KL {kl:.5f}", flush=True)
    hardware = {
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
    }
    write_json_atomic(args.json, {
        "command": "python benchmarks/smoothing.py " + " ".join(sys.argv[1:]),
        "calibration": cal.describe(), "heldout": {**held.describe(), "dataset": "wikitext-2 test"},
        "hardware": hardware, "seconds": time.monotonic() - start, "rows": rows,
    })  # fmt: skip
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
