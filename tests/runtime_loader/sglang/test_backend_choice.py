"""How the kvtuner backend comes in: SGLang's registry and CLI choices, the choice on CUDA, the
refusals, and fused K/V writes routed back through the pool."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch
from test_backend import runner, sglang_parts  # noqa: F401  (fixture)

from kvtuner.errors import KVTunerError
from kvtuner.runtime_loader.sglang.hooks.backend_choice import (
    choose_packed_backend,
    register_backend,
    skip_fused_kv_writes,
)

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")  # the sglang tier: collected only where sglang is installed


def server_args(argv):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "m", *argv]))


def test_registered_in_sglangs_registry_and_cli_choices():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    register_backend()
    register_backend()  # idempotent
    assert "kvtuner" in ATTENTION_BACKENDS
    assert server_args(["--attention-backend", "kvtuner"]).attention_backend == "kvtuner"


def test_chosen_on_cuda_with_prefill_graphs_off_and_cpu_left_alone():
    register_backend()
    args = server_args(["--device", "cuda"])
    choose_packed_backend(args)
    assert (args.attention_backend, args.cuda_graph_backend_prefill) == ("kvtuner", "disabled")
    cpu = server_args(["--device", "cpu", "--attention-backend", "torch_native"])
    choose_packed_backend(cpu)
    assert cpu.attention_backend == "torch_native" and cpu.cuda_graph_backend_prefill is None


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--attention-backend", "triton"], "not --attention-backend triton"),
        (["--decode-attention-backend", "fa3"], "not --decode-attention-backend fa3"),
        (["--cuda-graph-backend-prefill", "full"], "decode CUDA graphs only"),
    ],
)
def test_other_backends_on_cuda_are_refused_with_one_line(argv, match):
    register_backend()
    with pytest.raises(KVTunerError, match=match) as info:
        choose_packed_backend(server_args(["--device", "cuda", *argv]))
    assert "\n" not in str(info.value)


def test_graph_refusal_follows_the_read_mode():
    from kvtuner.runtime_loader.sglang.hooks.refusals import _graph_refusal

    def graphs(decode, prefill):
        return SimpleNamespace(
            decode=SimpleNamespace(backend=decode), prefill=SimpleNamespace(backend=prefill)
        )

    assert _graph_refusal(graphs("full", "disabled"), "packed") == ""
    assert "breakable" in _graph_refusal(graphs("breakable", "disabled"), "packed")
    assert "prefill" in _graph_refusal(graphs("full", "full"), "packed")
    assert _graph_refusal(graphs("disabled", "disabled"), "lazy") == ""
    assert "--cuda-graph-backend-decode disabled" in _graph_refusal(
        graphs("full", "disabled"), "lazy"
    )


def test_fused_kv_writes_are_off_over_the_kvtuner_pool_only(sglang_parts):  # noqa: F811
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from kvtuner.runtime_loader.sglang.cuda.backend import KVTunerAttnBackend

    packed, stock, req_to_token_pool = sglang_parts
    fused = lambda fb: True  # noqa: E731  (SGLang's answer on CUDA with a bf16 cache)
    ours = KVTunerAttnBackend(runner(packed, req_to_token_pool))
    theirs = TorchNativeAttnBackend(runner(stock, req_to_token_pool))
    with forward_context(ForwardContext(attn_backend=ours)):
        assert skip_fused_kv_writes(fused, None) is False
    with forward_context(ForwardContext(attn_backend=theirs)):
        assert skip_fused_kv_writes(fused, None) is True
    assert ours.get_fused_kv_write_buffers(None, None) is None  # MiMo-V2's fused writer
    assert packed.get_key_buffer(0).dtype != torch.bfloat16  # Qwen3's aiter write: refused
