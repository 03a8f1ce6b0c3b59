"""Issue 15, attention-sink probe: how much of the quantization loss do the first few tokens carry?

Keeps the first N tokens of each sequence (the attention sinks; IntactKV, KVQuant's sink-aware
idea) unquantized, rounded to fp16, and quantizes the rest with the real packed HF cache
(``make_cache(..., residual_length=0)``: every other token, prefill included, is quantized
before any query reads it). SmolLM2 and Qwen2.5 add no BOS token, so the sink is each window's
first text token. Per layer, the wrapped ``update`` stores ``x[..., N:, :]`` in the layer's own
:class:`PackedStream` and puts the fp16 sinks in front of what the stream returns, so:
- ``split`` (the default, what a build would store): the packed stream starts at token N, so
  channel-axis key blocks run over tokens N..N+G-1, ... and never see the sinks' magnitudes;
- ``overwrite``: every token is packed as today and the first N rows read back are replaced by
  the fp16 sinks (the sinks' own error only, channel-block statistics still include them);
- ``aligned``: as ``overwrite``, but the sink rows are packed as copies of token N, so the first
  channel block's min/max are those of tokens N..G-1 (a block that skips the sinks) and every
  later block is bit for bit the N = 0 cache's: no block-boundary shift, so the comparison with
  N = 0 is free of rounding luck. For token-axis tensors all three modes are identical.
N = 0 is the real packed cache itself, unpatched. Keys-only and values-only sinks: ``--parts-rows``.

Evaluation: KL(fp || quantized) per position and Δppl vs fp on the first ``--eval-windows``
1024-token windows of WikiText-2 test (``load_eval_windows``, the protocol's windowing), paired
per window against N = 0 of the same profile. The first N positions of a window read only fp
keys and values, so their predictions are exact; a window has 1024 of them, a long served
sequence many more, so the "late" metrics (positions >= ``--skip``, default 8) are the ones that
carry to long contexts.

    OMP_NUM_THREADS=1 python benchmarks/sink_probe.py [--model qwen2.5-0.5b] [--eval-windows 4]

Prints a table, writes benchmarks/results/sink_probe.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kvtuner.calibration import load_model
from kvtuner.evaluation import hardware, load_eval_windows
from kvtuner.evaluation.configs import profile_config, uniform_specs
from kvtuner.evaluation.divergence import mean_se
from kvtuner.profile import ModelFingerprint
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "exported_configs"
OUT = ROOT / "benchmarks" / "results" / "sink_probe.json"
DEFAULT_ROWS = "kivi-hadv-3bit,per-token-smooth-3bit,kivi-4bit,per-token-4bit,u:kivi-hadv-kv3"


def _sinks(x: torch.Tensor, n: int) -> torch.Tensor:
    return x[:, :, :n].half().to(x.dtype)


def patch(cache, n_k: int, n_v: int, mode: str) -> None:
    """Keep the first n_k keys / n_v values of the prefill in fp16, the rest packed."""
    for layer in cache.layers:

        def update(k, v, *_a, _layer=layer, **_kw):
            if _layer.is_initialized:
                raise RuntimeError("the probe evaluates one prefill per cache")
            _layer.lazy_initialization(k, v)
            out = []
            for stream, x, n in ((_layer.k, k, n_k), (_layer.v, v, n_v)):
                if mode == "split":
                    stream.store(x[:, :, n:])
                    out.append(torch.cat([_sinks(x, n), stream.read(x.dtype)], dim=-2))
                else:
                    same = x[:, :, n : n + 1].expand(-1, -1, n, -1)
                    stream.store(torch.cat([same, x[:, :, n:]], dim=-2) if mode == "aligned" else x)
                    got = stream.read(x.dtype).clone()
                    got[:, :, :n] = _sinks(x, n)
                    out.append(got)
            _layer.keys, _layer.values = _layer.k.tail, _layer.v.tail
            return tuple(out)

        layer.update = update


@torch.inference_mode()
def evaluate(model, ev, specs, fp_lp, n_k: int, n_v: int, mode: str, skip: int) -> dict:
    """Per window: mean KL(fp || quant) per position and summed NLL, over all positions and over
    positions >= ``skip`` (queries that see every sink but are not sinks themselves)."""
    out: dict[str, list[float]] = {"kl": [], "kl_late": [], "nll": [], "nll_late": []}
    for i, row in enumerate(ev):
        cache = make_cache(model, specs, residual_length=0)
        if n_k or n_v:
            patch(cache, n_k, n_v, mode)
        logits = model(row[None], **cache_kwargs(cache), use_cache=True).logits.float()
        kl = (fp_lp[i].exp() * (fp_lp[i] - torch.log_softmax(logits, -1))).sum(-1)[0]
        nll = F.cross_entropy(logits[0, :-1], row[1:], reduction="none")
        out["kl"].append(float(kl.mean()))
        out["kl_late"].append(float(kl[skip:].mean()))
        out["nll"].append(float(nll.sum()))
        out["nll_late"].append(float(nll[skip:].sum()))
    return out


@torch.inference_mode()
def attention_mass(model, ev, path: str, command: str) -> None:
    """fp model, eager attention: mean attention weight on key positions 0..7 (over heads and
    queries >= 8), per layer and averaged over layers; prints it and writes ``path``."""
    model.set_attn_implementation("eager")
    per_layer = []
    for r in ev:
        att = model(r[None], output_attentions=True).attentions
        per_layer.append(torch.stack([a[0, :, 8:, :8].mean((0, 1)) for a in att]))
    m = torch.stack(per_layer).mean(0)  # [layers, 8]
    out = dict(
        command=command,
        threads=torch.get_num_threads(),
        windows=len(ev),
        mean_over_layers=m.mean(0).tolist(),
        per_layer_pos0=m[:, 0].tolist(),
    )
    print("mass on positions 0..7, mean over layers:", [f"{x:.4f}" for x in m.mean(0)])
    print("mass on position 0 per layer:", [f"{x:.2f}" for x in m[:, 0]])
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


def paired_ratio(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean per-window ratio a/b - 1 and its standard error."""
    return mean_se([x / y - 1 for x, y in zip(a, b, strict=True)])


def fmt(r: tuple[float, float]) -> str:
    return f"{100 * r[0]:+.1f} ± {100 * r[1]:.1f} %"


def specs_of(name: str, model, model_name: str):
    """An exported profile of ``model_name`` by file stem, a profile path, or ``u:NAME``, a
    uniform baseline (evaluation names)."""
    if name.startswith("u:"):
        specs = uniform_specs(name[2:], ModelFingerprint.from_config(model.config))
    else:
        path = Path(name) if name.endswith(".json") else PROFILES / model_name / f"{name}.json"
        specs = profile_config(str(path), model.config).specs
    if any(s.k.pre_rope for s in specs):  # the layer rotates them, and patch() bypasses it
        print(f"sink_probe: {name} stores keys before RoPE, which this probe does not model",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    return specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument(
        "--rows",
        default=DEFAULT_ROWS,
        help="profile stems (exported_configs/MODEL/), .json paths, or u:<uniform name>",
    )
    ap.add_argument("--sinks", default="1,2,4,8")
    ap.add_argument("--parts-rows", default="kivi-hadv-3bit", help="rows also run keys/values-only")
    ap.add_argument(
        "--modes",
        default="aligned,split",
        help="channel-axis key rows: aligned, "
        "split, overwrite (comma list; the first for keys/values-only rows)",
    )
    ap.add_argument("--skip", type=int, default=8, help="late metrics: positions >= this")
    ap.add_argument("--json", default=str(OUT))
    ap.add_argument(
        "--attention-mass",
        action="store_true",
        help="only measure the fp model's attention on positions 0..7",
    )
    args = ap.parse_args()
    start = time.monotonic()
    model, tok = load_model(args.model, device="cpu", dtype="float32")
    ev = load_eval_windows(tok, num_windows=args.eval_windows).tokens
    if args.attention_mass:
        cmd = "OMP_NUM_THREADS=1 python benchmarks/sink_probe.py " + " ".join(sys.argv[1:])
        return attention_mass(model, ev, args.json, cmd)
    with torch.inference_mode():
        fp_lp = [torch.log_softmax(model(r[None]).logits.float(), -1) for r in ev]
    fp: dict[str, list[float]] = {"nll": [], "nll_late": []}
    for lp, r in zip(fp_lp, ev, strict=True):
        nll = -lp[0, :-1].gather(-1, r[1:, None])[:, 0]
        fp["nll"].append(float(nll.sum()))
        fp["nll_late"].append(float(nll[args.skip :].sum()))
    per = {"nll": ev.shape[1] - 1, "nll_late": ev.shape[1] - 1 - args.skip}
    sinks = [int(s) for s in args.sinks.split(",") if s]
    modes = args.modes.split(",")
    rows = []
    print(
        f"| row | sinks on | mode | N | KL | KL vs N=0 | KL pos>={args.skip} vs N=0 | Δppl % | "
        f"Δppl vs N=0 (points) | log-ppl loss removed, all / pos>={args.skip} |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for name in args.rows.split(","):
        specs = specs_of(name, model, args.model)
        channel = any(s.k.is_quantized and s.k.axis == "channel" for s in specs)
        base = evaluate(model, ev, specs, fp_lp, 0, 0, "split", args.skip)
        variants = [(0, "kv", "-")]
        for mode in modes if channel else ["token axis"]:
            variants += [(n, "kv", mode) for n in sinks]
        if name in args.parts_rows.split(","):
            variants += [(n, p, modes[0]) for p in ("k", "v") for n in sinks]
        for n, part, mode in variants:
            n_k, n_v = (n if "k" in part else 0), (n if "v" in part else 0)
            t0 = time.monotonic()
            m = evaluate(model, ev, specs, fp_lp, n_k, n_v, mode, args.skip) if n else base
            row = dict(row=name, parts=part, mode=mode, sinks=n, windows=m)
            for key in ("kl", "kl_late"):
                row[key] = sum(m[key]) / len(m[key])
                row[f"{key}_vs_base"] = paired_ratio(m[key], base[key])
            for key in ("nll", "nll_late"):
                loss, loss0 = sum(m[key]) - sum(fp[key]), sum(base[key]) - sum(fp[key])
                row[f"d{key}_ppl_pct"] = 100 * math.expm1(loss / (len(ev) * per[key]))
                row[f"{key}_log_ppl_loss_removed"] = 1 - loss / loss0
            # paired per-window difference of Δppl (ppl ratio to fp) vs N = 0, in % points
            row["dppl_vs_base_points"] = mean_se(
                [
                    100 * (math.exp((a - f) / per["nll"]) - math.exp((b - f) / per["nll"]))
                    for a, b, f in zip(m["nll"], base["nll"], fp["nll"], strict=True)
                ]
            )
            row["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            r, d = row, row["dppl_vs_base_points"]
            print(f"| {name} | {part} | {mode} | {n} | {r['kl']:.4f} | {fmt(r['kl_vs_base'])} | "
                  f"{fmt(r['kl_late_vs_base'])} | {r['dnll_ppl_pct']:+.2f} | "
                  f"{d[0]:+.2f} ± {d[1]:.2f} | {100 * r['nll_log_ppl_loss_removed']:.0f} / "
                  f"{100 * r['nll_late_log_ppl_loss_removed']:.0f} % |", flush=True)  # fmt: skip
    cmd = "OMP_NUM_THREADS=1 python benchmarks/sink_probe.py " + " ".join(sys.argv[1:])
    out = dict(command=cmd.strip(), args=vars(args), windows=len(ev), seq_len=ev.shape[1],
               fp_ppl=math.exp(sum(fp["nll"]) / (len(ev) * per["nll"])), fp_windows=fp,
               rows=rows,
               hardware=hardware(),
               wall_s=round(time.monotonic() - start))  # fmt: skip
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"fp ppl {out['fp_ppl']:.3f}; {out['wall_s']} s; wrote {args.json}")


if __name__ == "__main__":
    main()
