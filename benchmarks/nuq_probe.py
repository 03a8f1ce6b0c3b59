"""Issue 15, lever 3 probe: do non-uniform codebooks (KVQuant's NUQ idea) pay on SmolLM2-135M?

Per layer, K or V and KV head, a Lloyd-Max (weighted 1-D k-means) codebook of 2^bits levels is
fitted in the *normalized group code space* of today's format: ``u = (x - zero) / scale`` with
the reference's asymmetric min/max grid (fp16 zero rounded down, scale rounded up), so levels
are floats in [0, qmax], ``x^ = zero + scale * level[code]``, and the uniform codebook
0..qmax is today's format exactly. Codes go to the nearest level (midpoint thresholds).

Tensors are seen as each preset sees them: ``ksmooth`` (per-token keys divided by the exported
``per-token-smooth-3bit`` profile's λ, group 32), ``khad`` (per-token Hadamard-rotated keys),
``kchan`` (KIVI channel-axis keys, 32-token groups), ``v`` (per-token values, group 32),
``vhad`` (Hadamard-rotated values). Weights of the k-means: ``scale2`` (scale², i.e. MSE in x
space), ``fisher`` (scale² times the squared gradient of the next-token loss w.r.t. the
element, KVQuant's sensitivity weighting), ``pinned`` variants keep levels 0 and qmax fixed
(per-group min and max stay exact). ``std`` normalizes each group by mean/std instead of
min/max (the "whole-tensor-normalized" alternative; metadata as fp32, an upper bound).

Fit: the first ``--cal-windows`` 1024-token windows of WikiText-2 *valid*; evaluation:
KL(fp || quantized) per position and Δppl on the first ``--eval-windows`` windows of
WikiText-2 *test*. Fake quantization here; values are then stored through a 16-bit kvtuner
cache (fp16 rounding, the same for every row), residual 0, prefill included.

    OMP_NUM_THREADS=1 python benchmarks/nuq_probe.py [--cal-windows 4] [--eval-windows 4]

Prints a table, writes benchmarks/results/nuq_probe.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from nuq_codebooks import FP16, Probe, fit, record

from kvtuner.calibration import load_model
from kvtuner.evaluation import load_eval_windows
from kvtuner.profile import LayerSpec
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "wikitext-2"
SMOOTH = ROOT / "exported_configs" / "smollm2-135m" / "per-token-smooth-3bit.json"
OUT = ROOT / "benchmarks" / "results" / "nuq_probe.json"
PAIRS = {"smooth": ("ksmooth", "v"), "kivi-hadv": ("kchan", "vhad"), "had": ("khad", "v")}


@torch.inference_mode()
def evaluate(probe: Probe, ev: torch.Tensor, fp_lp, fp_nll: float, k, v) -> tuple:
    """KL per position, Δppl % and per-window KL of K/V fake-quantized per
    ``(view, bits, levels, mode)``."""
    model, kl, nll = probe.model, [], 0.0
    for i, row in enumerate(ev):
        cache = make_cache(
            model, [LayerSpec(j, FP16, FP16) for j in range(probe.layers)], residual_length=0
        )
        for j, layer in enumerate(cache.layers):

            def update(ks, vs, *a, _orig=layer.update, _j=j, **kw):
                ks = probe.fake_layer(ks, k, _j)
                vs = probe.fake_layer(vs, v, _j)
                return _orig(ks, vs, *a, **kw)

            layer.update = update
        logits = model(row[None], **cache_kwargs(cache), use_cache=True).logits.float()
        lq = torch.log_softmax(logits, -1)
        kl.append(float((fp_lp[i].exp() * (fp_lp[i] - lq)).sum()) / row.numel())
        nll += float(F.cross_entropy(logits[0, :-1], row[1:], reduction="sum"))
    n = ev.shape[0] * (ev.shape[1] - 1)
    return sum(kl) / len(kl), 100 * math.expm1((nll - fp_nll) / n), kl


def paired(a: list[float], b: list[float]) -> str:
    """Mean per-window ratio a/b - 1 in %, ± its standard error."""
    d = [x / y - 1 for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) if len(d) > 1 else 0
    return f"{100 * mean:+.1f} ± {100 * se:.1f} %"


def configs(bits: int) -> list[tuple[str, str, str, str]]:
    """(pair, codebook on K/V/KV, k-means weight, grid) rows; per pair 'uniform' first."""
    rows = []
    for pair in PAIRS if bits == 3 else ("smooth", "kivi-hadv"):
        rows.append((pair, "uniform", "-", "minmax"))
        rows += [(pair, "KV", w, "minmax") for w in ("scale2", "scale2-pinned", "fisher")]
        if bits == 3:
            rows += [(pair, "K", "scale2", "minmax"), (pair, "V", "scale2", "minmax")]
    return rows + ([("smooth", "KV", "scale2", "std")] if bits == 3 else [])


PRESET_VIEWS = {
    "kivi-hadv": ("kchan", "vhad"),
    "per-token-smooth": ("ksmooth", "v"),
    "per-token": ("khad", "v"),
}
PROFILE_VARIANTS = ((0, "-"), (3, "scale2"), (3, "fisher"), (4, "fisher"))


def profile_layers(name: str, probe_layers: int) -> dict:
    """An exported profile by file stem, or ``PRESET:kXvY``: every layer at K X, V Y bits."""
    if ":" not in name:
        return json.loads((SMOOTH.parent / f"{name}.json").read_text())
    preset, widths = name.split(":")
    kb, vb = map(int, widths[1:].split("v"))
    layer = {"k": {"bits": kb}, "v": {"bits": vb}}
    return {"budget": {"preset": preset}, "layers": [layer] * probe_layers}


def profile_rows(probe: Probe, kv, ev, fp_lp, fp_nll: float, fits: dict, name: str) -> list:
    """The exported profile ``name``'s per-layer widths, codebooks on layers of <= N bits."""
    data = profile_layers(name, probe.layers)
    views = PRESET_VIEWS[data["budget"]["preset"]]
    rows, base = [], None
    for upto, weight in PROFILE_VARIANTS:
        how = []
        for part, view in zip("kv", views, strict=True):
            bits = [layer[part]["bits"] for layer in data["layers"]]
            levels = []
            for j, b in enumerate(bits):
                key = (view, b, weight, "minmax")
                if b <= upto and key not in fits:
                    fits[key] = fit(probe, kv, view, b, weight, "minmax")
                levels.append(fits[key]["levels"][j] if b <= upto else None)
            how.append((view, bits, levels, "minmax"))
        kl, dppl, windows = evaluate(probe, ev, fp_lp, fp_nll, *how)
        base = base or windows
        rows.append(dict(profile=name, codebook_bits=upto, weight=weight, kl=kl, dppl=dppl,
                         kl_windows=windows))  # fmt: skip
        label = "uniform" if not upto else f"codebooks on <= {upto}-bit layers"
        print(f"| {name} | {label} | {weight} | {kl:.4f} | {paired(windows, base)} | "
              f"{dppl:+.2f} |", flush=True)  # fmt: skip
    return rows


def uniform_rows(probe: Probe, kv, ev, fp_lp, fp_nll: float, fits: dict, widths: str) -> list:
    """Every layer at one width (``widths``: comma-separated), codebooks per :func:`configs`."""
    rows: list[dict] = []
    base: list[float] = []  # the pair's uniform row (first in configs) per window
    print("| bits | tensors | codebook on | k-means weight | grid | KL | KL vs uniform | Δppl % "
          "| MSE ratio K / V |\n|---|---|---|---|---|---:|---:|---:|---|")  # fmt: skip
    for bits in map(int, filter(None, widths.split(","))):
        for pair, on, weight, mode in configs(bits):
            spec, ratios = [], []
            for part, view in zip("KV", PAIRS[pair], strict=True):
                if on == "uniform" or part not in on:
                    spec.append((view, bits, None, "minmax"))
                    continue
                key = (view, bits, weight, mode)
                if key not in fits:
                    fits[key] = fit(probe, kv, view, bits, weight, mode)
                f = fits[key]
                ref = fits.get((view, bits, "scale2", "minmax"), f)["mse_uniform"]
                ratios.append(f"{f['mse'] / ref:.3f}")
                spec.append((view, bits, f["levels"], mode))
            kl, dppl, windows = evaluate(probe, ev, fp_lp, fp_nll, *spec)
            base = windows if on == "uniform" else base
            rows.append(dict(bits=bits, pair=pair, on=on, weight=weight, mode=mode, kl=kl,
                             dppl=dppl, mse_ratio=ratios, kl_windows=windows))  # fmt: skip
            print(f"| {bits} | {pair} | {on} | {weight} | {mode} | {kl:.4f} | "
                  f"{paired(windows, base)} | {dppl:+.2f} | "
                  f"{' / '.join(ratios) or '-'} |", flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cal-windows", type=int, default=4)
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--bits", default="3,2", help="uniform rows at these widths ('' for none)")
    ap.add_argument("--profiles", default="kivi-hadv-3bit,per-token-smooth-3bit")
    ap.add_argument("--json", default=str(OUT))
    args = ap.parse_args()
    start = time.monotonic()
    model, tok = load_model("smollm2-135m", dtype=torch.float32)
    cal = load_eval_windows(tok, dataset=str(DATA / "valid.txt"), num_windows=args.cal_windows)
    ev = load_eval_windows(tok, num_windows=args.eval_windows).tokens
    lam = [torch.tensor(x["k_smooth"]) for x in json.loads(SMOOTH.read_text())["layers"]]
    probe = Probe(model, lam)
    kv = record(model, cal.tokens)
    with torch.inference_mode():
        fp_lp = [torch.log_softmax(model(r[None]).logits.float(), -1) for r in ev]
    fp_nll = sum(
        -float(lp[0, :-1].gather(-1, r[1:, None]).sum()) for lp, r in zip(fp_lp, ev, strict=True)
    )
    fits: dict = {}
    rows = uniform_rows(probe, kv, ev, fp_lp, fp_nll, fits, args.bits)
    print("| profile | levels | k-means weight | KL | KL vs uniform | Δppl % |")
    print("|---|---|---|---:|---:|---:|")
    for name in filter(None, args.profiles.split(",")):
        rows += profile_rows(probe, kv, ev, fp_lp, fp_nll, fits, name)
    out = dict(command="OMP_NUM_THREADS=1 python benchmarks/nuq_probe.py", args=vars(args),
               fp_ppl=math.exp(fp_nll / (ev.shape[0] * (ev.shape[1] - 1))), rows=rows,
               wall_s=round(time.monotonic() - start), threads=torch.get_num_threads())  # fmt: skip
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"fp ppl {out['fp_ppl']:.3f}; {out['wall_s']} s; wrote {args.json}")


if __name__ == "__main__":
    main()
