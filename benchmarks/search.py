"""Search benchmark: wall time of the whole `kvtuner search` (calibration included) and, per
budget, the searched profile's KL next to every uniform configuration of the same preset.

    python benchmarks/search.py [--model smollm2-135m] [--budgets 4bit,3bit,2.5bit]
                                [--presets per-token,kivi] [--export exported_configs/smollm2-135m]
                                [-- --context-length 1024 ...]

Each (preset, budget) runs `python -m kvtuner search` in a fresh folder (calibration included,
the CLI's default settings unless flags say otherwise). The KL of every profile and of every
uniform configuration is then measured on the calibration tokens (what the search optimised)
and on held-out WikiText-2 *test* windows (what it did not see). With --export, the profiles
are copied into the export folder with the held-out numbers added to their metrics (the
runtime part and hash are unchanged), kivi ones only where they beat per-token on held-out KL,
and the index is regenerated. Prints a table, writes benchmarks/results/search.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from kvtuner.calibration import fp_reference, load_calibration_data, load_model, measure_kl
from kvtuner.profile import Profile, load_profile, save_profile, write_json_atomic
from kvtuner.profile.index import write_index
from kvtuner.search_spaces import DEFAULT_BITS, load_preset
from kvtuner.tuner import Budget

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "search.json"
HELDOUT = ROOT.parent / "shared" / "data" / "wikitext-2" / "test.txt"  # ../shared beside the repo
HELDOUT_NAME = "wikitext-2 test (shared/data/wikitext-2/test.txt)"
MODEL = "smollm2-135m"  # --model
UNIFORM_BITS = DEFAULT_BITS  # every uniform (k, v) the search could also choose


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_search(preset, budget, work: Path, extra: list[str], fresh: bool) -> tuple[Path, float]:
    """One `kvtuner search` in a fresh folder; returns (profile path, wall seconds). ``fresh``:
    the preset's shared calibration cache is emptied first (the sweep runs and fills it for the
    preset's later runs), else it is used as it is (may be warm)."""
    folder = work / f"{preset}-{budget}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cache = work / f"calibration-cache-{preset}"
    if fresh:
        shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "KVTUNER_CACHE_DIR": str(cache)}
    out = folder / "profile.json"
    cmd = [
        sys.executable,
        "-m",
        "kvtuner",
        "search",
        "--model",
        MODEL,
        "--budget",
        budget,
        "--preset",
        preset,
        "--output",
        str(out),
        "--plot",
        str(folder / "pareto.png"),
        "--pareto-dir",
        str(folder / "pareto"),
        "--no-progress",
        *extra,
    ]
    print("$", " ".join(cmd[2:]), flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, text=True, capture_output=True, env=env)
    seconds = time.monotonic() - start
    (folder / "search.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"search failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    print(proc.stdout.strip().splitlines()[-1], flush=True)
    return out, seconds


class Meter:
    """KL of layer specs on the calibration tokens and on held-out test windows."""

    def __init__(self, model: str, num_samples: int, seq_len: int, heldout_samples: int):
        self.model, tok = load_model(model)
        self.cal = load_calibration_data(tok, num_samples=num_samples, seq_len=seq_len)
        self.held = load_calibration_data(
            tok, dataset=str(HELDOUT), num_samples=heldout_samples, seq_len=seq_len
        )
        self.refs = {
            name: fp_reference(self.model, d.tokens)
            for name, d in (("cal", self.cal), ("heldout", self.held))
        }

    def kl(self, specs) -> dict[str, float]:
        data = {"cal": self.cal, "heldout": self.held}
        return {n: measure_kl(self.model, data[n].tokens, specs, r) for n, r in self.refs.items()}


def calibrated_preset(meter: Meter, name: str):
    """The preset, with key smoothing calibrated on the calibration tokens as the search did
    (same tokens, same λ)."""
    preset = load_preset(name)
    if preset.smooth_alpha is None:
        return preset
    from kvtuner.calibration.smoothing import calibrate_key_smoothing

    return preset.with_smoothing(
        calibrate_key_smoothing(meter.model, meter.cal.tokens, alpha=preset.smooth_alpha)
    )


def uniform_rows(meter: Meter, preset_name: str, first: Profile) -> list[dict]:
    """Every uniform (k, v) of the preset; bytes at the searched profiles' context length (a
    hybrid model's window layers capped there, as in the profiles' own accounting)."""
    preset, fp = calibrated_preset(meter, preset_name), first.fingerprint
    context = {"context_length": first.context_length} if first.context_length else {}
    rows = []
    for k in UNIFORM_BITS:
        for v in UNIFORM_BITS:
            specs = [preset.layer_spec(i, k, v) for i in range(fp.num_layers)]
            nbytes = Profile("uniform", fp, specs, budget=context).bytes_per_token
            rows.append(
                {
                    "config": f"k{k}v{v}",
                    "nominal_bits": (k + v) / 2,
                    "bytes_per_token": nbytes,
                    **meter.kl(specs),
                }
            )
    return rows


def compare(profile, uniforms: list[dict], budget: Budget, kls: dict) -> dict:
    """The searched profile vs uniform configs of >= its memory (those within the budget are
    its real competitors; the target is to beat all of them)."""
    mine = profile.bytes_per_token

    def fits(u: dict) -> bool:
        if budget.kind == "bits":
            return u["nominal_bits"] <= budget.value
        return u["bytes_per_token"] <= budget.value * profile.fp16_bytes_per_token

    bigger = [u for u in uniforms if u["bytes_per_token"] >= mine]
    rivals = [u for u in bigger if fits(u)]
    beats = lambda split, us: all(kls[split] < u[split] for u in us)  # noqa: E731
    return {
        "uniform_ge_memory": [u["config"] for u in bigger],
        "uniform_ge_memory_within_budget": [u["config"] for u in rivals],
        "beats_all_ge_memory_within_budget_cal": beats("cal", rivals),
        "beats_all_ge_memory_within_budget_heldout": beats("heldout", rivals),
        "beats_all_ge_memory_cal": beats("cal", bigger),
        "beats_all_ge_memory_heldout": beats("heldout", bigger),
        "best_uniform_within_budget": min((u for u in uniforms if fits(u)), key=lambda u: u["cal"])[
            "config"
        ],
    }


def table(results: list[dict], uniforms: dict) -> str:
    lines = []
    for r in results:
        lines.append(
            f"\n{r['preset']} budget {r['budget']}: whole search {r['seconds']:.0f} s "
            f"({'calibration included' if r['calibration_included'] else 'calibration cached'}), "
            f"{r['trials']} trials; searched {r['nominal_bits']:.3f} nominal / "
            f"{r['effective_bits']:.3f} effective bits, {r['bytes_per_token']:.0f} B/tok"
        )
        lines.append(
            f"  {'config':<10} {'nominal':>7} {'B/token':>8} {'KL cal':>9} "
            f"{'KL held-out':>11}  vs searched (held-out)"
        )
        lines.append(
            f"  {'searched':<10} {r['nominal_bits']:>7.3f} {r['bytes_per_token']:>8.0f} "
            f"{r['cal']:>9.5f} {r['heldout']:>11.5f}"
        )
        for u in sorted(uniforms[r["preset"]], key=lambda u: -u["bytes_per_token"]):
            tag = "" if u["bytes_per_token"] < r["bytes_per_token"] else " (>= memory)"
            lines.append(
                f"  {u['config']:<10} {u['nominal_bits']:>7.3f} "
                f"{u['bytes_per_token']:>8.0f} {u['cal']:>9.5f} {u['heldout']:>11.5f}"
                f"  {u['heldout'] / r['heldout']:>6.2f}x{tag}"
            )
        c = r["compare"]
        lines.append(
            f"  beats every uniform of >= memory within budget "
            f"{c['uniform_ge_memory_within_budget']}: cal "
            f"{c['beats_all_ge_memory_within_budget_cal']}, held-out "
            f"{c['beats_all_ge_memory_within_budget_heldout']}"
        )
    return "\n".join(lines)


def _exported_heldout(path: Path) -> float | None:
    """Held-out KL of an already exported profile (same held-out windows by construction)."""
    return load_profile(path).metrics.get("heldout_kl") if path.exists() else None


def export(results: list[dict], folder: Path) -> None:
    """SGLang-servable presets without key smoothing always; others (kivi, per-token-smooth)
    where they beat per-token at the same budget on held-out KL."""
    per_token = {r["budget"]: r["heldout"] for r in results if r["preset"] == "per-token"}
    for r in results:
        rival = per_token.get(
            r["budget"], _exported_heldout(folder / f"per-token-{r['budget']}.json")
        )
        preset = load_preset(r["preset"])
        plain = preset.servable_by_sglang and preset.smooth_alpha is None
        if not plain and rival is not None and r["heldout"] >= rival:
            continue
        p = load_profile(r["profile"])
        metrics = {
            **p.metrics,
            "heldout_kl": round(r["heldout"], 6),
            "heldout_best_uniform": r["compare"]["best_uniform_within_budget"],
            "heldout_best_uniform_kl": round(r["heldout_best_uniform"], 6),
            "heldout_data": r["heldout_data"],
        }
        save_profile(
            type(p)(**{**p.__dict__, "metrics": metrics}),
            folder / f"{r['preset']}-{r['budget']}.json",
        )
    write_index(folder.parent)


def run_all(args, work: Path) -> dict:
    searched = {}
    for p in args.presets.split(","):
        for b in args.budgets.split(","):
            fresh = args.fresh_calibration == "all" or (
                args.fresh_calibration == "first" and not any(k[0] == p for k in searched)
            )
            searched[(p, b)] = (*run_search(p, b, work, args.search_args, fresh), fresh)
    return searched


def measure(searched: dict, presets: list[str], heldout_samples: int):
    """KL of every searched profile and every uniform config, calibration and held-out tokens."""
    first = load_profile(next(iter(searched.values()))[0])
    cal = first.calibration
    meter = Meter(MODEL, cal["num_samples"], cal["seq_len"], heldout_samples)
    uniforms = {p: uniform_rows(meter, p, first) for p in presets}
    results = []
    for (p, b), (path, seconds, fresh) in searched.items():
        profile, budget = load_profile(path), Budget.parse(b)
        kls = meter.kl(profile.layers)
        cmp = compare(profile, uniforms[p], budget, kls)
        best_u = next(u for u in uniforms[p] if u["config"] == cmp["best_uniform_within_budget"])
        results.append(
            {
                "preset": p,
                "budget": b,
                "seconds": seconds,
                "calibration_included": fresh,
                "profile": str(path),
                "trials": profile.metrics.get("trials"),
                "search_kl": profile.metrics["kl"],
                "hash": profile.hash,
                "nominal_bits": profile.nominal_bits,
                "effective_bits": profile.effective_bits,
                "bytes_per_token": profile.bytes_per_token,
                **kls,
                "compare": cmp,
                "heldout_best_uniform": best_u["heldout"],
                "heldout_data": {
                    **meter.held.describe(),
                    "dataset": HELDOUT_NAME,
                    "split": "test",
                },
            }
        )
    return results, uniforms


def main() -> None:
    global MODEL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--budgets", default="4bit,3bit,2.5bit")
    ap.add_argument("--presets", default="per-token")
    ap.add_argument("--work", default="/tmp/kvtuner-bench-search")
    ap.add_argument("--heldout-samples", type=int, default=4)
    ap.add_argument(
        "--fresh-calibration",
        choices=("all", "first", "none"),
        default="all",
        help="which runs start with an empty calibration cache (default: all)",
    )
    ap.add_argument(
        "--skip-search",
        action="store_true",
        help="re-measure the searches recorded in WORK/searched.json",
    )
    ap.add_argument("--json", default=str(OUT), help="results file (default %(default)s)")
    ap.add_argument("--export", help="copy profiles here and regenerate the index above it")
    ap.add_argument("search_args", nargs="*", help="extra flags for kvtuner search (after --)")
    args = ap.parse_args()
    MODEL = args.model
    work = Path(args.work)
    record = work / "searched.json"
    if args.skip_search:  # re-measure the runs a previous invocation recorded
        searched = {
            tuple(k.split("|")): tuple(v) for k, v in json.loads(record.read_text()).items()
        }
    else:
        searched = run_all(args, work)
        write_json_atomic(record, {"|".join(k): [str(v[0]), *v[1:]] for k, v in searched.items()})
    results, uniforms = measure(searched, args.presets.split(","), args.heldout_samples)
    print(table(results, uniforms))
    hardware = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }
    command = "python benchmarks/search.py " + " ".join(sys.argv[1:])
    write_json_atomic(
        args.json,
        {
            "command": command,
            "hardware": hardware,
            "results": results,
            "uniform": uniforms,
            "calibration": load_profile(results[0]["profile"]).calibration,
        },
    )
    print(f"\n{hardware}\nwrote {args.json}")
    if args.export:
        export(results, Path(args.export))
        print(f"exported to {args.export}")


if __name__ == "__main__":
    main()
