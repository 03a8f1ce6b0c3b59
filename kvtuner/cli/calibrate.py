"""`kvtuner calibrate --model M [--dataset D] --output sensitivity.json [--plot heat.png]`."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from ..errors import KVTunerError
from ..search_spaces.preset_table import preset_help
from .output import Verbosity, add_verbosity_arguments
from .placement_args import add_placement_arguments, placement_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..calibration.batches import DEFAULT_NUM_SAMPLES, DEFAULT_SEED, DEFAULT_SEQ_LEN

    p = sub.add_parser(
        "calibrate",
        help="measure per-layer K and V quantization sensitivity (KL vs fp)",
        description="For every layer, K and V separately, at each bit width: KL(fp || quantized) "
        "of next-token distributions with only that tensor of that layer quantized.",
    )
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="hub id, local dir, .gguf or alias (default %(default)s)",
    )
    p.add_argument(
        "--dataset",
        help="local text/jsonl/parquet file or folder, or "
        "hf:NAME:CONFIG:SPLIT (default: the embedded WikiText-2 valid slice)",
    )
    p.add_argument("--num-samples", type=int, default=DEFAULT_NUM_SAMPLES)
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="which windows are sampled")
    add_batch_size_argument(p)
    add_placement_arguments(p)
    p.add_argument("--output", required=True, help="sensitivity JSON to write")
    p.add_argument("--plot", help="layer x (K2..V8) heatmap PNG (needs matplotlib)")
    p.add_argument(
        "--preset",
        default="per-token",
        help=preset_help("per-token") + "; the flags below override it",
    )
    p.add_argument("--key-axis", choices=("token", "channel"))
    p.add_argument("--key-rotation", choices=("hadamard", "none"))
    p.add_argument("--value-rotation", choices=("hadamard", "none"))
    p.add_argument("--group-size", type=int, help="group size of keys and values")
    p.add_argument("--symmetric", action="store_true", help="absmax grids for keys and values")
    add_bits_argument(p, "bit widths to measure")
    p.add_argument("--cache-dir", help="per-layer result cache (default ~/.cache/kvtuner)")
    p.add_argument("--no-cache", action="store_true", help="measure everything again")
    p.add_argument("--trust-remote-code", action="store_true")
    add_verbosity_arguments(p)
    p.set_defaults(func=run)


def add_batch_size_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-size",
        type=int,
        help="calibration windows per forward (default: as many as keep one forward's fp32 "
        "logits under 256 MiB)",
    )


def add_bits_argument(p: argparse.ArgumentParser, what: str) -> None:
    from ..search_spaces import DEFAULT_BITS

    default = ",".join(map(str, DEFAULT_BITS))
    p.add_argument("--bits", help=f"{what} (default {default})")


def parse_bits(text: str) -> tuple[int, ...]:
    """``--bits 2,3,4`` -> (2, 3, 4); one line on anything else."""
    from ..quant import QUANTIZED_BITS

    allowed = ",".join(map(str, QUANTIZED_BITS))
    try:
        bits = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise KVTunerError(f"--bits must be a comma list like 2,4,8, got {text!r}") from None
    if not bits or any(b not in QUANTIZED_BITS for b in bits):
        raise KVTunerError(f"--bits must be among {allowed}, got {text!r}")
    return bits


def specs_from_args(args: argparse.Namespace, head_dim: int | None = None):
    """(key template, value template) from --preset (at the model's ``head_dim`` once known:
    per-head presets take it as their group) and the override flags."""
    from ..search_spaces import load_preset

    preset = load_preset(args.preset)
    if head_dim is not None:
        preset = preset.for_head_dim(head_dim)
    key, value = preset.key, preset.value
    shared = {"symmetric": True} if args.symmetric else {}
    if args.group_size is not None:
        shared["group_size"] = args.group_size
    own_k = {"axis": args.key_axis, "rotation": args.key_rotation}
    own_v = {"rotation": args.value_rotation}
    try:
        key = replace(key, **shared, **{k: v for k, v in own_k.items() if v is not None})
        value = replace(value, **shared, **{k: v for k, v in own_v.items() if v is not None})
    except ValueError as exc:
        raise KVTunerError(str(exc)) from None
    return key, value


def _key_smoothing(args: argparse.Namespace, key, model, data):
    """Per-layer λ calibrated on ``data`` when the preset smooths (token-axis) keys, else None."""
    from ..search_spaces import load_preset

    alpha = load_preset(args.preset).smooth_alpha
    if alpha is None or key.axis != "token":
        return None
    from ..calibration.smoothing import calibrate_key_smoothing

    return calibrate_key_smoothing(model, data.tokens, alpha=alpha, batch_size=args.batch_size)


def _summary(sens, seconds: float, device) -> str:
    from ..placement import peak_memory_line

    low = sens.bits[0]
    lines = [
        f"fp ppl {sens.fp_ppl:.3f} on {sens.data['tokens']} tokens; {seconds:.1f} s on "
        f"{sens.data['device']} in {sens.data['dtype']}; {peak_memory_line(device)}"
    ]
    for part, name in (("k", "key"), ("v", "value")):
        ranked = sorted(range(len(sens.layers)), key=lambda i: -sens.kl(i, part, low))[:5]
        top = ", ".join(f"{i} ({sens.kl(i, part, low):.2e})" for i in ranked)
        lines.append(f"most {name}-sensitive layers at {low} bits: {top}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..calibration import calibrate, fingerprint_of, load_calibration_data, load_model
    from ..calibration.corpus import check_dataset
    from ..calibration.kl import check_batch_size
    from ..placement import reset_peak_memory
    from ..search_spaces import DEFAULT_BITS

    specs_from_args(args)  # bad flags fail before anything loads
    bits = parse_bits(args.bits) if args.bits else DEFAULT_BITS
    check_dataset(args.dataset)
    check_batch_size(args.batch_size)
    where = placement_from_args(args)
    verbosity = Verbosity.from_args(args)
    verbosity.apply()
    start = time.perf_counter()
    reset_peak_memory(where.torch_device)
    model, tokenizer = load_model(
        args.model,
        device=where.device,
        dtype=where.dtype,
        trust_remote_code=args.trust_remote_code,
    )
    data = load_calibration_data(
        tokenizer,
        dataset=args.dataset,
        num_samples=args.num_samples,
        seq_len=args.seq_len,
        seed=args.seed,
    )
    key, value = specs_from_args(args, fingerprint_of(model).head_dim)  # per-head presets
    sens = calibrate(
        model,
        data,
        model_id=args.model,
        bits=bits,
        key_spec=key,
        value_spec=value,
        key_smoothing=_key_smoothing(args, key, model, data),
        cache_dir=args.cache_dir,
        use_cache=not args.no_cache,
        progress=verbosity.progress,
        batch_size=args.batch_size,
    )
    sens.save(args.output)
    print(_summary(sens, time.perf_counter() - start, where.torch_device))
    print(f"wrote {args.output}")
    if args.plot:
        from ..calibration.plot import plot_sensitivity

        print(f"wrote {plot_sensitivity(sens, args.plot)}")
    return 0
