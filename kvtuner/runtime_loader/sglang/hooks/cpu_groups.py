"""Tensor/pipeline parallel groups on SGLang's CPU engine: gloo only, no PyNccl.

sglang 0.5.23 ``init_model_parallel_group`` turns PyNccl on for every group whose platform is
not NPU/XPU/out-of-tree (``use_pynccl=None`` -> True). With a CUDA build of torch the NCCL
library loads, and ``PyNcclCommunicator.__init__`` then enters ``torch.cuda.device(cpu)``:
``ValueError: Expected a cuda device, but got: cpu``. A CPU group can never use NCCL, and its
collectives already take the ``input_.is_cpu`` paths over the gloo groups, so the hook asks for
no PyNccl when the group's device is the CPU; GPU groups are left exactly as SGLang builds them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cpu_group_without_pynccl"]


def _group_device_type(local_rank: int) -> str:
    from sglang.srt.distributed import parallel_state

    return parallel_state._group_coordinator_device(local_rank).type


def cpu_group_without_pynccl(
    original: Any, group_ranks: Any, local_rank: int, backend: str, *args: Any, **kwargs: Any
) -> Any:
    """AROUND hook of ``parallel_state.init_model_parallel_group``."""
    if _group_device_type(local_rank) == "cpu":
        if args:  # use_pynccl is the first optional positional argument
            args = (False, *args[1:])
        else:
            kwargs["use_pynccl"] = False
    return original(group_ranks, local_rank, backend, *args, **kwargs)
