"""The project's results table: quality, memory and decode speed of KV configs on SmolLM2-135M.

Rows (one run, same windows): fp; uniform KV8/KV4/KV2/K8V4/K4V2 (per-token, g32 asym), KIVI-4/KIVI-2
(keys per-channel g32), the format-v2 widths at 4 and 3 nominal bits (K5V3, KV3, per-token and
KIVI-style), had-kv4 (per-token KV4 with K and V Hadamard-rotated; the `per-token`
search preset rotates keys only), the `kivi-hadv` preset's uniform rows at 4 and 3 bits
(KIVI keys, Hadamard-rotated values: kivi-hadv-kv4, kivi-hadv-kv3); every profile in
exported_configs/ that fits the model (picked up automatically); transformers' QuantizedCache
(quanto backend, 4 and 2 bits) when optimum-quanto imports.
Perplexity: WikiText-2 test, first N non-overlapping 1024-token windows, K/V quantized before any
query reads them (residual 0). Decode (defaults): 512-token prompt, 64 greedy steps, residual
window 128, median of 3 runs each paired with a default-cache run.

    OMP_NUM_THREADS=2 python benchmarks/quality.py [--num-windows 32] [--resume]

Writes benchmarks/results/quality.json (after every row: partial results survive), quality.md
(Markdown table) and quality.png (Δppl vs effective bits). ``--resume`` keeps the rows already in
quality.json (same model/windows, same layer specs by hash) and evaluates only the missing or
changed ones (e.g. new or re-exported profiles).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from kvtuner.calibration import Sensitivity, load_model
from kvtuner.errors import KVTunerError
from kvtuner.evaluation import (
    DecodeSettings,
    EvalReport,
    PerplexityResult,
    evaluate_configs,
    format_markdown,
    format_table,
    hardware,
    load_eval_windows,
    measure_decode,
    parse_uniform,
    plot_report,
)
from kvtuner.evaluation.configs import QUANTO_BITS, EvalConfig, profile_config
from kvtuner.evaluation.quanto import quanto_missing
from kvtuner.evaluation.sensitive_layers import with_sensitive_layers_raised
from kvtuner.profile import ModelFingerprint, read_json, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
NAME = "quality"  # results file stem (--name)
# most telling first: rows are saved as they come
UNIFORM = "kv8,kv4,kivi4,k8v4,k4v2,kivi-k4v2,kv2,kivi2,k5v3,kivi-k5v3,kv3,kivi3"
# the kivi-hadv search preset (KIVI keys, rotated values): its uniform rows at 4 and 3 nominal bits
UNIFORM_ROTATED = "kivi-hadv-kv4,kivi-hadv-kv3"
ROTATED = f"had-kv4,{UNIFORM_ROTATED}"


def exported_profiles(fingerprint: ModelFingerprint, folder: Path) -> list[EvalConfig]:
    """Every profile JSON under ``folder`` that fits the model (others are listed and skipped)."""
    rows = []
    paths = sorted(folder.glob("**/*.json")) if folder.is_dir() else []
    for path in (p for p in paths if p.name != "index.json"):  # the generated index is no profile
        try:
            rows.append(profile_config(str(path), fingerprint))
        except KVTunerError as exc:
            print(f"[quality] skip {path}: {exc}", file=sys.stderr)
    return rows


def raised_rows(specs: list[str], fingerprint: ModelFingerprint) -> list[EvalConfig]:
    """``BASE=SENSITIVITY.json`` items -> the base uniform row with its 1 and 2 most sensitive
    layers (ranked by that calibration) at 8 bits: the hand heuristic a search must beat."""
    rows = []
    for item in specs:
        base_name, _, path = item.partition("=")
        if not path:
            raise KVTunerError(f"--raise-sensitive wants BASE=SENSITIVITY.json, got {item!r}")
        base = parse_uniform(base_name, fingerprint)[0]
        sensitivity = Sensitivity.load(path)
        rows += [with_sensitive_layers_raised(base, sensitivity, n) for n in (1, 2)]
    return rows


def all_configs(
    fingerprint: ModelFingerprint,
    folder: Path,
    uniform: str = UNIFORM,
    rotated: str = ROTATED,
    raised: list[str] = (),
) -> list[EvalConfig]:
    rows = parse_uniform(uniform, fingerprint) + exported_profiles(fingerprint, folder)
    rows += parse_uniform(rotated, fingerprint) if rotated else []
    rows += raised_rows(list(raised), fingerprint)
    if fingerprint.layer_types is not None:
        rows = [r for r in rows if not _channel_axis(r)]
        print("[quality] hybrid model: no KIVI-style rows (window layers drop single tokens)")
    missing = quanto_missing()
    if fingerprint.layer_types is not None:
        missing = "transformers' QuantizedCache refuses sliding-window layers"
    if missing:
        print(f"[quality] no hf-quanto rows: {missing}", file=sys.stderr)
    else:
        rows += [EvalConfig(f"hf-quanto{b}", "hf-quanto", quanto_bits=b) for b in QUANTO_BITS]
    return rows


def _channel_axis(config: EvalConfig) -> bool:
    return any(q.axis == "channel" for s in config.specs or () for q in (s.k, s.v))


def previous_rows(path: Path, data: dict) -> list[dict]:
    """Rows of an earlier run on the same model and windows (for --resume)."""
    if not path.is_file():
        return []
    old = read_json(path, "results")
    return old["rows"] if old.get("data") == data else []


def save(report: EvalReport, kept: list[dict], command: str) -> None:
    if not report.rows:
        return
    names = {r["name"] for r in report.rows}
    report_rows = [r for r in kept if r["name"] not in names] + report.rows
    fp = next(r for r in report_rows if r["kind"] == "fp")
    report_rows = [fp] + [r for r in report_rows if r["kind"] != "fp"]
    full = EvalReport(
        report.model,
        report.fingerprint,
        report.data,
        report.settings,
        report_rows,
        report.hardware,
        report.wall_s,
    )
    write_json_atomic(RESULTS / f"{NAME}.json", {**full.to_dict(), "command": command})
    (RESULTS / f"{NAME}.md").write_text(
        f"`{command}`  \n{full.hardware['cpu']}, {full.hardware['cores']} cores, torch threads "
        f"{full.hardware['torch_threads']}, wall {full.wall_s:.0f} s (this invocation)\n\n"
        + format_markdown(full)
        + "\n"
    )
    plot_report(full, RESULTS / f"{NAME}.png")
    print(format_table(full), flush=True)


def decode_only(model, windows, configs, decode: DecodeSettings, command: str) -> None:
    """Decode speed alone (paired with the default cache) -> results/quality_decode.json."""
    prompt = windows.tokens.flatten()[: decode.prompt_tokens]
    rows: list[dict] = []
    for config in configs:
        speeds = measure_decode(model, prompt, [config], decode)
        rows.append(
            {
                "name": config.name,
                "kind": config.kind,
                "fp_tok_s": speeds["fp"]["tok_s"],
                **speeds[config.name],
            }
        )
        data = {
            "format": "kvtuner-decode",
            "command": command,
            "settings": decode.__dict__,
            "hardware": hardware(),
            "rows": rows,
        }
        write_json_atomic(RESULTS / "quality_decode.json", data)
        r = rows[-1]
        print(
            f"{r['name']:<22} {r['kind']:<9} default {r['fp_tok_s']:6.2f} tok/s  packed "
            f"{r['tok_s']:6.2f} ({r['ratio']:.2f}x)  copy {r.get('tok_s_copy', float('nan')):6.2f}"
            f" ({r.get('ratio_copy', float('nan')):.2f}x)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default=None)
    p.add_argument("--num-windows", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--profiles", default=str(ROOT / "exported_configs"))
    p.add_argument("--uniform", default=UNIFORM, help="uniform rows (default: %(default)s)")
    p.add_argument("--rotated", default=ROTATED, help="rotated uniform rows (default: %(default)s)")
    p.add_argument(
        "--raise-sensitive",
        nargs="*",
        default=[],
        metavar="BASE=SENSITIVITY",
        help="rows: uniform BASE with its 1 and 2 most sensitive layers (per the sensitivity "
        "JSON) at 8 bits, e.g. kivi4=kivi.sensitivity.json",
    )
    p.add_argument("--no-decode", action="store_true")
    d = DecodeSettings()
    p.add_argument("--decode-prompt-tokens", type=int, default=d.prompt_tokens)
    p.add_argument("--decode-steps", type=int, default=d.steps)
    p.add_argument("--decode-repeats", type=int, default=d.repeats)
    p.add_argument("--resume", action="store_true", help="keep rows already in quality.json")
    p.add_argument(
        "--decode-only",
        default=None,
        metavar="NAMES",
        help="only time decoding of these rows (comma list, or 'all')",
    )
    p.add_argument("--name", default="quality", help="results file stem under benchmarks/results")
    p.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON only")
    args = p.parse_args(argv)
    global NAME
    NAME = args.name
    if args.replot:  # measures nothing: the rows come from the results JSON
        report = EvalReport.from_dict(read_json(RESULTS / f"{NAME}.json", "results"))
        print(f"wrote {plot_report(report, RESULTS / f'{NAME}.png')}")
        return 0
    cli = shlex.join(sys.argv[1:] if argv is None else argv)
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/quality.py {cli}"
    # the evaluation protocol: fp32 on the CPU, whatever `auto` would pick on this machine
    model, tokenizer = load_model(args.model, device="cpu", dtype="float32")
    fingerprint = ModelFingerprint.from_config(model.config)
    windows = load_eval_windows(
        tokenizer, dataset=args.dataset, num_windows=args.num_windows, seq_len=args.seq_len
    )
    if args.decode_only:
        wanted = set(args.decode_only.split(","))
        configs = [
            c
            for c in all_configs(
                fingerprint, Path(args.profiles), args.uniform, args.rotated, args.raise_sensitive
            )
            if "all" in wanted or c.name in wanted
        ]
        decode = DecodeSettings(args.decode_prompt_tokens, args.decode_steps, args.decode_repeats)
        decode_only(model, windows, configs, decode, command)
        return 0
    wanted = all_configs(
        fingerprint, Path(args.profiles), args.uniform, args.rotated, args.raise_sensitive
    )
    kept = previous_rows(RESULTS / f"{NAME}.json", windows.describe()) if args.resume else []
    current = {c.name: c.specs_hash(fingerprint) for c in wanted}
    # a kept row stays only while a config of that name with the same specs still exists;
    # quanto rows also stay where optimum-quanto is not installed (they cannot be re-measured)
    keep_kinds = ("fp", "hf-quanto") if quanto_missing() else ("fp",)
    kept = [
        r for r in kept if r["kind"] in keep_kinds or current.get(r["name"], 0) == r.get("hash")
    ]
    done = {r["name"] for r in kept}
    configs = [c for c in wanted if c.name not in done]
    print(f"[quality] evaluating: fp, {', '.join(c.name for c in configs)}", file=sys.stderr)
    decode = (
        None
        if args.no_decode
        else DecodeSettings(args.decode_prompt_tokens, args.decode_steps, args.decode_repeats)
    )
    fp_row = next((r for r in kept if r["kind"] == "fp"), None)
    fp_result = None
    if fp_row is not None:  # same windows: reuse its per-window NLL instead of re-running fp
        fp_result = PerplexityResult(tuple(fp_row["window_nll"]), windows.seq_len - 1)
    evaluate_configs(
        model,
        windows,
        configs,
        model_name=args.model,
        decode=decode,
        on_row=lambda report: save(report, kept, command),
        fp_result=fp_result,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
