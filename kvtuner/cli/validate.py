"""`kvtuner validate PROFILE [--model MODEL]`: schema check, optionally against a model."""

from __future__ import annotations

import argparse

from ..profile import load_profile, read_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a profile (and that it fits a model)")
    p.add_argument("profile", help="profile JSON file")
    p.add_argument("--model", help="model to check against (hub id, local dir, .gguf, alias)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fingerprint = None
    if args.model:
        from ..calibration import model_fingerprint

        fingerprint = model_fingerprint(args.model, trust_remote_code=args.trust_remote_code)
    against = f" and fits {args.model}" if args.model else ""
    if read_json(args.profile, "profile").get("target") == "recipe":
        return _validate_recipe(args.profile, fingerprint, against)
    profile = load_profile(args.profile, fingerprint)
    print(
        f"ok: {args.profile} is a valid schema v{profile.schema_version} profile{against} "
        f"(hash {profile.hash}, {profile.effective_bits:.3f} effective bits)"
    )
    return 0


def _validate_recipe(path: str, fingerprint, against: str) -> int:
    from ..profile.recipe_profile import load_recipe_profile

    profile = load_recipe_profile(path)
    if fingerprint is not None:
        profile.check_model(fingerprint)
    print(
        f"ok: {path} is a valid {profile.engine} recipe{against} (hash {profile.hash}, "
        f"{profile.effective_bits:.3f} effective bits)"
    )
    return 0
