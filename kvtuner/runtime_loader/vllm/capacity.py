"""KV bytes and token capacity as vLLM 0.32 allocates them for a :class:`VllmPlan`.

Read from vLLM's source (``platforms/interface.py: _align_heterogeneous_kv_block_size``,
``v1/core/kv_cache_utils.py``, ``v1/kv_cache_interface.py``) for full-attention models:

- a layer's page holds ``block_size`` tokens of K and V for every KV head: per token and head,
  ``2 * head_dim`` elements at 1 byte (fp8 / int8), at half a byte (int4, two per byte) or at
  the model dtype's size (a skipped layer), plus two fp32 scales for the per-token-head formats
  (``VllmKVFormat.token_head_bytes``; vLLM's ``TritonAttentionBackend.customize_spec``);
- with skip layers, vLLM first raises the block size to
  ``align * ceil(skip_page * smallest_kernel_block / (align * primary_page))`` (align =
  max(smallest kernel block, block size)) so that the primary page covers a skipped page;
- all layers are full attention, so one KV cache group holds them and a block costs the sum of
  every layer's page: ``num_blocks = memory // (block_size * sum(bytes per token))``, and the
  engine holds ``num_blocks * block_size`` tokens.

Sliding-window layers (their skip pages are padded to a shared page) are not modelled: one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import KVTunerError
from ...profile import ModelFingerprint
from ...profile.vllm_plan import VllmPlan
from ...quant.vllm_format import model_dtype_bytes

CPU_BLOCK_SIZE = 128  # vLLM's CPU platform default block size
CPU_SMALLEST_KERNEL_BLOCK = 32  # CPU attention backend: MultipleOf(32)


@dataclass(frozen=True)
class VllmLayout:
    """The model as vLLM sizes its cache: fingerprint, the dtype it serves in, and the
    attention backend's block sizes (defaults: vLLM's CPU backend)."""

    fingerprint: ModelFingerprint
    model_dtype: str = "bfloat16"
    block_size: int = CPU_BLOCK_SIZE
    smallest_kernel_block: int = CPU_SMALLEST_KERNEL_BLOCK

    def __post_init__(self) -> None:
        try:
            model_dtype_bytes(self.model_dtype)
        except ValueError as exc:
            raise KVTunerError(str(exc)) from None
        if self.fingerprint.layer_types is not None:  # None: every layer full attention
            raise KVTunerError(
                "vLLM capacity is modelled for full-attention models only "
                f"({self.fingerprint.architecture} has sliding-window layers)"
            )
        for name in ("block_size", "smallest_kernel_block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KVTunerError(f"{name} must be a positive int, got {value!r}")

    def layer_bytes_per_token(self, plan: VllmPlan, layer: int) -> int:
        """K plus V bytes vLLM stores for one token of ``layer`` (all KV heads)."""
        fp, fmt = self.fingerprint, plan.layer_format(layer)
        if fmt is None:
            per_head = 2 * fp.head_dim * model_dtype_bytes(self.model_dtype)
        else:
            per_head = fmt.token_head_bytes(fp.head_dim)
        return fp.num_kv_heads * per_head

    def bytes_per_token(self, plan: VllmPlan) -> int:
        self._check(plan)
        return sum(self.layer_bytes_per_token(plan, i) for i in range(plan.num_layers))

    def aligned_block_size(self, plan: VllmPlan) -> int:
        """The block size vLLM settles on (raised when skipped pages outgrow the primary's)."""
        if not plan.skip_layers:
            return self.block_size
        primary = self.layer_bytes_per_token(VllmPlan(plan.kv_cache_dtype, plan.num_layers), 0)
        skipped = self.layer_bytes_per_token(plan, plan.skip_layers[0])
        if skipped <= primary:
            return self.block_size
        align = max(self.smallest_kernel_block, self.block_size)
        needed = align * math.ceil(skipped * self.smallest_kernel_block / (align * primary))
        return max(self.block_size, needed)

    def capacity_tokens(self, plan: VllmPlan, memory_bytes: int) -> int:
        """Tokens vLLM's KV cache holds in ``memory_bytes`` (e.g. VLLM_CPU_KVCACHE_SPACE)."""
        block = self.aligned_block_size(plan)
        return memory_bytes // (block * self.bytes_per_token(plan)) * block

    def fp_bytes_per_token(self) -> int:
        """Every layer at the model's dtype (vLLM's ``auto``)."""
        fp = self.fingerprint
        return (
            fp.num_layers * fp.num_kv_heads * 2 * fp.head_dim * model_dtype_bytes(self.model_dtype)
        )

    def _check(self, plan: VllmPlan) -> None:
        if plan.num_layers != self.fingerprint.num_layers:
            raise KVTunerError(
                f"plan has {plan.num_layers} layers, the model {self.fingerprint.num_layers}"
            )
