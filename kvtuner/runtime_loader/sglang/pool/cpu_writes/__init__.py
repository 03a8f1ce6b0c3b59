"""The CPU pool's write codecs (numpy token-axis quantizer, K/V pair reference calls)."""
