"""The kvtuner KV pool: ``store.py`` holds the methods SGLang calls; reads, writes, channel-axis
pages, pre-RoPE slots, cell size and the pool's refusals sit beside it."""
