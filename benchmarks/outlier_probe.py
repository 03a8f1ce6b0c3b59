"""Issue 15, dense-and-sparse probe: does keeping the most extreme K/V elements in fp16 pay?

KVQuant's dense-and-sparse idea: a small fraction f of elements, the ones farthest from their
neighbours, is kept exactly (stored sparsely: an fp16 value and a position, about 32 bits each),
and the dense rest is quantized on a grid those outliers no longer stretch. Measured here by fake
quantization inside each layer's cache update (one prefill per window): keys as the spec stores
them (rotated back to position 0 when ``pre_rope``; Hadamard-rotated when the spec says so),
outliers chosen per KV head as the top f of |x - median| (keys: the median of the element's
channel over the window's tokens, since a channel-axis group runs along tokens; values: the median
of the element's token vector), replaced by that median before quantizing (so they do not widen
any group's min/max), and put back in fp16 afterwards. f = 0 is the plain quantizer through the
same code (its numbers equal the packed cache's, see ``u:kv16``-style checks in prerope_probe).

Evaluation: KL(fp || quantized) per position and Δppl vs fp on the first ``--eval-windows``
1024-token windows of WikiText-2 test, each f paired per window with f = 0 of the same specs.
The ``+bits`` column prices the outliers at 32 bits each, averaged over K and V elements.

    OMP_NUM_THREADS=1 python benchmarks/outlier_probe.py [--eval-windows 4]

Prints a table, writes benchmarks/results/outlier_probe.json.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch
from prerope_probe import evaluate, fp_reference, load_windows, summary, write_results
from sink_probe import fmt, specs_of

from kvtuner.attention.rope import rope_rotate
from kvtuner.quant import fake_quantize
from kvtuner.quant.reference import rotate
from kvtuner.runtime_loader.hf.rope import key_rope_of

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "outlier_probe.json"
DEFAULT_ROWS = "u:kivi-prerope-hadv-kv3,u:kivi-prerope-hadv-k4v3,u:kivi-prerope-hadv-k3v4"
OUTLIER_BITS = 32  # fp16 value + a 16-bit position


def dense_sparse(x: torch.Tensor, spec, frac: float, along_tokens: bool) -> torch.Tensor:
    """x [B, H, T, D] -> fake-quantized with the top ``frac`` of |x - median| per head kept."""
    if not spec.is_quantized:
        return x
    xr = rotate(x, spec)  # fp32, Hadamard-rotated if the spec rotates
    plain = replace(spec, rotation="none", pre_rope=False)
    if frac > 0:
        med = xr.median(dim=-2 if along_tokens else -1, keepdim=True).values
        dev = (xr - med).abs().flatten(2)  # [B, H, T*D]
        k = max(1, round(frac * dev.shape[-1]))
        cut = dev.topk(k, dim=-1).values[..., -1:]  # per-head threshold
        mask = (dev >= cut).view_as(xr)
        q = fake_quantize(torch.where(mask, med.expand_as(xr), xr), plain)
        q = torch.where(mask, xr.half().float(), q)
    else:
        q = fake_quantize(xr, plain)
    return rotate(q, spec).to(x.dtype)  # Hadamard is its own inverse


def patch(cache, model, frac_k: float, frac_v: float) -> None:
    for i, layer in enumerate(cache.layers):
        freq = key_rope_of(model, i).inv_freq if layer.spec.k.pre_rope else None

        def update(k, v, *_a, _layer=layer, _freq=freq, **_kw):
            ks, vs = _layer.spec.k, _layer.spec.v
            if _freq is not None:
                k = rope_rotate(k, _freq, 0, forward=False)
            k_hat = dense_sparse(k, ks, frac_k, along_tokens=ks.axis == "channel")
            if _freq is not None:
                k_hat = rope_rotate(k_hat, _freq, 0, forward=True)
            return k_hat.to(v.dtype), dense_sparse(v, vs, frac_v, along_tokens=False)

        layer.update = update


def outliers(model, frac_k: float, frac_v: float):
    return lambda cache: patch(cache, model, frac_k, frac_v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="profile stems, or u:<uniform name>")
    ap.add_argument("--fractions", default="0.005,0.01,0.02")
    ap.add_argument("--sides", default="k,v,kv", help="which tensors keep outliers")
    ap.add_argument("--json", default=str(OUT))
    args = ap.parse_args()
    start = time.monotonic()
    model, ev = load_windows(args.eval_windows)
    fp_lp, fp_nll, tokens = fp_reference(model, ev)
    print("| row | outliers in | f | +bits | KL | KL vs f=0 | Δppl % |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for name in args.rows.split(","):
        specs = specs_of(name, model)
        base = evaluate(model, ev, specs, fp_lp, outliers(model, 0.0, 0.0))
        variants = [("-", 0.0)] + [
            (side, float(f)) for side in args.sides.split(",") for f in args.fractions.split(",")
        ]
        for side, f in variants:
            fk, fv = (f if "k" in side else 0.0), (f if "v" in side else 0.0)
            got = base if f == 0 else evaluate(model, ev, specs, fp_lp, outliers(model, fk, fv))
            s = summary(got, base, fp_nll, tokens)
            extra = OUTLIER_BITS * (fk + fv) / 2
            vs = fmt(s["kl_vs_post"]) if s["kl_vs_post"] else ""
            print(f"| {name} | {side} | {f:g} | {extra:.2f} | {s['kl']:.4f} | {vs} | "
                  f"{s['dppl_pct']:+.2f} |", flush=True)  # fmt: skip
            rows.append({"row": name, "side": side, "fraction": f, "extra_bits": extra, **s})
    write_results(args.json, "outlier_probe.py", start, ev, rows)


if __name__ == "__main__":
    main()
