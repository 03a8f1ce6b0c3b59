"""DecodeCache: the lazy read mode's bounded cache of dequantized K/V, per request and layer.

Why: SGLang's ``torch_native`` backend reads a request's whole K/V at every decode step
(``k_cache[req_to_token[r, :len]]``), so without a cache each step dequantizes every token of the
request in every layer, although only the newest token changed. An entry holds the dequantized
K and V (model dtype) of one request's slots in one layer; a read whose slot ids extend the
entry's (same ids first, a few new ones after) dequantizes only the new slots and appends them.

Exactness: the entry's rows are ``read_kv`` of the same slots (dequantization is row by row; the
keys' Hadamard un-rotation is a matmul whose rows do not depend on the other rows, which the
tests check). A write to a slot an entry holds drops that entry (``on_write``): slots are reused
after a request ends, and a reused slot must never be served from its old contents.

Memory: bounded by ``max_tokens`` rows per layer (capacity allocated, summed over the layer's
entries): at most ``max_tokens * layers * 2 * heads * head_dim * dtype bytes``, independent of
the pool's size; entries unused for ``IDLE_STEPS`` forwards are dropped. A request that does not
fit is served uncached (today's path). Keys are ``(layer, last slot id)``: a request's newest
token is its own (requests sharing a radix-cache prefix share its first slots, not their last).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["DEFAULT_DECODE_CACHE_TOKENS", "DecodeCache"]

ReadKV = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# rows per layer: SmolLM2-135M fp16 (30 layers, 3 KV heads, head_dim 64): 4096 * 23040 B = 94 MB
DEFAULT_DECODE_CACHE_TOKENS = 4096
IDLE_STEPS = 4  # forwards an entry may go unused (a prefill between decode steps) before eviction


class _Entry:
    """Slots (int64 [cap]) and dequantized K, V ([cap, heads, head_dim]) of which ``n`` are used."""

    __slots__ = ("slots", "k", "v", "n", "used")

    def __init__(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> None:
        cap = _capacity(slots.numel())
        self.slots = _grown(slots, cap)
        self.k, self.v = _grown(k, cap), _grown(v, cap)
        self.n, self.used = slots.numel(), step

    @property
    def capacity(self) -> int:
        return self.slots.shape[0]

    def append(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        end = self.n + slots.numel()
        if end > self.capacity:  # amortised growth: copies O(n) once per doubling
            cap = _capacity(end)
            self.slots, self.k, self.v = (_grown(t[: self.n], cap) for t in self._all())
        self.slots[self.n : end], self.k[self.n : end], self.v[self.n : end] = slots, k, v
        self.n = end

    def _all(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.slots, self.k, self.v


def _capacity(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())  # next power of two: few regrowths per request


def _grown(t: torch.Tensor, cap: int) -> torch.Tensor:
    out = torch.empty((cap, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


class DecodeCache:
    """Entries keyed by ``(layer, last slot id)``; ``rows``: the pool's slot count (for the
    highest caching layer per slot, int32 [rows])."""

    def __init__(self, max_tokens: int, rows: int, device: torch.device | str) -> None:
        self.max_tokens = max_tokens
        self._entries: dict[tuple[int, int], _Entry] = {}
        # per slot: the highest layer whose entries may hold it (-1: none). A write to layer l
        # needs a look at the entries only where this is >= l: the new token of a decode step,
        # appended to the entries of the layers already read, is not (layers run in order).
        # (a Python list: decode writes and appends touch a few slots, cheaper than torch ops)
        self._top = [-1] * (rows if max_tokens > 0 else 0)
        self._allocated: dict[int, int] = {}  # layer -> rows allocated by its entries
        self._step = 0
        self._fresh: tuple | None = None  # (layer, slots, K, V) of the last write, dequantized
        self._fresh_rows: dict[int, int] | None = None  # its slot -> row, built on first use

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def cached_bytes(self) -> int:
        """Bytes held by the entries now (K and V)."""
        return sum(e.k.nbytes + e.v.nbytes for e in self._entries.values())

    def new_step(self) -> None:
        """A forward begins: drop the entries unused for ``IDLE_STEPS`` forwards."""
        self._step += 1
        idle = [key for key, e in self._entries.items() if self._step - e.used > IDLE_STEPS]
        self._drop(idle)

    def clear(self) -> None:
        self._drop(list(self._entries))

    def remember(self, layer_id: int, slots: list[int], k: torch.Tensor, v: torch.Tensor):
        """The write just made: ``read_kv(layer_id, slots)`` would return (k, v). The next reads
        of these slots (torch_native reads right after writing; with several requests, each
        reads its own new slot of the write) take their rows instead of unpacking."""
        self._fresh, self._fresh_rows = (layer_id, slots, k, v), None

    def on_write(self, layer_id: int, loc: list[int] | torch.Tensor) -> None:
        """Slots ``loc`` (int [n]) of layer ``layer_id`` were rewritten: drop entries with them."""
        self._fresh = None
        if not self._entries:
            return
        top, slots = self._top, loc if isinstance(loc, list) else loc.tolist()
        if not slots or max(top[i] for i in slots) < layer_id:
            return
        loc = torch.tensor(slots, dtype=torch.long)
        stale = [
            key
            for key, e in self._entries.items()
            if key[0] == layer_id and bool(torch.isin(loc, e.slots[: e.n]).any())
        ]
        self._drop(stale)

    def serve(self, layer_id: int, loc: torch.Tensor, read_kv: ReadKV):
        """K, V [len(loc), heads, D] of slots ``loc`` (int64 [n]), exactly
        ``read_kv(layer_id, loc)``; None when the request does not fit the bound."""
        n = loc.numel()
        if n == 0:
            return None
        entry = self._find(layer_id, loc, read_kv)
        if entry is None:
            entry = self._insert(layer_id, loc, read_kv)
            if entry is None:
                return None
        entry.used = self._step
        return entry.k[:n], entry.v[:n]

    def _find(self, layer_id: int, loc: torch.Tensor, read_kv: ReadKV) -> _Entry | None:
        """The entry holding ``loc`` (a re-read: V after K), or holding ``loc`` but its last slot
        (a decode step, extended here by ``_grow``). Entries are keyed by their last slot: it
        is the request's own newest token, never shared (a radix-cache prefix is)."""
        n = loc.numel()
        tail = loc[-2:].tolist()  # [.., last]: one call for both keys
        last = tail[-1]
        entry = self._entries.get((layer_id, last))
        if entry is not None and entry.n == n and torch.equal(entry.slots[:n], loc):
            return entry
        if n < 2:
            return None
        key = (layer_id, tail[0])
        entry = self._entries.get(key)
        if entry is None or entry.n != n - 1 or not torch.equal(entry.slots[: n - 1], loc[:-1]):
            return None
        if not self._grow(entry, layer_id, loc, last, read_kv):
            self._drop([key])
            return None
        self._entries[(layer_id, last)] = self._entries.pop(key)
        return entry

    def _grow(self, entry: _Entry, layer_id: int, loc: torch.Tensor, last: int, read_kv) -> bool:
        """Append ``loc``'s last slot (id ``last``) to the entry (which holds the others);
        False if the bound does not allow."""
        if not self._reserve(layer_id, _capacity(loc.numel()) - entry.capacity):
            return False
        new = loc[entry.n :]
        entry.append(new, *self._read(layer_id, new, [last], read_kv))
        self._mark([last], layer_id)
        return True

    def _insert(self, layer_id: int, loc: torch.Tensor, read_kv: ReadKV) -> _Entry | None:
        key = (layer_id, int(loc[-1]))
        if key in self._entries:  # stale: same last slot, other contents
            self._drop([key])
        if not self._reserve(layer_id, _capacity(loc.numel())):
            return None
        slots = loc.tolist()
        entry = _Entry(loc, *self._read(layer_id, loc, slots, read_kv), self._step)
        self._entries[key] = entry
        self._mark(slots, layer_id)
        return entry

    def _read(self, layer_id: int, loc: torch.Tensor, slots: list[int], read_kv: ReadKV):
        """``read_kv(layer_id, loc)`` (``slots``: loc as Python ints), from the last write's
        values when it wrote all of them (a range of its rows, or those rows gathered)."""
        rows = self._fresh_positions(layer_id, slots)
        if rows is None:
            return read_kv(layer_id, loc)
        k, v = self._fresh[2], self._fresh[3]
        start = rows[0]
        if start == 0 and len(rows) == k.shape[0] and rows == list(range(len(rows))):
            return k, v  # the whole write (one stream: its one new token)
        if rows == list(range(start, start + len(rows))):
            return k[start : start + len(rows)], v[start : start + len(rows)]
        idx = torch.tensor(rows, dtype=torch.long)
        return k[idx], v[idx]

    def _fresh_positions(self, layer_id: int, slots: list[int]) -> list[int] | None:
        fresh = self._fresh
        if fresh is None or fresh[0] != layer_id or fresh[2] is None:
            return None
        if self._fresh_rows is None:
            self._fresh_rows = {s: i for i, s in enumerate(fresh[1])}
        pos = self._fresh_rows
        rows = [pos.get(s) for s in slots]
        return None if None in rows else rows

    def _reserve(self, layer_id: int, rows: int) -> bool:
        """Count ``rows`` more rows against the layer's bound; False (nothing counted) if over."""
        total = self._allocated.get(layer_id, 0) + max(rows, 0)
        if total > self.max_tokens:
            return False
        self._allocated[layer_id] = total
        return True

    def _drop(self, keys: list[tuple[int, int]]) -> None:
        if not keys:
            return
        for key in keys:
            entry = self._entries.pop(key)
            self._allocated[key[0]] -= entry.capacity
        self._top = [-1] * len(self._top)  # recomputed from what is left (rare: request ends)
        for (layer_id, _), entry in self._entries.items():
            self._mark(entry.slots[: entry.n].tolist(), layer_id)

    def _mark(self, slots: list[int], layer_id: int) -> None:
        top = self._top
        for i in slots:
            if top[i] < layer_id:
                top[i] = layer_id
