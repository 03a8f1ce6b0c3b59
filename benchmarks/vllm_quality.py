"""vLLM rows of the quality table: a vLLM KV dtype D on every layer vs kvtuner's skip set (from
a vLLM profile) at the same bytes or fewer, and what each layer's fp8 saturation costs.

Rows (kind ``vllm``, one run, same windows, paired): perplexity, and the mean per-token
KL(fp || row) (what the search minimises; ppl can move toward fp's while the distribution moves
away from it); fp; D on every layer; each given vLLM
profile (D, its skip set); ``--top-k K``: D with the K most saturated layers skipped (a naive
rule); ``--boundary N``: the first and last N layers skipped (vLLM's own TurboQuant boundary
protection, N=2). Perplexity: WikiText-2 test, first N non-overlapping windows of ``--seq-len``
tokens, every layer's K/V stored as vLLM stores it (HF cache emulation, prefill included) before
any query reads it. Bytes per token as vLLM 0.32 allocates them (bf16 model). Saturation: per
layer, the share of K and V elements beyond the fp8 format's max at scale 1.0 on the first
window (0 for the per-token-head formats), and the largest |K| and |V|.

    OMP_NUM_THREADS=1 python benchmarks/vllm_quality.py --model smollm2-135m \\
        --profile exported_configs/smollm2-135m/vllm-fp8_e4m3-0.55x.json [--num-windows 32]
    OMP_NUM_THREADS=1 python benchmarks/vllm_quality.py --model smollm2-135m \\
        --kv-cache-dtype int4_per_token_head \\
        --profile exported_configs/smollm2-135m/vllm-int4_per_token_head-0.4x.json

Writes benchmarks/results/vllm_quality-<model>-<dtype>.json and prints a table.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import torch

from kvtuner.calibration import load_model
from kvtuner.evaluation import hardware, load_eval_windows
from kvtuner.evaluation.divergence import WindowScores, window_scores
from kvtuner.evaluation.perplexity import PerplexityResult
from kvtuner.profile import ModelFingerprint, load_vllm_profile, write_json_atomic
from kvtuner.quant.vllm_format import VllmKVFormat
from kvtuner.runtime_loader.hf import cache_kwargs
from kvtuner.runtime_loader.hf.vllm_cache import make_vllm_cache
from kvtuner.runtime_loader.vllm import VllmLayout, VllmPlan

RESULTS = Path(__file__).parent / "results"


@torch.inference_mode()
def saturation(model, ids: torch.Tensor, fmt: VllmKVFormat) -> list[dict]:
    """Per layer: share of K and V elements with |x| / scale above the format's max (0 for the
    per-token-head formats: their scale comes from each row's range), and the largest |K| and
    |V| (post-RoPE keys, as vLLM stores them)."""
    fmax = math.inf if fmt.per_token_head else torch.finfo(fmt.storage_dtype).max
    n = model.config.num_hidden_layers
    cache = make_vllm_cache(model, VllmPlan(fmt.kv_cache_dtype, n, tuple(range(n))))
    model(ids[None], **cache_kwargs(cache), use_cache=True)
    out = []
    for layer in cache.layers:  # every layer skipped: keys/values hold the raw states
        k, v = layer.keys.float(), layer.values.float()
        over = (k.abs() / fmt.k_scale > fmax).sum() + (v.abs() / fmt.v_scale > fmax).sum()
        share = float(over) / (k.numel() + v.numel())
        out.append({"share": share, "max_abs_k": float(k.abs().max()),
                    "max_abs_v": float(v.abs().max())})  # fmt: skip
    return out


def _row(name, plan, scores: WindowScores, fp_scores: WindowScores, layout) -> dict:
    fp = fp_scores.result
    result = scores.result
    row = {"name": name, "kind": "vllm" if plan else "fp", "ppl": result.ppl,
           "window_nll": list(result.window_nll),
           **scores.divergence_fields(fp_scores)}  # fmt: skip
    if plan is not None:
        bpt = layout.bytes_per_token(plan)
        row.update(kv_cache_dtype=plan.kv_cache_dtype, skip_layers=list(plan.skip_layers),
                   bytes_per_token=bpt, ratio=bpt / layout.fp_bytes_per_token(),
                   delta_pct=result.delta_pct(fp),
                   delta_se_pct=result.delta_se_pct(fp))  # fmt: skip
    return row


def _paired(a: PerplexityResult, b: PerplexityResult) -> tuple[float, int]:
    """Mean per-window NLL gain of a over b (nats/token) and windows where a is better."""
    d = [(y - x) / a.tokens_per_window for x, y in zip(a.window_nll, b.window_nll, strict=True)]
    return sum(d) / len(d), sum(x > 0 for x in d)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--kv-cache-dtype", default="fp8_e4m3")
    p.add_argument("--profile", action="append", default=[], help="vLLM profile(s) to compare")
    p.add_argument("--top-k", type=int, default=0, help="also skip the K most saturated layers")
    p.add_argument(
        "--boundary",
        type=int,
        default=0,
        help="also skip the first N and last N layers (vLLM's TurboQuant boundary rule, N=2)",
    )
    p.add_argument("--num-windows", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--dataset", default=None)
    args = p.parse_args(argv)
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/vllm_quality.py " + (
        shlex.join(sys.argv[1:] if argv is None else argv)
    )
    model, tokenizer = load_model(args.model, device="cpu", dtype="float32")
    fp_print = ModelFingerprint.from_config(model.config)
    layout, n = VllmLayout(fp_print), fp_print.num_layers
    windows = load_eval_windows(tokenizer, dataset=args.dataset, num_windows=args.num_windows,
                                seq_len=args.seq_len)  # fmt: skip
    stats = saturation(model, windows.tokens[0], VllmKVFormat(args.kv_cache_dtype))
    sat = [max(s["share"], s["max_abs_k"] * 1e-9) for s in stats]  # rank by share, then |K|
    plans = [(f"{args.kv_cache_dtype} every layer", VllmPlan(args.kv_cache_dtype, n))]
    for path in args.profile:
        prof = load_vllm_profile(path)
        prof.check_model(fp_print)
        if prof.plan.kv_cache_dtype != args.kv_cache_dtype:
            p.error(f"{path} is a {prof.plan.kv_cache_dtype} profile; pass --kv-cache-dtype "
                    f"{prof.plan.kv_cache_dtype}")  # fmt: skip
        plans.append((f"kvtuner skip {list(prof.plan.skip_layers)}", prof.plan))
    if args.boundary:
        edge = sorted({*range(args.boundary), *range(n - args.boundary, n)})
        plans.append((f"boundary {edge}", VllmPlan(args.kv_cache_dtype, n, edge)))
    if args.top_k:
        worst = sorted(range(n), key=lambda i: -sat[i])[: args.top_k]
        plans.append((f"skip {args.top_k} most saturated", VllmPlan(args.kv_cache_dtype, n, worst)))
    caches = [(name, lambda plan=plan: make_vllm_cache(model, plan)) for name, plan in plans]
    scores = window_scores(model, windows, caches)
    fp = scores["fp"].result
    rows = [_row("fp", None, scores["fp"], scores["fp"], layout)]
    for name, plan in plans:
        r = _row(name, plan, scores[name], scores["fp"], layout)
        rows.append(r)
        print(f"{name:<40} ppl {r['ppl']:.4f} ({r['delta_pct']:+.3f}% ± {r['delta_se_pct']:.3f}) "
              f"KL {r['kl']:.5f} ± {r['kl_se']:.5f} top-1 = fp {100 * r['top1_agree']:.2f}% "
              f"ΔNLL where fp right/wrong {r['dnll_fp_right']:+.4f}/{r['dnll_fp_wrong']:+.4f} "
              f"{r['bytes_per_token']} B/token "
              f"({r['ratio']:.4f}x)")  # fmt: skip
    base = scores[plans[0][0]].result
    for name, _plan in plans[1:]:
        gain, wins = _paired(scores[name].result, base)
        print(
            f"{name}: {gain:+.5f} nats/token vs every layer, better on {wins}/{len(fp.window_nll)}"
        )
    out = RESULTS / f"vllm_quality-{args.model}-{args.kv_cache_dtype}.json"
    write_json_atomic(out, {"command": command, "hardware": hardware(), "model": args.model,
                            "windows": windows.describe(), "fp_ppl": fp.ppl,
                            "saturation_per_layer": stats, "rows": rows})  # fmt: skip
    ranked = sorted(range(n), key=lambda i: -sat[i])[:5]
    what = f"largest |K| in layers {ranked}"  # per-token-head formats do not saturate
    if max(s["share"] for s in stats) > 0:
        what = f"most saturated layers: {ranked} ({max(sat):.2e} of elements)"
    print(f"fp ppl {fp.ppl:.4f}; {what}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
