"""The lazy read mode's parts: dequantized views, the per-batch read cache and the decode cache."""
