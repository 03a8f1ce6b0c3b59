"""What the pool's reads are served from: dequantized views, the per-batch read cache, the decode
cache and the read state that holds them (and the scratch mode's scratch)."""
