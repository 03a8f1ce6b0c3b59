"""Long-context retrieval quality of KV configs: fp vs exported profiles vs uniform configs of
equal bytes, at the lengths where fp itself is accurate.

Phase 1 measures fp at every ``--lengths``; phase 2 measures every profile and uniform config at
the lengths where fp scores >= 90 % (a task fp fails says nothing about the cache). Answers go
to a JSON-lines results file first, so a rerun (or a longer one: more samples, lengths or depths)
skips every answer it holds. Prompts: ``kvtuner eval --task``'s generators; the cache as the HF
runtime serves it (residual window 128, pack chunk 32; see docs/long_context.md).

    OMP_NUM_THREADS=1 python benchmarks/long_context.py --task passkey --lengths 1024 2048 4096 \
        --depths 0.1 0.5 0.9 --samples 4 --no-chat-template

Writes benchmarks/results/long_context-{model}-{task}-{haystack}.{jsonl,json,md}; the .md table
(accuracy per config x length with 95 % Wilson intervals, KV bytes, the targets) goes in
docs/results/long-context.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from kvtuner.calibration import load_model
from kvtuner.evaluation import parse_uniform
from kvtuner.evaluation.configs import profile_config
from kvtuner.evaluation.retrieval import (
    RetrievalSettings,
    evaluate_retrieval,
    format_retrieval_table,
)
from kvtuner.profile import ModelFingerprint, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
PROFILES = "kivi-4bit,per-token-4bit,kivi-3bit,kivi-hadv-3bit,per-token-3bit"
UNIFORM = "kivi4,kv4,kivi3,kv3"
FP_FLOOR = 0.9
MAX_LOSS = {4: 0.02, 3: 0.05}  # nominal bits -> accuracy points a profile may lose vs fp


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="passkey")
    p.add_argument("--haystack", default="noise")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--profiles", default=PROFILES, help="names under exported_configs/MODEL/")
    p.add_argument("--uniform", default=UNIFORM)
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def _settings(args, lengths) -> RetrievalSettings:
    return RetrievalSettings(
        task=args.task,
        lengths=tuple(lengths),
        depths=tuple(args.depths),
        samples=args.samples,
        haystack=args.haystack,
        chat=not args.no_chat_template,
    )


def _configs(args, fingerprint: ModelFingerprint):
    folder = ROOT / "exported_configs" / args.model
    profiles = [profile_config(str(folder / f"{n}.json"), fingerprint)
                for n in args.profiles.split(",") if n]  # fmt: skip
    return profiles, parse_uniform(args.uniform, fingerprint) if args.uniform else []


def _targets(report, profiles, uniforms, fp_ok: list[int], fingerprint) -> list[dict]:
    """Per profile and fp-passing length: loss vs fp (4-bit <= 2, 3-bit <= 5 points) and
    accuracy vs the best uniform config of equal KV bytes (within 1 %)."""
    rows = {(r["config"], r["length"]): r for r in report["rows"]}
    out = []
    for p in profiles:
        bits = round(
            p.accounting(ModelFingerprint.from_dict(report["fingerprint"]))["nominal_bits"]
        )
        for n in fp_ok:
            r, fp = rows[(p.name, n)], rows[("fp", n)]
            peers = [rows[(u.name, n)] for u in uniforms
                     if abs(rows[(u.name, n)]["kv_bytes"] / r["kv_bytes"] - 1) <= 0.01]  # fmt: skip
            best = max(peers, key=lambda x: x["accuracy"], default=None)
            loss = fp["accuracy"] - r["accuracy"]
            out.append({
                "profile": p.name, "length": n, "nominal_bits": bits,
                "accuracy": r["accuracy"], "fp_accuracy": fp["accuracy"], "loss": loss,
                "loss_ok": loss <= MAX_LOSS.get(bits, MAX_LOSS[3]) + 1e-9,
                "uniform": None if best is None else best["config"],
                "uniform_accuracy": None if best is None else best["accuracy"],
                "vs_uniform_ok": None if best is None else r["accuracy"] >= best["accuracy"],
            })  # fmt: skip
    return out


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "MISSED")


def _markdown(report, targets, fp_scan, command: str) -> str:
    lines = [f"`{command}`", "", "| config | length | n | accuracy % | 95 % CI | KV MiB | x fp16 |",
             "|---|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for r in fp_scan["rows"] + [r for r in report["rows"] if r["config"] != "fp"]:
        lo, hi = (100 * x for x in r["ci95"])
        lines.append(
            f"| {r['config']} | {r['length']} | {r['n']} | {100 * r['accuracy']:.1f} | "
            f"[{lo:.0f}, {hi:.0f}] | {r['kv_bytes'] / 2**20:.2f} | "
            f"{r['kv_bytes'] / r['fp16_bytes']:.3f} |"
        )
    lines += ["", "| profile | length | loss vs fp (points) | target | best uniform of its bytes "
              "| profile >= uniform |", "|---|---:|---:|---|---|---|"]  # fmt: skip
    for t in targets:
        cap = 100 * MAX_LOSS.get(t["nominal_bits"], MAX_LOSS[3])
        uni = (
            "-" if t["uniform"] is None else f"{t['uniform']} ({100 * t['uniform_accuracy']:.1f} %)"
        )
        lines.append(
            f"| {t['profile']} | {t['length']} | {100 * t['loss']:+.1f} | "
            f"{'met' if t['loss_ok'] else 'MISSED'} (<= {cap:.0f}) | {uni} | "
            f"{_verdict(t['vs_uniform_ok'])} |"
        )
    return "\n".join(lines) + "\n"


def results_stem(model: str, task: str, haystack: str) -> str:
    """Results path without extension; a string, since a model name like ``qwen2.5-0.5b`` holds a
    dot that ``Path.with_suffix`` would cut at."""
    return str(RESULTS / f"long_context-{model}-{task}-{haystack}")


def main() -> int:
    args = _args()
    torch.set_num_threads(args.threads)
    command = "OMP_NUM_THREADS=1 python benchmarks/long_context.py " + shlex.join(sys.argv[1:])
    stem = results_stem(args.model, args.task, args.haystack)
    model, tokenizer = load_model(args.model, dtype=torch.float32)
    fingerprint = ModelFingerprint.from_config(model.config)
    profiles, uniforms = _configs(args, fingerprint)
    kw = dict(model_name=args.model, results_path=stem + ".jsonl")
    fp_scan = evaluate_retrieval(model, tokenizer, [], _settings(args, args.lengths), **kw)
    print(format_retrieval_table(fp_scan, args.task), flush=True)
    fp_ok = [r["length"] for r in fp_scan["rows"] if r["accuracy"] >= FP_FLOOR]
    report = {"rows": [], "cells": [], "records": []}
    if fp_ok:
        configs = profiles + uniforms
        report = evaluate_retrieval(model, tokenizer, configs, _settings(args, fp_ok), **kw)
        print(format_retrieval_table(report, args.task))
    report["fingerprint"] = fingerprint.to_dict()
    targets = _targets(report, profiles, uniforms, fp_ok, fingerprint) if fp_ok else []
    from kvtuner.evaluation import hardware

    out = {"command": command, "hardware": hardware(), "fp_floor": FP_FLOOR,
           "fp_scan": fp_scan, "fp_ok_lengths": fp_ok, "report": report,
           "targets": targets}  # fmt: skip
    write_json_atomic(Path(stem + ".json"), out)
    md = _markdown(report, targets, fp_scan, command)
    tmp = Path(stem + ".md.tmp")
    tmp.write_text(md)
    tmp.replace(stem + ".md")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
