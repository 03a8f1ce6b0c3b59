"""Per-layer KV recipes in the engines' formats, against their peers, in one run on one model.

Rows (same test windows, paired with fp; every cache stores K/V exactly as vLLM would):

- ``uniform fp8`` / ``uniform nvfp4``: one format on every layer, per-layer scales amax / 448;
- ``turboquant <preset> (vLLM default)``: vLLM's TurboQuant with its boundary layers (first 2,
  last 2) at the model dtype, as vLLM serves it without a skip list;
- ``modelopt additive @B``: ModelOpt's layer-wise AutoQuantize reproduced: forward KL with one
  layer at a time in FP8 or NVFP4 (the rest unquantized), summed, exact knapsack at B bits;
- ``kvtuner fp8/nvfp4 @B``: kvtuner's whole-recipe search over the same two formats;
- ``kvtuner auto/fp8/nvfp4 @B``: over what vLLM's and TensorRT-LLM's per-layer maps serve, the
  model dtype included.

Searches calibrate on WikiText-2 validation windows; rows are scored on test windows::

    OMP_NUM_THREADS=2 python benchmarks/recipe_peers.py --model smollm2-135m

Writes benchmarks/results/recipe_peers-<model>.json and prints a table.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvtuner import search
from kvtuner.calibration import load_model
from kvtuner.evaluation import hardware, load_eval_windows
from kvtuner.evaluation.divergence import mean_se, window_scores
from kvtuner.profile import ModelFingerprint, write_json_atomic
from kvtuner.quant.engine_recipe import EngineRecipe
from kvtuner.runtime_loader.hf.vllm_cache import make_vllm_cache
from kvtuner.runtime_loader.vllm import VllmPlan

RESULTS = Path(__file__).parent / "results"
SEARCHES = {"fp8/nvfp4": ("fp8", "nvfp4"), "auto/fp8/nvfp4": ("auto", "fp8", "nvfp4")}


def _bits(plan, fp: ModelFingerprint) -> float:
    """Effective bits per element as ModelOpt counts them (model dtype 16), mean over layers."""
    per_layer = []
    for i in range(fp.num_layers):
        sides = plan.layer_formats(i)
        per_layer.append(sum(16 if s is None else 8 * s.side_bytes(fp.head_dim, w) / fp.head_dim
                             for s, w in zip(sides, "kv", strict=True)) / 2)  # fmt: skip
    return sum(per_layer) / len(per_layer)


def _searched(args, loaded, budget: str, formats, out: Path, log) -> tuple[dict, EngineRecipe]:
    engine = "vllm" if "auto" in formats else "modelopt"
    outcome = search(target="recipe", engine=engine, budget=budget, formats=formats,
                     model=args.model, output=out, loaded=loaded, progress=False,
                     n_trials=args.n_trials, num_samples=args.num_samples,
                     seq_len=args.calib_len, confirm_samples=args.confirm_samples,
                     storage=f"sqlite:///{out.parent / 'study.db'}", log=log)  # fmt: skip
    return outcome.profile.metrics, outcome.profile.recipe


def _plans(args, loaded, fp: ModelFingerprint, work: Path, log) -> tuple[dict, dict]:
    """name -> plan, and name -> search facts (calibration KL of kvtuner vs ModelOpt's pick)."""
    plans, facts, base = {}, {}, None
    for budget in args.budgets:
        for label, formats in SEARCHES.items():
            t0 = time.monotonic()
            out = work / f"{budget}-{len(formats)}.json"
            metrics, recipe = _searched(args, loaded, budget, formats, out, log)
            if args.export:  # the searched profile, as exported_configs/<model>/ keeps them
                engine = "vllm" if "auto" in formats else "modelopt"
                args.export.mkdir(parents=True, exist_ok=True)
                shutil.copy(out, args.export / f"recipe-{engine}-{budget}.json")
            base = recipe.with_layers(("auto",) * fp.num_layers)
            plans[f"kvtuner {label} @{budget}"] = recipe
            facts[f"kvtuner {label} @{budget}"] = {**metrics, "seconds": time.monotonic() - t0}
            if label == "fp8/nvfp4":
                plans[f"modelopt additive @{budget}"] = recipe.with_layers(
                    tuple(metrics["modelopt_layers"])
                )
    for f in ("fp8", "nvfp4"):
        plans[f"uniform {f}"] = base.with_layers((f,) * fp.num_layers)
    for preset in args.turboquant:
        plans[f"{preset} (vLLM default)"] = VllmPlan(preset, fp.num_layers)
    return plans, facts


def _row(name, plan, scores, fp, facts) -> dict:
    result, fp_result = scores[name].result, scores["fp"].result
    row = {"name": name, "ppl": result.ppl, "delta_pct": result.delta_pct(fp_result),
           "delta_se_pct": result.delta_se_pct(fp_result), "effective_bits": _bits(plan, fp),
           "window_nll": list(result.window_nll),
           **scores[name].divergence_fields(scores["fp"])}  # fmt: skip
    layers = getattr(plan, "layers", None)
    if layers is not None:
        row["layers"] = list(layers)
    if name in facts:
        row["search"] = facts[name]
    return row


def _paired(rows: list[dict]) -> list[dict]:
    """Each kvtuner row against ModelOpt's pick at its budget, window by window: mean KL
    difference (negative: kvtuner closer to fp) ± its standard error, and windows won."""
    by_name = {r["name"]: r for r in rows}
    out = []
    for r in rows:
        if not r["name"].startswith("kvtuner"):
            continue
        peer = by_name[f"modelopt additive @{r['name'].rsplit('@', 1)[1]}"]
        diff = [a - b for a, b in zip(r["window_kl"], peer["window_kl"], strict=True)]
        mean, se = mean_se(diff)
        out.append({"row": r["name"], "vs": peer["name"], "kl_diff": mean, "kl_diff_se": se,
                    "windows_better": sum(d < 0 for d in diff), "windows": len(diff)})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--budgets", nargs="+", default=["5.4bit", "4.75bit"])
    p.add_argument("--turboquant", nargs="*", default=["turboquant_4bit_nc", "turboquant_k3v4_nc"])
    p.add_argument("--n-trials", type=int, default=16)
    p.add_argument("--num-samples", type=int, default=8)
    p.add_argument("--calib-len", type=int, default=256)
    p.add_argument("--confirm-samples", type=int, default=4)
    p.add_argument("--num-windows", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--export", type=Path, help="copy each searched profile into this folder")
    args = p.parse_args(argv)
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/recipe_peers.py " + (
        shlex.join(sys.argv[1:] if argv is None else argv)
    )
    model, tokenizer = load_model(args.model, device="cpu", dtype="float32")
    fp = ModelFingerprint.from_config(model.config)
    with tempfile.TemporaryDirectory() as work:
        plans, facts = _plans(args, (model, tokenizer), fp, Path(work), lambda s: None)
    windows = load_eval_windows(tokenizer, num_windows=args.num_windows, seq_len=args.seq_len)
    caches = [(name, lambda p=plan: make_vllm_cache(model, p)) for name, plan in plans.items()]
    scores = window_scores(model, windows, caches)
    rows = [_row(name, plan, scores, fp, facts) for name, plan in plans.items()]
    print(f"{'row':<34} {'bits':>6} {'ppl':>9} {'Δppl %':>14} {'KL':>18} {'top-1 = fp':>11}")
    for r in rows:
        print(f"{r['name']:<34} {r['effective_bits']:6.3f} {r['ppl']:9.4f} "
              f"{r['delta_pct']:+7.3f} ± {r['delta_se_pct']:.3f} {r['kl']:.5f} ± {r['kl_se']:.5f} "
              f"{100 * r['top1_agree']:10.2f}%")  # fmt: skip
    paired = _paired(rows)
    for c in paired:
        print(f"{c['row']} vs {c['vs']}: KL {c['kl_diff']:+.5f} ± {c['kl_diff_se']:.5f}, "
              f"closer to fp on {c['windows_better']}/{c['windows']} windows")  # fmt: skip
    out = RESULTS / f"recipe_peers-{args.model}.json"
    write_json_atomic(out, {"command": command, "hardware": hardware(), "model": args.model,
                            "windows": windows.describe(), "fp_ppl": scores["fp"].result.ppl,
                            "rows": rows, "paired": paired})  # fmt: skip
    print(f"fp ppl {scores['fp'].result.ppl:.4f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
