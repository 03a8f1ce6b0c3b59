"""Issue 15, pre-RoPE key probe: are keys easier to quantize before the rotary embedding?

KVQuant's observation: RoPE turns each channel pair of a key into a position-dependent rotation,
so a channel's values swing sinusoidally along the tokens, and a channel-axis (KIVI) group of
32 tokens spans that swing instead of the channel's own magnitude. Before RoPE a channel's scale
is stable along the tokens.

The probe keeps the real packed HF cache (``make_cache(..., residual_length=0)``: every token,
prefill included, is quantized before any query reads it) and wraps each layer's ``update``:
the post-RoPE keys the model hands over are rotated back to position 0 with the model's own
frequencies (``k_pre = k·cos - rotate_half(k)·sin``, exact up to rounding), the layer's own
``PackedStream`` packs them, and the dequantized keys are rotated forward again before attention.
Values are untouched. Attention is unchanged up to the quantization error, which ``u:kv16``
checks (KL there is rounding only).

Evaluation: KL(fp || quantized) per position and Δppl vs fp on the first ``--eval-windows``
1024-token windows of WikiText-2 test, each row paired per window with the same specs stored
post-RoPE (today's cache).

    OMP_NUM_THREADS=1 python benchmarks/prerope_probe.py [--eval-windows 4]

Prints a table, writes benchmarks/results/prerope_probe.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
from sink_probe import fmt, mean_se, paired_ratio, specs_of

from kvtuner.calibration import load_model
from kvtuner.evaluation import load_eval_windows
from kvtuner.runtime_loader.hf import make_cache

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "prerope_probe.json"
DEFAULT_ROWS = "u:kv16,u:kivi3,u:kivi-hadv-kv3,kivi-hadv-3bit,u:kivi4,kivi-4bit,u:k3v16,u:kv4"


def rope_tables(model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, D] of positions 0..n-1 with the model's own frequencies (rotate_half layout)."""
    inv_freq = model.model.rotary_emb.inv_freq.float()  # [D/2]
    angle = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos(), angle.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def patch(cache, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Each layer stores its keys rotated back to position 0 and rotates them forward on read."""
    for layer in cache.layers:

        def update(k, v, *_a, _layer=layer, **_kw):
            if _layer.is_initialized:
                raise RuntimeError("the probe evaluates one prefill per cache")
            _layer.lazy_initialization(k, v)
            c, s = cos[: k.shape[-2]].to(k.dtype), sin[: k.shape[-2]].to(k.dtype)
            _layer.k.store(k * c - rotate_half(k) * s)
            _layer.v.store(v)
            back = _layer.k.read(k.dtype)
            _layer.keys, _layer.values = _layer.k.tail, _layer.v.tail
            return back * c + rotate_half(back) * s, _layer.v.read(v.dtype)

        layer.update = update


@torch.inference_mode()
def evaluate(model, ev, specs, fp_lp, tables) -> dict:
    """Per window: mean KL(fp || quant) per position and summed NLL."""
    out: dict[str, list[float]] = {"kl": [], "nll": []}
    for i, row in enumerate(ev):
        cache = make_cache(model, specs, residual_length=0)
        if tables is not None:
            patch(cache, *tables)
        logits = model(row[None], past_key_values=cache, use_cache=True).logits.float()
        lp = torch.log_softmax(logits, -1)
        out["kl"].append(float((fp_lp[i].exp() * (fp_lp[i] - lp)).sum(-1).mean()))
        out["nll"].append(float(-lp[0, :-1].gather(-1, row[1:, None]).sum()))
    return out


def summary(got: dict, base: dict, fp_nll: list[float], tokens: int) -> dict:
    paired = base is not got and min(base["kl"]) > 0
    ppl = math.exp(sum(got["nll"]) / tokens)
    fp_ppl = math.exp(sum(fp_nll) / tokens)
    return {
        "kl": mean_se(got["kl"])[0],
        "kl_vs_post": paired_ratio(got["kl"], base["kl"]) if paired else None,
        "dppl_pct": 100 * (ppl / fp_ppl - 1),
        "per_window": got,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="profile stems, or u:<uniform name>")
    ap.add_argument("--json", default=str(OUT))
    args = ap.parse_args()
    start = time.monotonic()
    model, tok = load_model("smollm2-135m", device="cpu", dtype="float32")
    ev = load_eval_windows(tok, num_windows=args.eval_windows).tokens
    tables = rope_tables(model, ev.shape[1])
    with torch.inference_mode():
        fp_lp = [torch.log_softmax(model(r[None]).logits.float(), -1) for r in ev]
    fp_nll = [
        float(-lp[0, :-1].gather(-1, r[1:, None]).sum()) for lp, r in zip(fp_lp, ev, strict=True)
    ]
    tokens = len(ev) * (ev.shape[1] - 1)
    print("| row | keys stored | KL | KL vs post-RoPE | Δppl % |\n|---|---|---:|---:|---:|")
    rows = []
    for name in args.rows.split(","):
        specs = specs_of(name, model)
        post = evaluate(model, ev, specs, fp_lp, None)
        pre = evaluate(model, ev, specs, fp_lp, tables)
        for where, got in (("post-RoPE", post), ("pre-RoPE", pre)):
            s = summary(got, post, fp_nll, tokens)
            vs = fmt(s["kl_vs_post"]) if s["kl_vs_post"] else ""
            print(f"| {name} | {where} | {s['kl']:.4f} | {vs} | {s['dppl_pct']:+.2f} |", flush=True)
            rows.append({"row": name, "keys": where, **s})
    out = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/prerope_probe.py " + " ".join(sys.argv[1:]),
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "windows": len(ev),
        "fp_ppl": math.exp(sum(fp_nll) / tokens),
        "wall_s": round(time.monotonic() - start, 1),
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wall {out['wall_s']} s -> {args.json}")


if __name__ == "__main__":
    main()
