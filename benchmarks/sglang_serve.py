"""Serving benchmark: the real SGLang server, stock KV pool vs kvtuner profiles, in one run.

For each configuration one server is started, measured and stopped; stock is measured again after
every ``--stock-every`` profiles so that each profile's speed is compared with the stock rows
measured just before and after it (the shared CPU's speed drifts):
- token capacity for the same KV byte budget, by SGLang's own sizing: the cell size (bytes/token)
  SGLang computed in the server (logged by the kvtuner plugin) fed to SGLang's
  ``DefaultPoolConfigurator.calculate_pool_sizes(budget)``;
- decode tok/s of one stream, and aggregate tok/s of 8 concurrent streams (ignore_eos);
- greedy-output agreement with stock over a fixed prompt set (token ids of the outputs).

CPU (default): SmolLM2-135M-Instruct exported from its GGUF, docs/serving.md's CPU recipe (test-only
``sgl_kernel`` stand-in, torch_native attention, OMP_NUM_THREADS=1 per server). On a GPU box:
``--device cuda --model-path <hf dir>`` is the same benchmark. Profiles: ``--profiles a.json ...``,
default: uniform per-token profiles built here (K Hadamard-rotated): a 16-bit control (fp16 rows:
lossless for an fp16 model, so its outputs must equal stock's), KV8, KV4 g32, KV4 g64 and K4V2;
then the searched per-token SmolLM2 profiles in exported_configs/ (one row per distinct profile
hash: a searched profile equal to a uniform one is not served twice).

Then each ``--uncached`` profile once more with the pool's decode cache off
(``KVTUNER_DECODE_CACHE_TOKENS=0``: every decode step dequantizes the request's whole K/V), and
stock after it. Each row records the 1-minute load average before and after it.

    python benchmarks/sglang_serve.py [--dtype float16] [--budget-gib 1] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime_loader" / "sglang"))

from sglang_server import SGLangServer, smollm2_hf_dir  # noqa: E402

from kvtuner.profile import (  # noqa: E402
    ModelFingerprint,
    Profile,
    load_profile,
    save_profile,
    write_json_atomic,
)
from kvtuner.quant import QuantSpec  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
    "What is 17 times 3? Show your steps.",
    "Give a short definition of photosynthesis.",
    "Name the planets of the solar system in order.",
    "Translate 'good morning' into Spanish and French.",
]
UNIFORM = {  # name -> (K spec, V spec): the per-token preset's shape
    "16bit": (QuantSpec(16), QuantSpec(16)),  # control: lossless in fp16, so outputs = stock's
    "8bit": (QuantSpec(8, rotation="hadamard"), QuantSpec(8)),
    "4bit": (QuantSpec(4, rotation="hadamard"), QuantSpec(4)),
    "4bit-g64": (QuantSpec(4, 64, rotation="hadamard"), QuantSpec(4, 64)),  # 4.5 eff. bits
    "3bit": (QuantSpec(4, rotation="hadamard"), QuantSpec(2)),
}
SEARCHED = "exported_configs/smollm2-135m/per-token-*.json"
CACHE_ENV = "KVTUNER_DECODE_CACHE_TOKENS"
UNCACHED = " (decode cache off)"


def hardware() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "server_torch_threads": 1,
        "python": platform.python_version(),
    }


def default_profiles(model_dir: Path, out_dir: Path) -> list[Path]:
    """Uniform profiles built here, then the searched ones in exported_configs/ (distinct
    hashes only)."""
    import transformers

    fp = ModelFingerprint.from_config(transformers.AutoConfig.from_pretrained(model_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, seen = [], set()
    for name, (k, v) in UNIFORM.items():
        profile = Profile.uniform("smollm2-135m-instruct", fp, k, v)
        paths.append(out_dir / f"smollm2-135m-uniform-{name}.json")
        save_profile(profile, paths[-1])
        seen.add(profile.hash)
    for path in sorted(REPO.glob(SEARCHED)):
        profile = load_profile(path)
        if profile.hash not in seen:
            paths.append(path)
            seen.add(profile.hash)
    return paths


def interleave_stock(profiles: list[Path], every: int) -> list[Path | None]:
    """Stock (None) first, then again after every ``every`` profiles and at the end."""
    order: list[Path | None] = [None]
    for i in range(0, len(profiles), every):
        order += [*profiles[i : i + every], None]
    return order


def sglang_capacity(cell_bytes: int, budget: int) -> int:
    """Tokens SGLang's DefaultPoolConfigurator gives a KV budget of ``budget`` bytes."""
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    sizer = DefaultPoolConfigurator.__new__(DefaultPoolConfigurator)  # only the sizing state
    sizer._cell_size, sizer._fixed_overhead_bytes, sizer._zero_kv_max_tokens = cell_bytes, 0, 0
    return sizer.calculate_pool_sizes(budget, 1).max_total_num_tokens


def cell_from_log(log: str) -> int:
    ours = re.search(r"kvtuner: KV cell size (\d+) B/token", log)
    stock = re.search(r"kvtuner: no profile; SGLang KV cell size (\d+) B/token", log)
    return int((ours or stock)[1])


def stream_tokens(client, prompt: str, max_tokens: int) -> tuple[int, float]:
    """(tokens, decode seconds after the first token) of one streamed greedy completion."""
    first = last = None
    count = 0
    stream = client.completions.create(
        model="default",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
            count += 1
    return count, (last - first) if count > 1 else float("nan")


def throughput(client, max_tokens: int, concurrency: int) -> float:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: stream_tokens(client, p, max_tokens), prompts))
    if concurrency == 1:
        tokens, decode_s = results[0]
        return (tokens - 1) / decode_s
    return sum(t for t, _ in results) / (time.perf_counter() - start)


def greedy_outputs(client, tokenizer, max_tokens: int) -> list[list[int]]:
    outs = []
    for prompt in PROMPTS:
        reply = client.chat.completions.create(
            model="default",
            temperature=0,
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": prompt}],
        )
        outs.append(tokenizer.encode(reply.choices[0].message.content, add_special_tokens=False))
    return outs


def agreement(stock: list[list[int]], ours: list[list[int]]) -> tuple[float, float]:
    """(fraction of prompts with identical outputs, mean common-prefix fraction of stock tokens)."""
    exact = sum(a == b for a, b in zip(stock, ours, strict=True)) / len(stock)
    prefix = []
    for a, b in zip(stock, ours, strict=True):
        n = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        prefix.append(n / max(len(a), 1))
    return exact, sum(prefix) / len(prefix)


def profile_flags(profile: Path | None) -> list[str]:
    """Server flags for a profile: channel-axis (KIVI) sides need pages of their group size
    and a staging bound (8 running requests, the benchmark's concurrency)."""
    if profile is None:
        return []
    from kvtuner.profile.channel_sides import channel_sides

    flags = ["--kvtuner-profile", str(profile)]
    sides = channel_sides(load_profile(profile))
    if sides:
        flags += ["--page-size", str(sides[0].group_size), "--max-running-requests", "8"]
    return flags


def measure(args, model_dir: Path, profile: Path | None, tokenizer, cache: bool = True) -> dict:
    import openai

    flags = profile_flags(profile)
    name = (profile.stem if profile else "stock") + ("" if cache else UNCACHED)
    log = args.log_dir / f"sglang_serve.{name.replace(' ', '_')}.log"
    os.environ[CACHE_ENV] = "" if cache else "0"  # the server inherits it (0: decode cache off)
    load_before = os.getloadavg()[0]
    with SGLangServer(model_dir, *flags, log_path=log, device=args.device, dtype=args.dtype) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=600)
        row = {"config": name, "cell_bytes": cell_from_log(srv.log_text())}
        row["greedy"] = greedy_outputs(client, tokenizer, args.greedy_tokens)
        row["decode_tok_s_1"] = throughput(client, args.decode_tokens, 1)
        row["decode_tok_s_8"] = throughput(client, args.decode_tokens, 8)
    row["loadavg_1m"] = [load_before, os.getloadavg()[0]]  # before start, after the last request
    if profile:
        p = load_profile(profile)
        row.update(hash=p.hash, nominal_bits=p.nominal_bits, effective_bits=p.effective_bits)
        row["calib_kl"] = p.metrics.get("kl")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", type=Path, default=None, help="HF folder (default: SmolLM2)")
    ap.add_argument("--profiles", type=Path, nargs="*", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--dtype",
        default="float16",
        help="model dtype (fp16: the 16-bit control profile stores K/V losslessly)",
    )
    ap.add_argument("--budget-gib", type=float, default=1.0, help="KV byte budget for capacity")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=48)
    ap.add_argument("--stock-every", type=int, default=3, help="re-measure stock every N rows")
    ap.add_argument(
        "--uncached",
        nargs="*",
        default=["smollm2-135m-uniform-4bit-g64"],
        metavar="STEM",
        help=f"profiles (file stems) served once more with {CACHE_ENV}=0, at the end",
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/sglang_serve.json")
    ap.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "kvtuner-serve")
    args = ap.parse_args(argv)
    import transformers

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_path or smollm2_hf_dir()
    profiles = args.profiles or default_profiles(model_dir, args.out.parent / "sglang_profiles")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    started = time.perf_counter()
    uncached = [p for p in profiles if p.stem in set(args.uncached)]
    order = [(p, True) for p in interleave_stock(profiles, args.stock_every)]
    order += [x for p in uncached for x in ((p, False), (None, True))]
    rows = []
    for p, cache in order:
        rows.append(measure(args, model_dir, p, tokenizer, cache))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "greedy"}), flush=True)
        # written after every row ("complete": false until the last): a stopped run keeps its rows
        report(args, rows, time.perf_counter() - started, len(order))
    return 0


def speed_vs_stock(rows: list[dict]) -> None:
    """Each row's decode speeds over the mean of the stock rows measured next to it."""
    stock_at = [i for i, r in enumerate(rows) if r["config"] == "stock"]
    for i, row in enumerate(rows):
        before = max((j for j in stock_at if j <= i), default=stock_at[0])
        after = min((j for j in stock_at if j >= i), default=stock_at[-1])
        for key in ("decode_tok_s_1", "decode_tok_s_8"):
            ref = (rows[before][key] + rows[after][key]) / 2
            row[key + "_x"] = row[key] / ref


def report(args, rows: list[dict], wall: float, planned: int) -> None:
    complete = len(rows) == planned  # the table is printed once, after the last row
    budget = int(args.budget_gib * (1 << 30))
    stock = rows[0]
    speed_vs_stock(rows)
    for row in rows:
        row["tokens_for_budget"] = sglang_capacity(row["cell_bytes"], budget)
        row["capacity_x"] = row["tokens_for_budget"] / stock["tokens_for_budget"]
        row["agree_exact"], row["agree_prefix"] = agreement(stock["greedy"], row["greedy"])
    if complete:
        print_table(args, rows)
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "hardware": hardware(),
        "device": args.device,
        "dtype": args.dtype,
        "budget_bytes": budget,
        "wall_s": round(wall, 1),
        "complete": complete,
        "rows_planned": planned,
        "prompts": PROMPTS,
        "rows": rows,
    }
    write_json_atomic(args.out, result)
    if complete:
        print(f"hardware: {result['hardware']}; wall {wall:.0f} s; wrote {args.out}")


def print_table(args, rows: list[dict]) -> None:
    head = (
        f"{'config':<52} {'bits':>5} {'B/token':>8} {'tokens/' + str(args.budget_gib) + 'GiB':>13}"
        f" {'x stock':>7} {'tok/s 1':>8} {'x':>5} {'tok/s 8':>8} {'x':>5} {'same out':>8}"
        f" {'prefix':>7} {'calib KL':>8}"
    )
    print(head)
    for r in rows:
        kl = r.get("calib_kl")
        print(
            f"{r['config']:<52} {r.get('nominal_bits', 16):>5.2f} {r['cell_bytes']:>8} "
            f"{r['tokens_for_budget']:>13} {r['capacity_x']:>7.2f} {r['decode_tok_s_1']:>8.1f} "
            f"{r['decode_tok_s_1_x']:>5.2f} {r['decode_tok_s_8']:>8.1f} "
            f"{r['decode_tok_s_8_x']:>5.2f} {r['agree_exact']:>8.2f} {r['agree_prefix']:>7.2f} "
            f"{'-' if kl is None else format(kl, '.4f'):>8}"
        )


if __name__ == "__main__":
    sys.exit(main())
