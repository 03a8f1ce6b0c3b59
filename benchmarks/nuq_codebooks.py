"""Codebook math for benchmarks/nuq_probe.py: the views of K/V that presets quantize, the
reference min/max group grid (or mean/std), weighted Lloyd-Max fits, fake quantization."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvtuner.profile import LayerSpec
from kvtuner.quant import QuantSpec
from kvtuner.quant.reference import _fp16_down, _fp16_up, hadamard
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

FP16 = QuantSpec(16)
VIEWS = {  # name: (axis, smoothed, Hadamard-rotated)
    "ksmooth": ("token", True, False),
    "khad": ("token", False, True),
    "kchan": ("channel", False, False),
    "v": ("token", False, False),
    "vhad": ("token", False, True),
}


class Probe:
    def __init__(self, model, lam: list[torch.Tensor]):
        self.model, self.lam = model, lam
        cfg = model.config
        self.layers, self.heads = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.had = hadamard(self.head_dim)

    def groups(self, x: torch.Tensor, view: str, layer: int) -> torch.Tensor:
        """x [B, H, T, D] -> groups [H, ..., 32] as the view quantizes them."""
        axis, smoothed, rotated = VIEWS[view]
        x = x.float()
        if smoothed:
            x = x / self.lam[layer].view(self.heads, 1, -1)
        if rotated:
            x = x @ self.had
        x = x.transpose(0, 1)
        h, b, t, d = x.shape
        if axis == "token":
            return x.reshape(h, b, t, d // 32, 32)
        return x.reshape(h, b, t // 32, 32, d).transpose(-1, -2)

    def ungroup(self, g: torch.Tensor, shape, view: str, layer: int) -> torch.Tensor:
        axis, smoothed, rotated = VIEWS[view]
        b, h, t, d = shape
        x = g.reshape(h, b, t, d) if axis == "token" else g.transpose(-1, -2).reshape(h, b, t, d)
        x = x.transpose(0, 1)
        if rotated:
            x = x @ self.had
        if smoothed:
            x = x * self.lam[layer].view(self.heads, 1, -1)
        return x

    def fake(self, x, view, layer, bits, levels, mode="minmax"):
        """Quantize-dequantize x [B, H, T, D]; levels [H, 2^bits] or None (uniform)."""
        g = self.groups(x, view, layer)
        u, zero, scale = normalize(g, bits, mode)
        if levels is None:
            q = (u + 0.5).floor().clamp(0, (1 << bits) - 1)
        else:
            mids = (levels[:, 1:] + levels[:, :-1]) / 2
            codes = torch.stack(
                [torch.searchsorted(mids[h], u[h].reshape(-1), right=True) for h in range(len(u))]
            ).reshape(u.shape)
            q = levels[torch.arange(len(u)).view(-1, *[1] * (u.dim() - 1)), codes]
        return self.ungroup(zero + scale * q, x.shape, view, layer)

    def fake_layer(self, x: torch.Tensor, how: tuple, layer: int) -> torch.Tensor:
        """x through ``how = (view, bits, levels, grid)``: bits an int or one per layer (16:
        unquantized), levels None or one [H, 2^bits] (or None) per layer."""
        view, bits, levels, mode = how
        bits = bits if isinstance(bits, int) else bits[layer]
        if bits == 16:
            return x
        return self.fake(x, view, layer, bits, levels and levels[layer], mode).to(x.dtype)


def normalize(g: torch.Tensor, bits: int, mode: str):
    """u, zero, scale of groups g [..., G]: the reference min/max grid, or mean/std."""
    if mode == "std":
        mean = g.mean(-1, keepdim=True)
        std = g.std(-1, keepdim=True).clamp_min(1e-8)
        return (g - mean) / std, mean, std
    lo, hi = torch.aminmax(g, dim=-1, keepdim=True)
    zero = _fp16_down(lo)
    scale = _fp16_up((hi - zero) / ((1 << bits) - 1))
    return (g - zero) / torch.where(scale > 0, scale, 1.0), zero, scale


def lloyd(u, w, bits: int, pin: bool, iters: int = 60, nbins: int = 8192) -> torch.Tensor:
    """Weighted 1-D k-means of u (histogram of ``nbins`` over u's range) -> 2^bits levels."""
    n, lo, hi = 1 << bits, float(u.min()), float(u.max())
    idx = ((u - lo) / (hi - lo) * (nbins - 1)).round().long()
    hw = torch.zeros(nbins, dtype=torch.float64).index_add_(0, idx, w.double())
    hx = torch.zeros(nbins, dtype=torch.float64).index_add_(0, idx, (w * u).double())
    centers = torch.where(hw > 0, hx / hw.clamp_min(1e-300), torch.zeros_like(hw))
    lev = torch.linspace(lo, hi, n, dtype=torch.float64)
    for _ in range(iters):
        cell = torch.searchsorted((lev[1:] + lev[:-1]) / 2, centers)
        sw = torch.zeros(n, dtype=torch.float64).index_add_(0, cell, hw)
        sx = torch.zeros(n, dtype=torch.float64).index_add_(0, cell, hx)
        new = torch.where(sw > 0, sx / sw.clamp_min(1e-300), lev)
        if pin:
            new[0], new[-1] = lo, hi
        lev = new.sort().values
    return lev.float()


def record(model, tokens: torch.Tensor) -> list[list[torch.Tensor]]:
    """Per layer [k, v, dloss/dk, dloss/dv] ([B, H, T, D]) of fp forwards over ``tokens``."""
    layers = model.config.num_hidden_layers
    out: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    for row in tokens:
        seen: list[list[torch.Tensor]] = [[] for _ in range(layers)]
        cache = make_cache(model, [LayerSpec(i, FP16, FP16) for i in range(layers)])
        for i, layer in enumerate(cache.layers):

            def update(k, v, *a, _orig=layer.update, _seen=seen[i], **kw):
                k.retain_grad(), v.retain_grad()
                _seen += [k, v]
                return _orig(k, v, *a, **kw)

            layer.update = update
        logits = model(row[None], **cache_kwargs(cache), use_cache=True).logits
        F.cross_entropy(logits[0, :-1].float(), row[1:]).backward()
        model.zero_grad(set_to_none=True)
        for i, (k, v) in enumerate(seen):
            got = [k.detach(), v.detach(), k.grad, v.grad]
            out[i] = got if not out[i] else [torch.cat(p) for p in zip(out[i], got, strict=True)]
    return out


def fit(probe: Probe, kv, view: str, bits: int, weight: str, mode: str) -> dict:
    """Codebooks per layer [H, 2^bits] and the calibration MSE (x space) uniform vs codebook."""
    part = 0 if view.startswith("k") else 1
    pin = weight.endswith("-pinned")
    levels, mse = [], [0.0, 0.0]
    for layer in range(probe.layers):
        x = kv[layer][part]
        u, _zero, scale = normalize(probe.groups(x, view, layer), bits, mode)
        w = scale.expand_as(u) ** 2
        if weight.startswith("fisher"):
            grad = kv[layer][part + 2]
            if VIEWS[view][1]:  # d/d(x/λ) = λ d/dx
                grad = grad * probe.lam[layer].view(probe.heads, 1, -1) ** 2
            w = w * probe.groups(grad, view, layer) ** 2
        lev = torch.stack([lloyd(u[h].flatten(), w[h].flatten(), bits, pin) for h in range(len(u))])
        levels.append(lev)
        if mode == "minmax":
            mse[0] += float((probe.fake(x, view, layer, bits, None) - x).pow(2).mean())
        mse[1] += float((probe.fake(x, view, layer, bits, lev, mode) - x).pow(2).mean())
    return {"levels": levels, "mse_uniform": mse[0] / probe.layers, "mse": mse[1] / probe.layers}
