"""Soak: the real SGLang server on this CPU under sustained mixed load, stock and kvtuner.

Per configuration (stock SGLang; the exported KIVI profile ``kivi-4bit`` with ``--page-size 32``;
``--profiles`` adds others) one server is started with a KV pool small enough that the
scheduler must queue and retract (``--max-total-tokens``), the radix cache off (so an idle pool
holds no tokens) and metrics on. ``--streams`` clients then send mixed requests for
``--seconds`` (tests/runtime_loader/sglang/soak_load.py: prompts of 4..400 words, max_tokens
1..128, streamed or not, greedy or sampled, a tenth of the streamed ones cancelled mid-way).

Reported per row: requests served / failed / cancelled, p50 / p99 latency of the served ones,
the server's RSS (its process group) over time and its largest distance from the mean after
``--warmup`` seconds, the pool's used tokens once idle (0: every slot back in the allocator),
and how many times the scheduler retracted requests (its log).

    python benchmarks/sglang_soak.py [--seconds 600] [--streams 64] [--out ...]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime_loader" / "sglang"))

from sglang_server import SGLangServer, smollm2_hf_dir  # noqa: E402
from soak_load import idle_used_tokens, rss_drift, run_load  # noqa: E402

from kvtuner.profile import write_json_atomic  # noqa: E402

KIVI = REPO / "exported_configs" / "smollm2-135m" / "kivi-4bit.json"


def server_flags(args: argparse.Namespace, profile: Path | None) -> list[str]:
    flags = [
        "--max-total-tokens",
        str(args.max_total_tokens),
        "--max-running-requests",
        str(args.streams),
        "--disable-radix-cache",
        "--enable-metrics",
    ]
    if profile is not None:
        flags += ["--kvtuner-profile", str(profile)]
        if "kivi" in profile.name:
            flags += ["--page-size", "32"]
    return flags


def soak(args: argparse.Namespace, model_dir: Path, profile: Path | None) -> dict:
    name = "stock" if profile is None else profile.stem
    log = args.log_dir / f"soak-{name}.log"
    with SGLangServer(model_dir, *server_flags(args, profile), log_path=log) as server:
        started = time.time()
        load = run_load(
            server.url, server.proc.pid, streams=args.streams, seconds=args.seconds, seed=args.seed
        )
        idle = idle_used_tokens(server.url)
        text = server.log_text()
    retractions = re.findall(r"#retracted_reqs: (\d+)", text)
    drift = rss_drift(load.rss_mb, args.warmup)
    row = {
        "config": name,
        "flags": server_flags(args, profile),
        "seconds": round(time.time() - started, 1),
        "served": load.served,
        "failed": load.failed,
        "cancelled": load.cancelled,
        "p50_s": load.percentile(0.5),
        "p99_s": load.percentile(0.99),
        "rss_mb": load.rss_mb,
        "rss_drift_after_warmup": drift,
        "idle_used_tokens": idle,
        "retract_log_lines": len(retractions),
        "retracted_reqs": sum(int(n) for n in retractions),
        "errors": load.errors[:10],
    }
    print(
        f"{name:>10}: served {load.served}, failed {load.failed}, cancelled {load.cancelled}, "
        f"p50 {row['p50_s']} s, p99 {row['p99_s']} s, RSS drift {drift}, idle used tokens "
        f"{idle}, retracted {row['retracted_reqs']}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="load per configuration")
    ap.add_argument("--streams", type=int, default=64, help="concurrent client streams")
    ap.add_argument("--max-total-tokens", type=int, default=2048, help="KV pool tokens (small)")
    ap.add_argument("--warmup", type=float, default=60.0, help="RSS is judged after this")
    ap.add_argument("--profiles", type=Path, nargs="*", default=[KIVI])
    ap.add_argument("--no-stock", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/sglang_soak.json")
    ap.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "kvtuner-soak")
    args = ap.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = smollm2_hf_dir()
    configs = ([] if args.no_stock else [None]) + list(args.profiles)
    rows = [soak(args, model_dir, p) for p in configs]
    write_json_atomic(
        args.out,
        {
            "command": "python benchmarks/sglang_soak.py " + " ".join(sys.argv[1:]),
            "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
            "(shared), OMP_NUM_THREADS=1 per server",
            "model": "SmolLM2-135M-Instruct (fp32, torch_native attention, CPU engine)",
            "streams": args.streams,
            "seconds_per_config": args.seconds,
            "rows": rows,
        },
    )
    print(json.dumps({r["config"]: {k: r[k] for k in ("served", "failed")} for r in rows}))
    return 0 if all(r["failed"] == 0 and r["idle_used_tokens"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
