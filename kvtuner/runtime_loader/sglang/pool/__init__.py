"""The kvtuner KV pool: ``store.py`` holds the methods SGLang calls, each delegating to one of the
parts built in ``parts.py`` (stored layers: buffers, channel-axis pages and key smoothing's λ;
pre-RoPE slots, reads, read state, writes) from four objects: the layers (``layers.py``), the
sizes (``geometry.py``), the quantizer ops (``ops.py``) and how reads are served
(``lazy_reads/read_plan.py``); cell size, layer ids and the pool's refusals sit beside them."""
