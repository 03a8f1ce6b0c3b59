"""The kvtuner KV pool: ``store.py`` holds the methods SGLang calls, each delegating to one of the
parts built in ``parts.py`` (buffers and channel-axis pages, key smoothing, pre-RoPE slots,
reads, read state, writes); cell size, layer ids and the pool's refusals sit beside them."""
