"""Device/dtype choice: validation, `auto`, CUDA asked for on a machine without it."""

from __future__ import annotations

import pytest
import torch

from kvtuner import KVTunerError
from kvtuner.placement import Placement, peak_memory_line, placement, placement_of

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CPU", "", "mps", 0])
def test_bad_device_names_are_one_line_errors(device):
    with pytest.raises(KVTunerError, match="device must be one of auto, cpu, cuda, cuda:N"):
        Placement(device, "auto")


@pytest.mark.parametrize("dtype", ["fp32", "float64", "bf16", None])
def test_bad_dtypes_are_one_line_errors(dtype):
    with pytest.raises(KVTunerError, match="dtype must be one of"):
        Placement("auto", dtype)


def test_explicit_choices_resolve_to_themselves():
    assert placement("cpu", "bfloat16") == Placement("cpu", "bfloat16")
    assert placement(torch.device("cpu"), torch.float16).torch_dtype == torch.float16
    with pytest.raises(KVTunerError, match="dtype must be one of"):
        placement("cpu", torch.float64)


@NO_CUDA
def test_auto_is_cpu_fp32_without_cuda():
    """On a CPU-only machine `auto` keeps the CPU path exactly as before: fp32 on the CPU."""
    where = placement()
    assert where == Placement("cpu", "float32") and where.resolved
    assert where.describe() == {"device": "cpu", "dtype": "float32"}
    assert Placement("auto", "bfloat16").resolve() == Placement("cpu", "bfloat16")
    assert peak_memory_line(where.torch_device) == "peak GPU memory n/a (cpu)"


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_names_the_fix(device):
    message = f"--device {device}: no CUDA device .* use --device cpu"
    with pytest.raises(KVTunerError, match=message):
        Placement(device, "auto").resolve()


def test_placement_of_a_model(tiny_llama):
    assert placement_of(tiny_llama) == Placement("cpu", "float32")
    assert placement_of(tiny_llama.to(torch.bfloat16)).dtype == "bfloat16"
