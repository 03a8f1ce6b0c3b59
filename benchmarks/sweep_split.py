"""Where a sensitivity sweep's time goes: one decoder layer against the output head and the KL.

Every sweep variant runs its own layer, the layers above it, then the head and the KL over the
whole vocabulary; every search trial runs all layers and the head once. On a model with a large
vocabulary (Qwen2.5: 151,936 tokens) the head is the larger share. Times one middle decoder
layer, the lm_head matmul and the KL over full logits (``kl_sum``, how kvtuner scored before
``OutputHead``), and the head + KL as kvtuner scores now (``OutputHead.kl_sum``: fp's moments,
logsumexp over vocabulary chunks), on the default calibration batch (2 × 256 tokens of fp hidden
states), interleaved, median of ``--repeats``:

    OMP_NUM_THREADS=1 python benchmarks/sweep_split.py --model qwen2.5-0.5b

Prints a table, writes benchmarks/results/sweep_split-<model>.json.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from kvtuner.calibration import load_calibration_data, load_model
from kvtuner.calibration.head import OutputHead
from kvtuner.calibration.kl import final_hidden, kl_sum
from kvtuner.calibration.runner import decoder_layers
from kvtuner.evaluation import hardware
from kvtuner.profile import write_json_atomic

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.inference_mode()
def split(model, tokens: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median seconds of one middle layer, the lm_head matmul, the KL over its logits and the
    fused head + KL, on ``tokens``' fp hidden states at that layer."""
    layers = decoder_layers(model)
    middle = len(layers) // 2
    out = model(tokens, output_hidden_states=True, use_cache=False)
    hidden = out.hidden_states[middle]
    ref = torch.log_softmax(out.logits.float(), -1)
    positions = torch.arange(tokens.shape[1])[None].expand(tokens.shape[0], -1)
    rope = model.get_decoder().rotary_emb(hidden, positions)
    logits = model.lm_head(hidden)
    head = OutputHead.of(model)
    moments = head.moments(ref, final_hidden(model, tokens))
    runs = {"layer": [], "lm_head": [], "kl": [], "fused_head_kl": []}
    for _ in range(repeats):
        runs["layer"].append(timed(lambda: layers[middle](hidden, position_embeddings=rope)))
        runs["lm_head"].append(timed(lambda: model.lm_head(hidden)))
        runs["kl"].append(timed(lambda: kl_sum(ref, logits)))
        runs["fused_head_kl"].append(timed(lambda: head.kl_sum(moments, hidden)))
    return {name: statistics.median(values) for name, values in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    model, tok = load_model(args.model, device="cpu", dtype="float32")
    tokens = load_calibration_data(tok, num_samples=2, seq_len=256).tokens  # the search's
    seconds = split(model, tokens, args.repeats)
    per_layer = (seconds["lm_head"] + seconds["kl"]) / seconds["layer"]
    fused_per_layer = seconds["fused_head_kl"] / seconds["layer"]
    vocab = model.config.get_text_config().vocab_size
    shape = list(tokens.shape)
    print(f"{args.model}: vocab {vocab}, {len(decoder_layers(model))} layers, tokens {shape}")
    for name, value in seconds.items():
        print(f"  {name:<8} {value:8.3f} s")
    print(f"  lm_head + KL over logits = {per_layer:.1f} decoder layers")
    print(f"  fused head + KL = {fused_per_layer:.1f} decoder layers")
    cli = shlex.join(sys.argv[1:] if argv is None else argv)
    command = f"OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/sweep_split.py {cli}"
    result = {"command": command, "model": args.model, "vocab": vocab, "seconds": seconds,
              "lm_head_and_kl_in_layers": per_layer, "fused_head_kl_in_layers": fused_per_layer,
              "hardware": hardware()}  # fmt: skip
    write_json_atomic(RESULTS / f"sweep_split-{args.model}.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
