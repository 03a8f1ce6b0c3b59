"""Wall time of the full SmolLM2 sensitivity sweep (30 layers x K/V x 2/4/8 bits), or (--what
search) of the whole `kvtuner search --budget 4bit`, on any device.

Counts the decoder-layer forwards it took (calls, and rows run: one row = one calibration
sequence through one layer) against the naive sweep (one full forward per variant), prints the
per-layer sensitivity picture and, with --reference, how well this run's per-layer ranking agrees
with another sensitivity file (Spearman rank correlation per column).

CPU time (all threads of this process) is reported beside wall time: on a shared machine it
shows what the sweep costs when it has the cores to itself.

    python benchmarks/calibration_time.py [--num-samples 4 --seq-len 256 --threads 2]
        [--save-sensitivity s.json] [--reference big.json] [--json benchmarks/results/X.json]

Search mode: the whole search (calibration, study, confirmation, profile) with the CLI's
defaults, wall time and peak GPU memory (torch.cuda.max_memory_allocated), on SmolLM2 or on a
randomly initialised model of Llama-3.1-8B's shape built from a config (32 layers, 32 query /
8 KV heads, head_dim 128, vocab 128256; no weights are reachable offline; byte tokenizer):

    python benchmarks/calibration_time.py --what search --device cuda --model smollm2-135m
    python benchmarks/calibration_time.py --what search --device cuda --model llama-3.1-8b-shape
    (CPU proof: --device cpu --model llama-3.1-8b-shape --tiny --n-trials 4 --num-samples 1
     --seq-len 32 --confirm-samples 1)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvtuner.calibration import Sensitivity, calibrate, load_calibration_data, load_model
from kvtuner.calibration.batches import DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN
from kvtuner.calibration.runner import decoder_layers
from kvtuner.calibration.sweep import layer_forwards
from kvtuner.errors import KVTunerError
from kvtuner.placement import peak_memory_bytes, placement, synchronize
from kvtuner.profile import write_json_atomic
from kvtuner.search_spaces import load_preset

sys.path.insert(0, str(Path(__file__).parent))
from random_llama import random_llama  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "calibration_time.json"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


class Counter:
    """Decoder-layer forward calls and rows (batch entries) run, lm_head calls."""

    def __init__(self, model):
        self.calls = self.rows = self.lm_head = 0
        for layer in decoder_layers(model):
            layer.register_forward_pre_hook(self._layer, with_kwargs=True)
        model.get_output_embeddings().register_forward_pre_hook(self._head)

    def _layer(self, _m, args, kwargs):
        self.calls += 1
        self.rows += (args[0] if args else kwargs["hidden_states"]).shape[0]

    def _head(self, *_):
        self.lm_head += 1


def spearman(a: list[float], b: list[float]) -> float:
    ra = torch.tensor(a).argsort().argsort().double()
    rb = torch.tensor(b).argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def columns(sens: Sensitivity) -> dict[str, list[float]]:
    return {
        f"{p.upper()}{b}": [sens.kl(i, p, b) for i in range(len(sens.layers))]
        for p in ("k", "v")
        for b in sens.bits
    }


def picture(sens: Sensitivity) -> dict:
    """Most key-/value-sensitive layers and how keys compare with values, per bit width."""
    cols, n = columns(sens), len(sens.layers)
    out = {}
    for b in sens.bits:
        k, v = cols[f"K{b}"], cols[f"V{b}"]
        out[str(b)] = {
            "top_k_layers": sorted(range(n), key=lambda i: -k[i])[:5],
            "top_v_layers": sorted(range(n), key=lambda i: -v[i])[:5],
            "sum_k": sum(k),
            "sum_v": sum(v),
            "layers_k_worse_than_v": sum(ki > vi for ki, vi in zip(k, v, strict=True)),
        }
    return out


def run_search(args: argparse.Namespace) -> dict:
    from kvtuner import search
    from kvtuner.tuner.study import StudySettings

    torch.set_num_threads(args.threads)
    where = placement(args.device, args.dtype)
    start = time.perf_counter()
    smollm2 = args.model == "smollm2-135m"
    loaded = None if smollm2 else random_llama(args.device, args.dtype, args.tiny)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KVTUNER_CACHE_DIR"] = tmp  # a cold sweep: no cached layer from a rerun
        outcome = search(
            model=args.model,
            budget="4bit",
            output=Path(tmp) / "profile.json",
            study=StudySettings(n_trials=args.n_trials),
            num_samples=args.num_samples or 2,  # the CLI's default
            seq_len=args.seq_len,
            confirm_samples=args.confirm_samples,
            progress=False,
            device=where.device,
            dtype=where.dtype,
            batch_size=args.batch_size,
            loaded=loaded,
            log=lambda _: None,
        )
    synchronize(where.torch_device)
    peak = peak_memory_bytes(where.torch_device)
    p = outcome.profile
    return {
        "what": "search --budget 4bit",
        "model": args.model + (" (tiny)" if args.tiny else ""),
        "layers": p.fingerprint.num_layers,
        "device": where.describe()["device"],
        "dtype": where.dtype,
        "tokens": (args.num_samples or 2) * args.seq_len,
        "confirm_tokens": args.confirm_samples * args.seq_len,
        "trials": outcome.trials,
        "seconds": round(time.perf_counter() - start, 2),
        "peak_gpu_gib": None if peak is None else round(peak / 2**30, 2),
        "kl": outcome.best.kl,
        "nominal_bits": p.nominal_bits,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
    }


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m", device=args.device, dtype=args.dtype)
    data = load_calibration_data(
        tokenizer,
        num_samples=args.num_samples or DEFAULT_NUM_SAMPLES,
        seq_len=args.seq_len,
        seed=args.seed,
    )
    counter = Counter(model)
    load_before = os.getloadavg()
    start, cpu_start = time.perf_counter(), time.process_time()
    preset = load_preset(args.preset)
    sens = calibrate(
        model,
        data,
        model_id="smollm2-135m",
        key_spec=preset.key,
        value_spec=preset.value,
        use_cache=False,
        progress=True,
        batch_size=args.batch_size,
    )
    synchronize(next(model.parameters()).device)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if args.save_sensitivity:
        sens.save(args.save_sensitivity)
    num_layers, n = len(sens.layers), data.num_samples
    result = {
        "model": "smollm2-135m",
        "preset": args.preset,
        "tokens": data.tokens.numel(),
        "num_samples": n,
        "seq_len": data.seq_len,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "layer_forward_calls": counter.calls,
        "layer_forwards": counter.rows // n,
        "layer_forwards_predicted": layer_forwards(num_layers, len(sens.bits)),
        "layer_forwards_naive": (1 + 2 * len(sens.bits) * num_layers) * num_layers,
        "lm_head_calls": counter.lm_head,
        "fp_ppl": round(sens.fp_ppl, 4),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "picture": picture(sens),
    }
    if args.reference:
        ref = columns(Sensitivity.load(args.reference))
        mine = columns(sens)
        result["reference"] = args.reference
        result["spearman_vs_reference"] = {c: round(spearman(mine[c], ref[c]), 3) for c in mine}
    return result


def table(r: dict) -> str:
    rows = [
        ("preset", r["preset"]),
        ("calibration tokens", f"{r['num_samples']} x {r['seq_len']} = {r['tokens']}"),
        ("sweep wall time", f"{r['seconds']:.1f} s"),
        ("sweep CPU time (all threads)", f"{r['cpu_seconds']:.1f} s"),
        ("decoder-layer forward calls", r["layer_forward_calls"]),
        (
            "layer-forwards (per sequence)",
            f"{r['layer_forwards']} (naive full forwards: {r['layer_forwards_naive']})",
        ),
        ("lm_head calls", r["lm_head_calls"]),
        ("fp ppl", r["fp_ppl"]),
        ("torch threads / cores", f"{r['threads']} / {r['cores']}"),
        ("cpu", r["cpu"]),
        ("load avg before / after", f"{r['loadavg_before']} / {r['loadavg_after']}"),
    ]
    for b, p in r["picture"].items():
        rows.append((f"top K{b} / V{b} layers", f"{p['top_k_layers']} / {p['top_v_layers']}"))
        rows.append(
            (
                f"sum KL K{b} / V{b}",
                f"{p['sum_k']:.3e} / {p['sum_v']:.3e} "
                f"(K worse in {p['layers_k_worse_than_v']} layers)",
            )
        )
    for c, rho in r.get("spearman_vs_reference", {}).items():
        rows.append((f"Spearman {c} vs reference", rho))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--num-samples", type=int, help=f"default {DEFAULT_NUM_SAMPLES}; search mode: 2 (CLI's)"
    )
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default="per-token", help="per-token or kivi K/V specs")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--save-sensitivity", help="also write the sensitivity JSON here")
    p.add_argument("--reference", help="sensitivity JSON to compare the per-layer ranking with")
    p.add_argument("--json", default=str(RESULTS), help="result JSON (default %(default)s)")
    p.add_argument("--what", choices=("sweep", "search"), default="sweep")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-size", type=int, help="calibration windows per forward")
    p.add_argument(
        "--model", default="smollm2-135m", choices=("smollm2-135m", "llama-3.1-8b-shape")
    )
    p.add_argument("--tiny", action="store_true", help="shrink the random model (CPU proof)")
    p.add_argument("--n-trials", type=int, default=40, help="search mode (CLI default)")
    p.add_argument("--confirm-samples", type=int, default=4, help="search mode (CLI default)")
    args = p.parse_args()
    if args.what == "search":
        if args.json == str(RESULTS):
            args.json = str(RESULTS.with_name(f"search_time_{args.model}.json"))
        result = run_search(args)
        print("\n".join(f"{k:<16} {v}" for k, v in result.items()))
        write_json_atomic(args.json, result)
        print(f"wrote {args.json}")
        return
    result = run(args)
    print(table(result))
    write_json_atomic(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KVTunerError as err:  # e.g. --device cuda without a GPU: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
