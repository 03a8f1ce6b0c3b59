"""`kvtuner show PROFILE`: per-layer table and totals."""

from __future__ import annotations

import argparse

from ..profile import Profile, load_profile


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="print a profile's per-layer bits and memory")
    p.add_argument("profile", help="profile JSON file")
    p.set_defaults(func=run)


def format_profile(profile: Profile) -> str:
    fp = profile.fingerprint
    lines = [
        f"model: {profile.model_id or '?'}  ({fp.architecture}, {fp.num_layers} layers, "
        f"{fp.num_kv_heads} KV heads, head_dim {fp.head_dim})  hash {profile.hash}",
        f"{'layer':>5}  {'K':<30} {'V':<22} {'bytes/token':>11}",
    ]
    for s in profile.layers:
        nbytes = s.bytes_per_token(fp.num_kv_heads, fp.head_dim)
        k = s.k.short() + ("/smooth" if s.k_smooth is not None else "")
        lines.append(f"{s.layer:>5}  {k:<30} {s.v.short():<22} {nbytes:>11.1f}")
    lines.append(
        f"total: {profile.bytes_per_token:.1f} bytes/token "
        f"(fp16: {profile.fp16_bytes_per_token}), nominal {profile.nominal_bits:.3f} bits, "
        f"effective {profile.effective_bits:.3f} bits, {profile.ratio_to_fp16:.3f}x fp16"
    )
    if profile.metrics:
        lines.append("metrics: " + ", ".join(f"{k}={v}" for k, v in profile.metrics.items()))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(format_profile(load_profile(args.profile)))
    return 0
