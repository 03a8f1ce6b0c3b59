"""`kvtuner import-kvtuner PRESET.yaml --model M --output P.json`: KVTuner YAML -> profile."""

from __future__ import annotations

import argparse

from ..quant.spec import QuantSpec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import-kvtuner",
        help="convert a KVTuner per-layer YAML preset ({layer: {nbits_key, nbits_value}})",
        description="Convert KVTuner's published per-layer preset into a kvtuner profile, "
        "validated against the model. The YAML holds bits only; axes and group come from flags.",
    )
    p.add_argument("preset", help="KVTuner YAML preset file")
    p.add_argument("--model", required=True, help="hub id, local dir, .gguf or alias")
    p.add_argument("--output", required=True, help="profile JSON to write")
    p.add_argument(
        "--key-axis",
        "--axis-key",
        choices=("token", "channel"),
        default="channel",
        help="key quantization axis (KVTuner: 1 = channel/KIVI, 0 = token)",
    )
    p.add_argument("--value-axis", "--axis-value", choices=("token", "channel"), default="token")
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--symmetric", action="store_true", help="absmax grid (KVTuner: no --asym)")
    p.add_argument("--key-rotation", choices=("none", "hadamard"), default="none")
    p.add_argument("--trust-remote-code", action="store_true")
    p.set_defaults(func=run)


def _template(args: argparse.Namespace, axis: str, rotation: str = "none") -> QuantSpec:
    from ..errors import KVTunerError

    try:
        return QuantSpec(4, args.group_size, args.symmetric, axis, rotation)
    except ValueError as exc:
        raise KVTunerError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from ..calibration import model_fingerprint
    from ..profile import save_profile
    from ..tuner.import_kvtuner import import_kvtuner_yaml

    key = _template(args, args.key_axis, args.key_rotation)
    value = _template(args, args.value_axis)
    fingerprint = model_fingerprint(args.model, trust_remote_code=args.trust_remote_code)
    profile = import_kvtuner_yaml(
        args.preset, fingerprint, model_id=args.model, key=key, value=value
    )
    save_profile(profile, args.output)
    print(
        f"wrote {args.output}: {len(profile.layers)} layers, nominal "
        f"{profile.nominal_bits:.3f} bits, effective {profile.effective_bits:.3f} bits, "
        f"{profile.bytes_per_token:.0f} bytes/token, hash {profile.hash}"
    )
    return 0
