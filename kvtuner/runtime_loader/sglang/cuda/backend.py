"""KVTunerAttnBackend: SGLang attention over the kvtuner pool's packed rows (``--attention-backend
kvtuner``, chosen by the plugin with ``--kvtuner-profile`` on CUDA).

Decode and extend run :mod:`kvtuner.attention`'s fused kernels straight over one layer's packed
K/V buffers ``[slots, Hkv, R]``: request b's token t lives in slot
``req_to_token[req_pool_indices[b], t]`` and ``seq_lens[b]`` tokens are stored (the step's new
tokens are written through the pool's ``set_kv_buffer`` first, so they are read quantized, like
every other token). Extend batches are ragged (``qo_indptr`` from ``extend_seq_lens``).

CUDA graphs: a forward reads lengths and table rows from tensors only. The graph state is two
int32 buffers ``[max_bs]`` refilled inside the graph (:meth:`init_forward_metadata_in_graph`:
static-shape copies from the runner's own buffers); the launch shape depends only on the batch
size and the ``req_to_token`` width. Eager steps bound the grid by the host lengths SGLang
already has (``seq_lens_cpu``), never by a device read.

Served layers: causal decoder self-attention, with a sliding window (SGLang's
``sliding_window_size`` W: a query at position p attends keys p - W .. p, as SGLang's
torch_native, FlashInfer and FA3 backends and HF's ``sliding_window = W + 1`` do), a tanh
logit cap (``logit_cap``: Gemma 2) and attention sinks (the ``sinks`` keyword: GPT-OSS). Other
capping methods, cross and encoder-only attention are refused with one line
(:func:`layer_refusal`), and so is any other per-call keyword. Channel-axis (KIVI) keys are read
from the pool's pages (full pages' blocks, filling pages' staged fp values); channel-axis values
are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from ....attention import decode_attention, extend_attention
from ....errors import KVTunerError
from .packed_metadata import PackedMetadata

__all__ = ["BACKEND_NAME", "KVTunerAttnBackend", "layer_refusal", "layer_softmax"]

BACKEND_NAME = "kvtuner"


def layer_refusal(layer: Any) -> str | None:
    """What the packed kernels cannot do for this RadixAttention layer, or None."""
    from sglang.srt.layers.radix_attention import AttentionType

    method = getattr(layer, "logit_capping_method", "tanh")
    checks = {
        f"logit capping method {method!r}": _cap(layer) is not None and method != "tanh",
        "cross attention": bool(getattr(layer, "is_cross_attention", False)),
        "encoder-only attention": getattr(layer, "attn_type", None) == AttentionType.ENCODER_ONLY,
        "different K and V head dims": layer.qk_head_dim != layer.v_head_dim,
    }
    return next((what for what, bad in checks.items() if bad), None)


def _cap(layer: Any) -> float | None:
    cap = getattr(layer, "logit_cap", 0.0) or 0.0
    return float(cap) if cap > 0 else None


def layer_softmax(layer: Any) -> dict[str, Any]:
    """The kernels' ``window`` (keys a query sees, itself included: SGLang's exclusive
    ``sliding_window_size`` + 1) and ``logit_cap`` of a RadixAttention layer (None: off)."""
    w = getattr(layer, "sliding_window_size", -1)
    return dict(window=w + 1 if w is not None and w > -1 else None, logit_cap=_cap(layer))


class KVTunerAttnBackend(AttentionBackend):
    """``KVTunerAttnBackend(model_runner)``: needs the runner's kvtuner pool (``token_to_kv_pool``)
    and ``req_to_token_pool``; checks every RadixAttention of ``model_runner.model``."""

    needs_cpu_seq_lens = False  # eager launches use seq_lens_cpu when present, else the width

    def __init__(self, model_runner: Any) -> None:
        super().__init__()
        from ..pool.store import KVTunerMHATokenToKVPool

        pool = model_runner.token_to_kv_pool
        if not isinstance(pool, KVTunerMHATokenToKVPool):
            raise KVTunerError(
                f"--attention-backend {BACKEND_NAME} reads the kvtuner pool; this server's pool "
                f"is {type(pool).__name__} (start it with --kvtuner-profile)"
            )
        self.pool = self.token_to_kv_pool = pool  # SGLang's forward context reads the latter
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.req_to_token = self.req_to_token_pool.req_to_token  # [rows, W] int32
        self.device = torch.device(model_runner.device)
        self.forward_metadata: PackedMetadata | None = None
        self._graph: tuple[torch.Tensor, torch.Tensor] | None = None
        self._checked: set[int] = set()
        model = getattr(model_runner, "model", None)
        for layer in _radix_layers(model):
            self._check_layer(layer)

    # -- metadata ----------------------------------------------------------------------------
    def _width(self, seq_lens_cpu: torch.Tensor | None) -> int:
        """Grid bound of stored tokens: the host lengths' max when SGLang has them (eager),
        else the ``req_to_token`` width (static)."""
        full = self.req_to_token.shape[1]
        if seq_lens_cpu is None or seq_lens_cpu.numel() == 0:
            return full
        return max(1, min(full, int(seq_lens_cpu.max())))

    def init_forward_metadata(self, forward_batch: Any) -> None:
        """Eager steps: decode, extend (ragged) and mixed batches."""
        fb, heads = forward_batch, self.pool.head_num
        table = self.req_to_token[:, : self._width(fb.seq_lens_cpu)]
        if fb.forward_mode.is_decode_or_idle():
            md = PackedMetadata.decode(fb.seq_lens, fb.req_pool_indices, table)
        else:
            host = fb.extend_seq_lens_cpu
            max_q = max(host) if host is not None and len(host) else fb.input_ids.numel()
            md = PackedMetadata.extend(
                fb.seq_lens, fb.req_pool_indices, table, heads, fb.extend_seq_lens, max_q
            )
        self.forward_metadata = md

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static int32 lengths and table rows ``[max_bs]`` the captured graphs read."""
        zeros = dict(dtype=torch.int32, device=self.device)
        self._graph = (torch.ones(max_bs, **zeros), torch.zeros(max_bs, **zeros))

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False):
        """Views of the static buffers for this batch size (no device work)."""
        if self._graph is None or not forward_batch.forward_mode.is_decode_or_idle():
            raise KVTunerError(
                f"{BACKEND_NAME} attention captures decode graphs only (got "
                f"{forward_batch.forward_mode.name}); add --cuda-graph-backend-prefill disabled"
            )
        bs = forward_batch.batch_size
        lengths, rows = (buf[:bs] for buf in self._graph)
        self.forward_metadata = PackedMetadata.decode(lengths, rows, self.req_to_token)

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Recorded in the graph: the runner's seq_lens / req_pool_indices into int32 buffers."""
        md = self.forward_metadata
        bs = md.lengths.shape[0]
        md.lengths.copy_(forward_batch.seq_lens[:bs])
        md.table_rows.copy_(forward_batch.req_pool_indices[:bs])

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # padded requests attend one (padding) slot

    # -- forward -----------------------------------------------------------------------------
    def _check_layer(self, layer: Any) -> None:
        if layer.layer_id in self._checked:
            return
        v = self.pool.layer_spec(layer.layer_id).v
        channel_v = v.axis == "channel" and v.is_quantized
        refused = "channel-axis (KIVI) values" if channel_v else layer_refusal(layer)
        if refused:
            raise KVTunerError(
                f"--attention-backend {BACKEND_NAME} does not support {refused} "
                f"(layer {layer.layer_id}); serve this model on CPU (torch_native) or without "
                "--kvtuner-profile"
            )
        self._checked.add(layer.layer_id)

    def _attend(self, attend, q, k, v, layer, forward_batch, save_kv_cache, extras, hand=False):
        """``hand`` (extend): the new tokens' K and V are attended as computed, exact; only the
        prefix is read from the packed pool (where the extend kernel runs the layer)."""
        self._check_layer(layer)
        if save_kv_cache and k is not None and v is not None:
            self.pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        k_rows, v_rows = self.pool.packed_rows(layer.layer_id)
        spec = self.pool.layer_spec(layer.layer_id)
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        new = {}
        if hand and k is not None and v is not None:  # [N, Hkv, D], a row each of q3's
            new = dict(k_new=k.reshape(len(q3), layer.tp_k_head_num, -1),
                       v_new=v.reshape(len(q3), layer.tp_v_head_num, -1))  # fmt: skip
        lam = self.pool.key_smoothing(layer.layer_id)  # smoothed keys: rows hold k / λ
        out = attend(q3, k_rows, v_rows, spec.k, spec.v, sm_scale=layer.scaling, k_smooth=lam,
                     planes=self.pool.packed_planes(layer.layer_id),
                     **layer_softmax(layer), **_extras(extras), **new,
                     **self._stage(layer.layer_id),
                     **self.forward_metadata.kernel_args())  # fmt: skip
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _stage(self, layer_id: int) -> dict[str, torch.Tensor]:
        """Channel-axis keys: the pages still filling (fp) and each page's stage row; pre-RoPE
        keys also the model's frequencies (a request's key t sits at position t)."""
        pages = self.pool.channel_keys(layer_id)
        if pages is None:
            return {}
        stage = dict(k_stage=pages.stage, k_stage_rows=pages.stage_rows)
        freq = self.pool.rope_freq(layer_id)
        return stage if freq is None else {**stage, "rope_freq": freq}

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        attend = decode_attention
        return self._attend(attend, q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        attend = extend_attention
        return self._attend(attend, q, k, v, layer, forward_batch, save_kv_cache, kwargs, True)

    def support_triton(self) -> bool:
        return True


def _extras(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Per-call keywords: ``sinks`` (GPT-OSS, [Hq] per rank) is passed on; any other one would
    change attention unseen, so it is refused, not ignored."""
    extra = sorted(k for k, x in kwargs.items() if x is not None and k != "sinks")
    if extra:
        raise KVTunerError(f"--attention-backend {BACKEND_NAME} does not support {extra}")
    sinks = kwargs.get("sinks")
    return {} if sinks is None else {"sinks": sinks}


def _radix_layers(model: Any) -> list:
    if model is None or not hasattr(model, "modules"):
        return []
    from sglang.srt.layers.radix_attention import RadixAttention

    return [m for m in model.modules() if isinstance(m, RadixAttention)]


def create_backend(model_runner: Any) -> KVTunerAttnBackend:
    """The factory SGLang's attention registry calls for ``--attention-backend kvtuner``."""
    return KVTunerAttnBackend(model_runner)
