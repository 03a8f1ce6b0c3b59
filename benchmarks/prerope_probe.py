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
from sink_probe import fmt, paired_ratio, specs_of

from kvtuner.attention.rope import rope_rotate
from kvtuner.calibration import load_model
from kvtuner.evaluation import load_eval_windows
from kvtuner.evaluation.divergence import mean_se
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache
from kvtuner.runtime_loader.hf.rope import key_rope_of

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "prerope_probe.json"
DEFAULT_ROWS = "u:kv16,u:kivi3,u:kivi-hadv-kv3,kivi-hadv-3bit,u:kivi4,kivi-4bit,u:k3v16,u:kv4"


def patch(cache, model) -> None:
    """Each layer stores its keys rotated back to position 0 and rotates them forward on read."""
    for i, layer in enumerate(cache.layers):
        freq = key_rope_of(model, i).inv_freq

        def update(k, v, *_a, _layer=layer, _freq=freq, **_kw):
            if _layer.is_initialized:
                raise RuntimeError("the probe evaluates one prefill per cache")
            _layer.lazy_initialization(k, v)
            _layer.k.store(rope_rotate(k, _freq, 0, forward=False).to(k.dtype))
            _layer.v.store(v)
            back = rope_rotate(_layer.k.read(k.dtype), _freq, 0, forward=True)
            _layer.keys, _layer.values = _layer.k.tail, _layer.v.tail
            return back.to(k.dtype), _layer.v.read(v.dtype)

        layer.update = update


def load_windows(n: int):
    """SmolLM2 in fp32 on CPU and the protocol's first ``n`` WikiText-2 test windows [n, 1024]."""
    model, tok = load_model("smollm2-135m", device="cpu", dtype="float32")
    return model, load_eval_windows(tok, num_windows=n).tokens


def fp_reference(model, ev) -> tuple[list[torch.Tensor], list[float], int]:
    """The fp model on the windows: log-probs per window, summed NLL per window, token count."""
    with torch.inference_mode():
        fp_lp = [torch.log_softmax(model(r[None]).logits.float(), -1) for r in ev]
    pairs = zip(fp_lp, ev, strict=True)
    fp_nll = [float(-lp[0, :-1].gather(-1, r[1:, None]).sum()) for lp, r in pairs]
    return fp_lp, fp_nll, len(ev) * (ev.shape[1] - 1)


@torch.inference_mode()
def evaluate(model, ev, specs, fp_lp, patcher=None) -> dict:
    """Per window: mean KL(fp || quant) per position and summed NLL; ``patcher(cache)`` wraps
    each window's fresh packed cache (None: the cache as it is)."""
    out: dict[str, list[float]] = {"kl": [], "nll": []}
    for i, row in enumerate(ev):
        cache = make_cache(model, specs, residual_length=0)
        if patcher is not None:
            patcher(cache)
        logits = model(row[None], **cache_kwargs(cache), use_cache=True).logits.float()
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


def write_results(path: str, script: str, start: float, ev, rows: list, **extra) -> None:
    """The probe's JSON (command, machine, threads, windows, wall time, rows), then one line."""
    out = {
        "command": f"OMP_NUM_THREADS=1 python benchmarks/{script} " + " ".join(sys.argv[1:]),
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "windows": len(ev),
        **extra,
        "wall_s": round(time.monotonic() - start, 1),
        "rows": rows,
    }
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wall {out['wall_s']} s -> {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="profile stems, or u:<uniform name>")
    ap.add_argument("--json", default=str(OUT))
    args = ap.parse_args()
    start = time.monotonic()
    model, ev = load_windows(args.eval_windows)
    fp_lp, fp_nll, tokens = fp_reference(model, ev)
    print("| row | keys stored | KL | KL vs post-RoPE | Δppl % |\n|---|---|---:|---:|---:|")
    rows = []
    for name in args.rows.split(","):
        specs = specs_of(name, model)
        post = evaluate(model, ev, specs, fp_lp, None)
        pre = evaluate(model, ev, specs, fp_lp, lambda cache: patch(cache, model))
        for where, got in (("post-RoPE", post), ("pre-RoPE", pre)):
            s = summary(got, post, fp_nll, tokens)
            vs = fmt(s["kl_vs_post"]) if s["kl_vs_post"] else ""
            print(f"| {name} | {where} | {s['kl']:.4f} | {vs} | {s['dppl_pct']:+.2f} |", flush=True)
            rows.append({"row": name, "keys": where, **s})
    fp_ppl = math.exp(sum(fp_nll) / tokens)
    write_results(args.json, "prerope_probe.py", start, ev, rows, fp_ppl=fp_ppl)


if __name__ == "__main__":
    main()
